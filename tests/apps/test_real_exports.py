"""The lossless and constrained modes on a finished tiny workdir's real exports (the smoke run's:
tests/smoke_workdir.py): drafting with the diffusion export and verifying with its AR export
writes exactly the AR export's answers through `--config=rerank.py`, `gr2jax.rerank` and the
server (one request through httpx); the pairs the lossless mode cannot decode are refused by
name before anything is decoded, and so is decode.constrained on a model that is not block
diffusion."""

import dataclasses
import json
import os
import shutil
import subprocess
import sys

import httpx
import pytest

import gr2jax
from gr2jax import exports
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.spec import DecodeSpec
from tests.smoke_workdir import REPO, RUN, env, smoke_workdir

pytestmark = pytest.mark.integration  # the smoke run and every decoder of the pair

REQUESTS = [{"id": f"u{i}", "history": [5 + i, 6 + i, 7 + i],
             "candidates": list(range(10 + 10 * i, 20 + 10 * i))} for i in range(3)]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
  return smoke_workdir(tmp_path_factory)


@pytest.fixture(scope="module")
def requests_file(tmp_path_factory):
  path = tmp_path_factory.mktemp("requests") / "req.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in REQUESTS))
  return str(path)


@pytest.fixture(scope="module")
def ar_rows(workdir, requests_file):
  """The AR export's own answers (gr2jax.rerank), what every lossless path must write."""
  rows = gr2jax.rerank(requests_file, os.path.join(workdir, "ar_rl", "export"), batch_size=4)
  assert [r["id"] for r in rows] == [r["id"] for r in REQUESTS]
  return rows


def _answers(rows):
  return [(r["id"], r["ranking"], r["response"]) for r in rows]


def _rerank_command(workdir, requests, out, *overrides):
  return subprocess.run(
    [sys.executable, RUN, "--config=rerank.py:smoke", f"--workdir={workdir}",
     f"--config.rerank.requests={requests}", f"--config.rerank.out={out}", *overrides],
    cwd=REPO, env=env(), capture_output=True, text=True, timeout=1800)


def test_lossless_on_the_command_line_writes_the_ar_answers(workdir, requests_file, ar_rows,
                                                            tmp_path):
  out = tmp_path / "lossless.jsonl"
  result = _rerank_command(workdir, requests_file, out,
                           f"--config.rerank.ckpt={workdir}/rl/export",
                           f"--config.rerank.verify_with={workdir}/ar_rl/export",
                           "--config.rerank.batch_size=4")
  assert result.returncode == 0, result.stderr[-4000:]
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert _answers(rows) == _answers(ar_rows)


def test_lossless_through_the_python_api_writes_the_ar_answers(workdir, requests_file, ar_rows):
  rows = gr2jax.rerank(requests_file, os.path.join(workdir, "rl", "export"), batch_size=4,
                       verify_with=os.path.join(workdir, "ar_rl", "export"))
  assert _answers(rows) == _answers(ar_rows)


def test_lossless_server_answers_as_the_ar_export(workdir, ar_rows):
  from tests.apps.serve.toy_server import ThreadServer, settings

  engine = engine_lib.Engine.load(
    settings(ckpt=os.path.join(workdir, "rl", "export"),
             verify_with=os.path.join(workdir, "ar_rl", "export")), workdir=workdir)
  assert engine.kind == "lossless"
  server = ThreadServer(engine, settings(batch_buckets=(1,)))
  try:
    answer = httpx.post(f"{server.url}/v1/rerank", json=REQUESTS[0], timeout=600).json()
  finally:
    server.close()
  assert (answer["id"], answer["ranking"]) == (ar_rows[0]["id"], ar_rows[0]["ranking"])
  assert answer["reasoning"] == ar_rows[0]["reasoning"]


def _other_build(workdir, tmp_path) -> str:
  """The AR export as if trained on another data build: its data build record's vocabulary
  digest and prompt differ."""
  other = str(tmp_path / "other_build")
  shutil.copytree(os.path.join(workdir, "ar_rl", "export"), other)
  meta = exports.load_metadata(other)
  build = meta["data_build"]
  meta["data_build"] = dict(build, vocab_sha256="0" * 64,
                            prompt=dict(build["prompt"], history_items=1))
  with open(os.path.join(other, exports.METADATA_FILE), "w") as f:
    json.dump(meta, f)
  return other


def test_pairs_the_lossless_mode_cannot_decode_are_refused_by_name(workdir, tmp_path):
  recorded = DecodeSpec(**exports.load_metadata(os.path.join(workdir, "rl", "export"))["decode"])
  rl, ar_rl = os.path.join(workdir, "rl", "export"), os.path.join(workdir, "ar_rl", "export")
  cases = [  # drafter, verifier, decode spec, what the refusal names
    (rl, os.path.join(workdir, "cft", "export"), recorded,
     r"verify_with=.*cft/export.*the verifier has block_size=32; it must be an AR model"),
    (rl, _other_build(workdir, tmp_path), recorded,
     r"drafter .*rl/export and verifier .*other_build come from different data builds .*"
     r"tokenizer vocab_sha256 .* vs 0{16}.*prompt.history_items"),
    (rl, ar_rl, dataclasses.replace(recorded, draft_k=64),
     r"decode.draft_k=64\): k=64 exceeds the drafter's block size 32"),
    (os.path.join(workdir, "sft", "export"), ar_rl, recorded,
     r"drafter .*sft/export.*the drafter has no mask token .*must be a block-diffusion model"),
  ]
  for drafter, verifier, spec, match in cases:
    with pytest.raises(ValueError, match=match):
      reranker_lib.load_reranker(drafter, verify_with=verifier, decode=spec)


def test_a_refused_pair_is_one_line_on_the_command_line(workdir, requests_file, tmp_path):
  result = _rerank_command(workdir, requests_file, tmp_path / "out.jsonl",
                           f"--config.rerank.ckpt={workdir}/rl/export",
                           f"--config.rerank.verify_with={workdir}/cft/export")
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert "the verifier has block_size=32; it must be an AR model" in (
    result.stderr.strip().splitlines()[-1])


def test_constrained_is_refused_for_an_ar_or_lossless_model(workdir):
  recorded = DecodeSpec(**exports.load_metadata(os.path.join(workdir, "rl", "export"))["decode"])
  constrained = dataclasses.replace(recorded, constrained=True)
  ar_rl = os.path.join(workdir, "ar_rl", "export")
  with pytest.raises(ValueError, match=r"decode.constrained=True .*ar_rl/export is an AR model"):
    reranker_lib.load_reranker(ar_rl, decode=constrained)
  with pytest.raises(ValueError, match="decode.constrained=True .*the lossless mode answers as"):
    reranker_lib.load_reranker(os.path.join(workdir, "rl", "export"), decode=constrained,
                               verify_with=ar_rl)
  reranker = reranker_lib.load_reranker(os.path.join(workdir, "rl", "export"), decode=constrained)
  assert reranker.policy.spec.constrained  # a diffusion model decodes constrained
