"""The inference bundle (gr2jax/decoding/bundle.py): an export re-ranks from its own directory,
with no workdir, raw data or pipeline run, exactly as from its data build; a bundle that is
incomplete, damaged or not the export's is refused in one line naming the file and the field.

The fast tests read the tiny export of tests/decoding/tiny_export.py (a small synthetic data
build, the bundle written as train/loop.py writes it); the integration test serves a copy of the
smoke run's final export (tests/smoke_workdir.py)."""

import json
import os
import re
import shutil

import httpx
import numpy as np
import pytest

import gr2jax
from gr2jax import exports, files
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.data import build_rendering, pipeline
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle
from gr2jax.decoding import reranker as reranker_lib
from tests.smoke_workdir import smoke_workdir

ADD_BUNDLE = (r"python weights_conversion/add_bundle\.py --export=\S+ --workdir=<the workdir of "
              r"its data build>$")


def _no_pipeline(*args, **kwargs):
  raise AssertionError("the data pipeline ran: the export did not load alone")


def _copy(export: str, tmp_path) -> str:
  out = str(tmp_path / "export")
  shutil.copytree(export, out)
  return out


def _bundle_file(export: str) -> str:
  return os.path.join(export, bundle.DIRECTORY, bundle.BUNDLE_FILE)


def _record_digest(export: str) -> None:
  """Records the export's bundle.json as it now is (exports.update_metadata, as bundle.write
  does): a bundle written with these values, whose own checks the test reaches."""
  exports.update_metadata(export, {bundle.RECORD_DIGEST: files.file_sha256(_bundle_file(export))})


def _edit_record(export: str, recorded: bool = True, **fields) -> None:
  """Sets (or with None, removes) fields of the export's bundle.json; `recorded`: its digest
  recorded again (`_record_digest`), else left as written (an edit of the file)."""
  with open(_bundle_file(export)) as f:
    record = json.load(f)
  record.update(fields)
  with open(_bundle_file(export), "w") as f:
    json.dump({k: v for k, v in record.items() if v is not None}, f)
  if recorded:
    _record_digest(export)


def _refused(export: str, config, where: str, message: str) -> None:
  """bundle.read refuses `export` in one line: `where` (a path), then `message` (a regex)."""
  with pytest.raises(ValueError, match=rf"^{re.escape(where)}: {message}") as info:
    bundle.read(export, config)
  assert "\n" not in str(info.value)


def test_a_bundle_read_elsewhere_renders_as_the_data_build(bundled, tmp_path, monkeypatch):
  alone = _copy(bundled.export, tmp_path)
  monkeypatch.setattr(pipeline, "run", _no_pipeline)
  monkeypatch.chdir(tmp_path)
  inference = bundle.read(alone, bundled.config)
  build = build_rendering.load_rendering(bundled.summary, bundled.config)
  got = inference.rendering
  assert (got.prompt, got.evidence_decay, got.evidence_window, got.max_history,
          got.num_candidates) == (build.prompt, build.evidence_decay, build.evidence_window,
                                  build.max_history, build.num_candidates)
  np.testing.assert_array_equal(got.thresholds, build.thresholds)  # exact, not the summary's
  np.testing.assert_array_equal(got.catalogue.sids, build.catalogue.sids)
  assert got.catalogue.asin_index == build.catalogue.asin_index
  assert got.catalogue.catalog.titles == build.catalogue.catalog.titles
  assert (inference.prompt_len, inference.response_len) == lengths_lib.static_lengths(
    bundled.summary)
  tok = tokenizer_lib.load_tokenizer(bundled.summary["paths"]["tokenizer"])
  assert inference.tokenizer.get_vocab() == tok.get_vocab()
  request = {"id": "r", "history": [1, 2, 3], "candidates": list(range(10, 20))}
  [parsed] = requests_lib.read_requests([request], got.catalogue, got.num_candidates,
                                        got.needs_sids)
  assert requests_lib.render([parsed], got) == requests_lib.render([parsed], build)


def test_an_export_that_never_had_a_bundle_reads_none(bundled, tmp_path):
  assert bundle.read(str(tmp_path), bundled.config) is None


def test_a_bundle_of_another_format_is_refused_naming_the_command(bundled, tmp_path):
  export = _copy(bundled.export, tmp_path)
  for old in (1, bundle.FORMAT + 1, None):
    _edit_record(export, format=old)
    _refused(export, bundled.config, _bundle_file(export),
             rf"field 'format' is {old!r}, this version reads inference bundle format 2 "
             rf"\(format 1 recorded no file digests\); write it again: {ADD_BUNDLE}")


def test_an_inference_directory_without_its_bundle_file_is_refused(bundled, tmp_path):
  export = _copy(bundled.export, tmp_path)
  os.remove(_bundle_file(export))
  _refused(export, bundled.config, _bundle_file(export),
           rf"missing: the export has an inference/ directory without its bundle file \(an "
           rf"incomplete bundle\); write it again: {ADD_BUNDLE}")


@pytest.mark.parametrize("missing", [["inference/sids.npy"], ["inference/items.jsonl.gz"],
                                     ["tokenizer.json", "tokenizer_config.json"]])
def test_a_missing_file_of_the_bundle_is_named(bundled, tmp_path, missing):
  """A partial bundle, or an export without its tokenizer files: the export and every missing
  file in one line (not transformers' sentencepiece advice)."""
  export = _copy(bundled.export, tmp_path)
  for name in missing:
    os.remove(os.path.join(export, name))
  _refused(export, bundled.config, export,
           rf"missing {', '.join(missing)} \(listed in inference/bundle\.json field 'files'\): "
           rf"an incomplete export; write its bundle again: {ADD_BUNDLE}")


def _permuted_sids(path: str) -> None:
  """Another build's SIDs: the same shape and codes, given to other items."""
  sids = np.load(path)
  np.save(path, sids[np.random.default_rng(0).permutation(len(sids))])


def _flip_bytes(path: str) -> None:
  with open(path, "r+b") as f:
    f.seek(-8, os.SEEK_END)
    data = f.read()
    f.seek(-8, os.SEEK_END)
    f.write(bytes(b ^ 0xFF for b in data))


@pytest.mark.parametrize("damage, name", [
  (_permuted_sids, "inference/sids.npy"), (_flip_bytes, "inference/sids.npy"),
  (_flip_bytes, "inference/items.jsonl.gz"), (_flip_bytes, "tokenizer.json")])
def test_a_changed_or_damaged_file_is_refused_naming_it(bundled, tmp_path, damage, name):
  export = _copy(bundled.export, tmp_path)
  damage(os.path.join(export, name))
  _refused(export, bundled.config, os.path.join(export, name),
           rf"sha256 \w{{16}}\.\.\. is not the \w{{16}}\.\.\. that inference/bundle\.json "
           rf"records \(field 'files'\): the file was changed or damaged; write the bundle "
           rf"again: {ADD_BUNDLE}")


def _cut_in_half(export: str) -> None:
  with open(_bundle_file(export)) as f:
    text = f.read()
  with open(_bundle_file(export), "w") as f:
    f.write(text[:len(text) // 2])
  _record_digest(export)


BAD_RECORDS = [  # (what to do to bundle.json, the field named)
  (_cut_in_half, r"not a JSON bundle \(.*line \d+"),
  (dict(prompt_len="64"), r"field 'prompt_len' must be a positive multiple of 16, got '64'"),
  (dict(response_len=8), r"field 'response_len' must be a positive multiple of 16, got 8"),
  (dict(response_len=-5), r"field 'response_len' must be a positive multiple of 16, got -5"),
  (dict(thresholds="x"), r"field 'thresholds' must be a \[3, 3\] list of lists of finite "
                         r"numbers, got 'x'"),
  (dict(thresholds=[[0.1, 0.2]] * 3), r"field 'thresholds' must be a \[3, 3\]"),
  (dict(thresholds=None), r"field 'thresholds' is missing"),
  (dict(items_file=None), r"field 'items_file' is missing"),
  (dict(items_file="../items.jsonl.gz"), r"field 'items_file' must be the name of a file in "
                                         r"inference/"),
  (dict(evidence_decay=True), r"field 'evidence_decay' must be a number in \(0, 1\], got True"),
  (dict(num_candidates=5), r"field 'num_candidates' is 5, the export's data build has 10 "
                           r"\(gr2jax_metadata\.json data_config\.num_candidates\); write the "
                           rf"bundle again: {ADD_BUNDLE}"),
  (dict(response_len=16), r"field 'response_len' is 16, the export was trained with 48 "
                          r"\(gr2jax_metadata\.json run\.lengths \[P, R\]\)"),
  (dict(files={"tokenizer.json": "0" * 64}), r"field 'files' has no digest of "
                                             r"inference/items\.jsonl\.gz, inference/sids\.npy, "
                                             r"tokenizer_config\.json"),
  (dict(files={"/etc/passwd": "0" * 64}), r"field 'files' must be \{path in the export"),
]


@pytest.mark.parametrize("change, message", BAD_RECORDS)
def test_a_bad_bundle_record_is_refused_naming_the_field(bundled, tmp_path, change, message):
  """What a user found: a cut JSON named no file, a string width was a TypeError, missing fields
  KeyErrors, a smaller response_len silently truncated every answer."""
  export = _copy(bundled.export, tmp_path)
  if callable(change):
    change(export)
  else:
    _edit_record(export, **change)
  _refused(export, bundled.config, _bundle_file(export), message)


@pytest.mark.parametrize("change", [
  dict(thresholds=[[0.0, 0.0, 0.0]] * 3), dict(evidence_window=1), dict(files={})])
def test_an_edited_bundle_record_is_refused_naming_the_file(bundled, tmp_path, change):
  """Every file the bundle lists is digested, and bundle.json itself by the export's metadata:
  an edited threshold (which changes every rendered prompt) no longer loads silently."""
  export = _copy(bundled.export, tmp_path)
  _edit_record(export, recorded=False, **change)
  _refused(export, bundled.config, _bundle_file(export),
           r"sha256 \w{16}\.\.\. is not the \w{16}\.\.\. the export records "
           r"\(gr2jax_metadata\.json field 'bundle_sha256'\): the bundle was edited or damaged "
           rf"\(its values render every prompt\); write it again: {ADD_BUNDLE}")


def test_an_export_written_before_the_record_digest_loads_as_before(bundled, tmp_path):
  """An export whose metadata records no bundle_sha256 (written before the field) reads as it
  did; weights_conversion/add_bundle.py records it (tests/weights_conversion/)."""
  export = _copy(bundled.export, tmp_path)
  metadata = exports.load_metadata(export)
  assert metadata[bundle.RECORD_DIGEST] == files.file_sha256(_bundle_file(export))
  with open(os.path.join(export, exports.METADATA_FILE), "w") as f:
    json.dump({k: v for k, v in metadata.items() if k != bundle.RECORD_DIGEST}, f)
  assert bundle.read(export, bundled.config).prompt_len == bundle.read(
    bundled.export, bundled.config).prompt_len


def test_a_data_setting_of_this_run_is_named_as_this_runs_not_the_exports(bundled):
  """The recipe's data setting changed on the command line (or a recipe of other settings) is
  named as this run's, beside the export's value: the bundle, which is fine, is not blamed."""
  config = bundled.config.copy_and_resolve_references()
  config.num_candidates = 5
  _refused(bundled.export, config, _bundle_file(bundled.export),
           r"this run's data\.num_candidates is 5 \(the recipe or a --config\.data\."
           r"num_candidates override\), the export's is 10 \(its bundle and "
           r"gr2jax_metadata\.json data_config\): the export is fine; drop the override or pass "
           r"--config\.data\.num_candidates=10$")


def test_write_replaces_a_bundle_whole(bundled, tmp_path):
  """bundle.write into a finished export (add_bundle.py): the new inference/ replaces the one
  there at once, nothing else is left beside it, and it reads as before."""
  export = _copy(bundled.export, tmp_path)
  _edit_record(export, format=1)
  before = sorted(os.listdir(export))
  bundle.write(export, bundled.summary,
               build_rendering.load_rendering(bundled.summary, bundled.config))
  assert sorted(os.listdir(export)) == before
  with open(_bundle_file(export)) as f, open(_bundle_file(bundled.export)) as g:
    assert json.load(f) == json.load(g)
  assert files.file_sha256(os.path.join(export, "inference", "sids.npy")) == files.file_sha256(
    bundled.summary["paths"]["sids"])
  assert bundle.read(export, bundled.config).data_build == bundle.read(
    bundled.export, bundled.config).data_build


REQUESTS = [{"id": f"u{i}", "history": [5 + i, 6 + i, 7 + i],
             "candidates": list(range(10 + 10 * i, 20 + 10 * i))} for i in range(3)]


def _rows(rows):
  return [(r["id"], r["ranking"], r["response"]) for r in rows]


@pytest.mark.integration  # the smoke run, then the final export decoded three ways
def test_a_copied_export_serves_alone_and_ranks_as_its_workdir(tmp_path_factory, monkeypatch):
  """The smoke run's final export, copied outside any workdir with no data present, answers
  through gr2jax.rerank and the server exactly as the same export read through its workdir's
  data build (the path of an export that never had a bundle, given its workdir)."""
  workdir = smoke_workdir(tmp_path_factory)
  export = os.path.join(workdir, "rl", "export")
  assert os.path.isfile(_bundle_file(export))
  old = os.path.join(workdir, "rl_without_bundle", "export")
  shutil.copytree(export, old, ignore=shutil.ignore_patterns(bundle.DIRECTORY))
  expected = gr2jax.rerank(REQUESTS, old, workdir=workdir, batch_size=1)
  assert [r["id"] for r in expected] == [r["id"] for r in REQUESTS]

  alone = tmp_path_factory.mktemp("shipped") / "export"
  shutil.copytree(export, alone)
  monkeypatch.setattr(pipeline, "run", _no_pipeline)
  monkeypatch.chdir(alone.parent)
  assert _rows(gr2jax.rerank(REQUESTS, str(alone), batch_size=1)) == _rows(expected)
  from tests.apps.serve.toy_server import ThreadServer, settings

  engine = engine_lib.Engine.load(settings(ckpt=str(alone)), workdir=str(alone.parent))
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
