"""The inference bundle (gr2jax/decoding/bundle.py): an export re-ranks from its own directory,
with no workdir, raw data or pipeline run, exactly as from its data build.

The fast tests write a bundle from a small synthetic data build (tests/data/test_pipeline.py's);
the integration test serves a copy of the smoke run's final export (tests/smoke_workdir.py)."""

import json
import os
import shutil

import httpx
import numpy as np
import pytest

import gr2jax
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle
from gr2jax.decoding import reranker as reranker_lib
from tests.data.test_pipeline import _config, write_dataset_with_sids
from tests.smoke_workdir import smoke_workdir


def _no_pipeline(*args, **kwargs):
  raise AssertionError("the data pipeline ran: the export did not load alone")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """(data config, the build's summary, a directory holding only its bundle)."""
  data_dir = write_dataset_with_sids(tmp_path_factory.mktemp("beauty"))
  config = _config(data_dir, data_dir / "sids.npy")
  summary = pipeline.run(config, str(tmp_path_factory.mktemp("work")))
  written = tmp_path_factory.mktemp("export")
  bundle.write(str(written), summary, config)
  return config, summary, str(written)


def test_a_bundle_read_elsewhere_renders_as_the_data_build(built, tmp_path, monkeypatch):
  config, summary, written = built
  alone = str(tmp_path / "alone")
  shutil.copytree(written, alone)
  monkeypatch.setattr(pipeline, "run", _no_pipeline)
  monkeypatch.chdir(tmp_path)
  inference = bundle.read(alone, config)
  build = requests_lib.load_rendering(summary, config)
  got = inference.rendering
  assert (got.prompt, got.evidence_decay, got.evidence_window, got.max_history,
          got.num_candidates) == (build.prompt, build.evidence_decay, build.evidence_window,
                                  build.max_history, build.num_candidates)
  np.testing.assert_array_equal(got.thresholds, build.thresholds)  # exact, not the summary's
  np.testing.assert_array_equal(got.catalogue.sids, build.catalogue.sids)
  assert got.catalogue.asin_index == build.catalogue.asin_index
  assert got.catalogue.catalog.titles == build.catalogue.catalog.titles
  assert (inference.prompt_len, inference.response_len) == lengths_lib.static_lengths(summary)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  assert inference.tokenizer.get_vocab() == tok.get_vocab()
  request = {"id": "r", "history": [1, 2, 3], "candidates": list(range(10, 20))}
  [parsed] = requests_lib.read_requests([request], got.catalogue, got.num_candidates,
                                        got.needs_sids)
  assert requests_lib.render([parsed], got) == requests_lib.render([parsed], build)


def test_an_export_without_a_bundle_reads_none_and_another_format_is_refused(built, tmp_path):
  config, _, written = built
  assert bundle.read(str(tmp_path), config) is None
  other = str(tmp_path / "other")
  shutil.copytree(written, other)
  path = os.path.join(other, bundle.DIRECTORY, bundle.BUNDLE_FILE)
  with open(path) as f:
    record = json.load(f)
  with open(path, "w") as f:
    json.dump(dict(record, format=bundle.FORMAT + 1), f)
  with pytest.raises(ValueError, match=r"bundle.json: inference bundle format 2.*re-export"):
    bundle.read(other, config)


REQUESTS = [{"id": f"u{i}", "history": [5 + i, 6 + i, 7 + i],
             "candidates": list(range(10 + 10 * i, 20 + 10 * i))} for i in range(3)]


def _rows(rows):
  return [(r["id"], r["ranking"], r["response"]) for r in rows]


@pytest.mark.integration  # the smoke run, then the final export decoded three ways
def test_a_copied_export_serves_alone_and_ranks_as_its_workdir(tmp_path_factory, monkeypatch):
  """The smoke run's final export, copied outside any workdir with no data present, answers
  through gr2jax.rerank and the server exactly as the same export read through its workdir's
  data build (the path of an export without a bundle, which keeps loading)."""
  workdir = smoke_workdir(tmp_path_factory)
  export = os.path.join(workdir, "rl", "export")
  assert os.path.isfile(os.path.join(export, bundle.DIRECTORY, bundle.BUNDLE_FILE))
  old = os.path.join(workdir, "rl_without_bundle", "export")  # W/<stage>/export: W's build
  shutil.copytree(export, old, ignore=shutil.ignore_patterns(bundle.DIRECTORY))
  expected = gr2jax.rerank(REQUESTS, old, batch_size=1)
  assert [r["id"] for r in expected] == [r["id"] for r in REQUESTS]

  alone = tmp_path_factory.mktemp("shipped") / "export"
  shutil.copytree(export, alone)
  monkeypatch.setattr(pipeline, "run", _no_pipeline)
  monkeypatch.chdir(alone.parent)
  assert _rows(gr2jax.rerank(REQUESTS, str(alone), batch_size=1)) == _rows(expected)
  from tests.apps.serve.toy_server import ThreadServer, settings

  engine = engine_lib.Engine.load(str(alone))
  assert isinstance(engine.reranker, reranker_lib.Reranker)
  server = ThreadServer(engine, settings(batch_buckets=(1,)))
  try:
    answers = [httpx.post(f"{server.url}/v1/rerank", json=r, timeout=600).json()
               for r in REQUESTS]
  finally:
    server.close()
  assert [(a["id"], a["ranking"]) for a in answers] == [(r["id"], r["ranking"])
                                                         for r in expected]
  assert [a["reasoning"] for a in answers] == [r["reasoning"] for r in expected]
