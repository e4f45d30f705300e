"""Re-ranking as a tool (gr2jax/apps/rerank.py): good requests answered, bad ones named per-request
errors that never stop the batch; the evidence matches the data build's; the reader survives
random garbage."""

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import gr2jax
from gr2jax.apps import rerank
from gr2jax.data import answer, prompts
from gr2jax.data import evidence as evidence_lib
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.policy import make_policy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params
from tests.data.toy_records import toy_catalog, toy_sids
from tests.train.toy import PROMPT, toy_tokenizer

THRESHOLDS = np.tile([0.2, 0.4, 0.6], (3, 1))


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("tok"))
  toy_tokenizer(out)
  return tokenizer_lib.load_tokenizer(out)


def _model(tok, diffusion: bool):
  """A tiny random model over the toy tokenizer (numpy init: no init compile)."""
  mask = tok.convert_tokens_to_ids(prompts.MASK_TOKEN)
  eos = tuple(tok.convert_tokens_to_ids([prompts.IM_END, prompts.END_OF_TEXT]))
  config = ModelConfig.tiny(vocab_size=-(-len(tok) // 128) * 128, hidden_size=32, head_dim=8,
                            intermediate_size=64, num_layers=1, eos_token_ids=eos,
                            pad_token_id=int(tok.pad_token_id),
                            **(dict(mask_token_id=mask, block_size=8) if diffusion else {}))
  rng = np.random.default_rng(0)
  params = jax.tree_util.tree_map_with_path(
    lambda path, s: jnp.asarray(1.0 + 0.1 * rng.standard_normal(s.shape) if "norm" in
                                path[-1].key else 0.1 * rng.standard_normal(s.shape), s.dtype),
    abstract_params(config))
  return config, params


def _reranker(tok, diffusion=False, prompt=PROMPT, sids=None, spec=None):
  config, params = _model(tok, diffusion)
  catalogue = requests_lib.Catalogue.make(toy_catalog(), toy_sids() if sids is None else sids)
  rendering = requests_lib.Rendering(catalogue, prompt, THRESHOLDS, 0.8, 20, 20, 10)
  policy = make_policy(config, spec or DecodeSpec(), 16)
  return reranker_lib.Reranker(params, policy, tok, rendering, prompt_len=16)


class Recording:
  """A policy that decodes as the one it wraps and records the steering of every decode."""

  def __init__(self, policy):
    self.policy, self.steerings = policy, []

  def __getattr__(self, name):
    return getattr(self.policy, name)

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering):
    self.steerings.append(steering)
    return self.policy.decode(params, prompt_tokens, prompt_lengths, steering=steering)


def recording(reranker):
  """(the reranker with a Recording policy, that policy)."""
  policy = Recording(reranker.policy)
  return dataclasses.replace(reranker, policy=policy), policy


def check_constrained(steerings, tok, num_requests: int, rows: int):
  """Every decode of `num_requests` requests in batches of `rows` was steered by the answer
  constraint of the requests' candidates (slot labels: <slot_0> ... <slot_9>)."""
  slots = tok.convert_tokens_to_ids([prompts.slot_token(s) for s in range(10)])
  assert len(steerings) == -(-num_requests // rows)
  for steering in steerings:
    labels = np.asarray(steering.constraint.labels)
    assert labels.shape == (rows, 10, 1) and (labels[..., 0] == slots).all()
    assert steering.constraint.answer_start_id == tok.convert_tokens_to_ids(prompts.THINK_END)


def test_constrained_decoding_constrains_each_requests_answer(tok):
  """decode.constrained=True: every batch is decoded under the answer constraint built from its
  requests' candidates, as the evaluation builds it (it was silently dropped)."""
  reranker, policy = recording(_reranker(tok, True, spec=DecodeSpec(constrained=True)))
  rows = rerank.rerank_lines([json.dumps(_good(i)) for i in range(6)], reranker,
                                   batch_size=4)
  assert [r["id"] for r in rows] == [f"r{i}" for i in range(6)]
  check_constrained(policy.steerings, tok, 6, 4)
  reranker, policy = recording(_reranker(tok, True))
  rerank.rerank_lines([json.dumps(_good(0))], reranker, batch_size=4)
  assert all(s.empty for s in policy.steerings)  # unconstrained: nothing steers the decode


def test_prepare_and_rows_are_the_offline_tools_path(tok):
  """Reranker.prepare reads a request dict or line (a RequestError naming the field),
  Reranker.rows answers prepared requests: the offline tool's rows; the tokenizer lock is the
  Reranker's, kept by dataclasses.replace (a server's decoders share it)."""
  reranker = _reranker(tok)
  prepared = [reranker.prepare(_good(i), line=i + 1) for i in range(3)]
  prepared.append(reranker.prepare(json.dumps(_good(3)), line=4))
  assert prepared[0].prompt_len == lengths_lib.round_up(len(prepared[0].encoded.prompt)) > 16
  got = reranker.rows(prepared, batch_rows=4)  # the mixed test's compiled shape
  assert got.rows == rerank.rerank_lines([json.dumps(_good(i)) for i in range(4)], reranker,
                                         batch_size=4)
  assert [r["line"] for r in got.rows] == [1, 2, 3, 4] and len(got.answers.texts) == 4
  with pytest.raises(requests_lib.RequestError) as e:
    reranker.prepare(_good(0) | {"history": [1, True]})
  assert (e.value.kind, e.value.field) == ("bad_field", "history[1]")
  assert dataclasses.replace(reranker, prompt_len=8).tokenizer_lock is reranker.tokenizer_lock
  with pytest.raises(ValueError, match="no request rendering"):
    dataclasses.replace(reranker, rendering=None).prepare(_good(0))


def _good(i):
  rng = np.random.default_rng(i)
  items = rng.permutation(40)
  return {"id": f"r{i}", "history": items[:5].tolist(), "candidates": items[5:15].tolist()}


BAD = {  # line -> the error kind it must get
  "{not json": "malformed_json",
  "[1, 2, 3]": "not_an_object",
  json.dumps({"id": 1, "history": [1]}): "missing_field",
  json.dumps({"id": 2, "history": 5, "candidates": list(range(10))}): "bad_field",
  json.dumps({"id": 3, "history": [], "candidates": [*range(9), 40]}): "unknown_item",
  json.dumps({"id": 4, "history": ["NOPE"], "candidates": list(range(10))}): "unknown_item",
  json.dumps({"id": 5, "history": [1], "candidates": list(range(9))}): "wrong_candidate_count",
  json.dumps({"id": 6, "history": [1], "candidates": list(range(11))}): "wrong_candidate_count",
  json.dumps({"id": 7, "history": [1], "candidates": [*range(9), 3]}): "duplicate_candidates",
  json.dumps({"id": 8, "history": [True], "candidates": list(range(10))}): "bad_field",
}


@pytest.mark.parametrize("diffusion", [False, True])
def test_mixed_requests_good_answered_bad_named(tok, diffusion):
  reranker = _reranker(tok, diffusion)
  lines = []
  for i, bad in enumerate(BAD):
    lines += [json.dumps(_good(i)), bad, ""]
  # candidates by ASIN work as well, and come back as given
  asin = _good(99) | {"candidates": [f"B{i:09d}" for i in _good(99)["candidates"]]}
  lines.append(json.dumps(asin))
  rows = rerank.rerank_lines(lines, reranker, batch_size=4)
  assert len(rows) == 2 * len(BAD) + 1  # blank lines skipped, nothing dropped
  good = [r for r in rows if "error" not in r]
  bad = [r for r in rows if "error" in r]
  assert [r["id"] for r in good] == [f"r{i}" for i in range(len(BAD))] + ["r99"]
  for row in good:
    assert sorted(row["ranking_slots"]) == list(range(10))
    request = json.loads(lines[row["line"] - 1])
    assert row["ranking"] == [request["candidates"][s] for s in row["ranking_slots"]]
    assert row["fallback"] == (row["kind"] != "valid")
    assert isinstance(row["reasoning"], str) and isinstance(row["response"], str)
  assert [r["error"]["kind"] for r in bad] == list(BAD.values())
  assert all(r["error"]["message"] for r in bad)
  assert [r["id"] for r in bad][2:] == list(range(1, 9))  # ids read back where readable
  summary = rerank.summarize(rows)
  assert summary["answered"] == len(good) and summary["errors"] == len(BAD)


def test_evidence_is_the_data_builds():
  """to_examples' buckets = evidence.compute + bucketize on the right-aligned last 20 items."""
  catalogue = requests_lib.Catalogue.make(toy_catalog(), toy_sids())
  rendering = requests_lib.Rendering(catalogue, PROMPT, THRESHOLDS, 0.8, 20, 3, 10)
  request = requests_lib.parse_request(json.dumps(_good(1)), 1, catalogue, 10, False)
  [example] = requests_lib.to_examples([request], rendering)
  hist = np.asarray(_good(1)["history"][-3:], np.int32)[None]
  ev = evidence_lib.compute(catalogue.features, hist, request.candidates[None], 0.8, 20)
  np.testing.assert_array_equal(example.evidence,
                                evidence_lib.bucketize(ev.values, THRESHOLDS)[0])
  np.testing.assert_array_equal(example.history, hist[0])
  assert example.evidence.max() > 0  # the toy catalogue shares brands and categories


def test_answer_row_valid_answer_and_reasoning():
  request = requests_lib.Request(1, "x", np.arange(3), np.arange(10),
                                 tuple(f"i{k}" for k in range(10)))
  labels = tuple(prompts.slot_token(s) for s in range(10))
  ranking = np.asarray([3, 1, 0, 2, 4, 5, 6, 7, 8, 9])
  text = prompts.think_block("<slot_3><brand_2>") + prompts.render_answer(ranking, labels)
  row = requests_lib.answer_row(request, text, answer.parse_answer(text, labels))
  assert row["kind"] == "valid" and not row["fallback"]
  assert row["ranking"][:2] == ["i3", "i1"] and row["reasoning"] == "<slot_3><brand_2>"
  row = requests_lib.answer_row(request, "<think>\nhalf",
                                answer.parse_answer("<think>\nhalf", labels))
  assert row["fallback"] and row["ranking_slots"] == list(range(10))
  assert row["reasoning"] == "half"


def test_sid_prompt_needs_sids_of_the_build():
  """With SIDs in the prompt, an item the build has no SID for is a named error; a user
  catalogue is matched to the build's SIDs by ASIN."""
  build = toy_catalog()
  user = dataclasses.replace(build, asins=build.asins[:30] + tuple(f"NEW{i}" for i in range(10)))
  catalogue = requests_lib.Catalogue.make(user, toy_sids(), build)
  np.testing.assert_array_equal(catalogue.sids[:30], toy_sids()[:30])
  assert (catalogue.sids[30:] == -1).all()
  line = json.dumps({"id": 0, "history": [1], "candidates": list(range(25, 35))})
  [row] = requests_lib.read_requests([line], catalogue, 10, needs_sids=True)
  assert row["error"]["kind"] == "no_semantic_id"
  [ok] = requests_lib.read_requests([line], catalogue, 10, needs_sids=False)
  assert isinstance(ok, requests_lib.Request)


def test_fuzz_reader_never_raises():
  """Random garbage lines (bytes, JSON of random shapes, deep nesting) give a Request or a named
  error row, never an exception."""
  catalogue = requests_lib.Catalogue.make(toy_catalog(), toy_sids())
  rng = np.random.default_rng(0)
  atoms = [None, True, -1, 0, 5, 39, 40, 2**70, 1.5, float("nan"), "", "B000000001", "x", [], {}]

  def value(depth=0):
    kind = rng.integers(4 if depth < 3 else 1)
    if kind == 0:
      return atoms[rng.integers(len(atoms))]
    if kind == 1:
      return [value(depth + 1) for _ in range(rng.integers(12))]
    if kind == 2:
      keys = ["id", "history", "candidates", "extra"]
      return {keys[rng.integers(4)]: value(depth + 1) for _ in range(rng.integers(5))}
    return {"id": value(depth + 1), "history": value(depth + 1),
            "candidates": [int(x) for x in rng.integers(-2, 42, rng.integers(8, 12))]}

  lines = [bytes(rng.integers(0, 256, rng.integers(1, 40), dtype=np.uint8)).decode("latin-1")
           for _ in range(100)]
  lines += [json.dumps(value()) for _ in range(300)]
  lines += ["[" * 100000, '{"id": ' + "[" * 5000, "\x00", "{}", "null", '"str"']
  lines += [value() for _ in range(50)]  # already-decoded objects (the Python API)
  lines += [json.dumps(_good(i)) for i in range(5)]
  rows = requests_lib.read_requests(lines, catalogue, 10, needs_sids=True)
  for row in rows:
    assert (isinstance(row, requests_lib.Request)
            or row["error"]["kind"] in requests_lib.ERROR_KINDS)
  assert all(isinstance(r, requests_lib.Request) for r in rows[-5:])


def test_python_api_is_the_package_export(tmp_path, tok):
  path = os.path.join(tmp_path, "req.jsonl")
  with open(path, "w") as f:
    f.write("".join(json.dumps(_good(i)) + "\n" for i in range(4)) + "{bad\n")
  rows = gr2jax.rerank(path, _reranker(tok), batch_size=4)  # the mixed test's compiled shape
  assert all("error" not in r for r in rows[:4]) and rows[4]["error"]["kind"] == "malformed_json"
  with pytest.raises(ValueError, match="^export=some/ckpt: does not exist"):
    gr2jax.rerank(path, "some/ckpt")  # named before a data build could start
  converted = tmp_path / "converted"  # a model directory, not a stage's export
  converted.mkdir()
  (converted / "gr2jax_config.json").write_text("{}")
  with pytest.raises(ValueError, match="records no data_config"):
    gr2jax.rerank(path, str(converted))
  with pytest.raises(TypeError, match="requests must be"):
    gr2jax.rerank(_good(0), "some/ckpt")  # one request dict, not a list of them


def _rerank_config(requests, out):
  """The `rerank` block of rerank.py (the recipe is the tiny one: `_RECIPE`)."""
  from ml_collections import ConfigDict

  return ConfigDict(dict(ckpt="ckpt", requests=requests, out=out, items_file="", batch_size=4,
                         max_new_tokens=0, verify_with=""))


def _run(block, workdir):
  from gr2jax import recipe, recipes

  return rerank.run(recipe.from_config(recipes.config("", "rerank")), block, workdir)


@pytest.fixture
def no_decoding(monkeypatch):
  """rerank.run must refuse a bad output path before it loads or decodes anything."""
  def fail(*args, **kwargs):
    raise AssertionError("rerank.run loaded the model before checking rerank.out")
  monkeypatch.setattr(reranker_lib, "load_reranker", fail)


def test_out_that_is_the_requests_file_is_refused(tmp_path, no_decoding):
  """rerank.out == requests used to overwrite the requests."""
  requests = os.path.join(tmp_path, "req.jsonl")
  with open(requests, "w") as f:
    f.write(json.dumps(_good(0)) + "\n")
  with pytest.raises(ValueError, match="rerank.out=.* is the requests file"):
    _run(_rerank_config(requests, requests), str(tmp_path))
  with pytest.raises(ValueError, match="rerank.out=.* is the requests file"):
    _run(_rerank_config(requests, os.path.join(tmp_path, ".", "req.jsonl")),
               str(tmp_path))
  assert open(requests).read() == json.dumps(_good(0)) + "\n"


def test_out_that_is_a_directory_or_unwritable_is_refused_before_decoding(tmp_path, no_decoding):
  requests = os.path.join(tmp_path, "req.jsonl")
  open(requests, "w").close()
  with pytest.raises(ValueError, match="rerank.out=.* is a directory"):
    _run(_rerank_config(requests, str(tmp_path)), str(tmp_path))
  locked = os.path.join(tmp_path, "locked")
  os.mkdir(locked, 0o500)
  if not os.access(locked, os.W_OK):  # root can write anywhere
    with pytest.raises(ValueError, match="cannot write under"):
      _run(_rerank_config(requests, os.path.join(locked, "sub", "out.jsonl")),
                 str(tmp_path))


def test_bad_batch_size_is_refused_before_decoding(tmp_path, no_decoding):
  requests = os.path.join(tmp_path, "req.jsonl")
  open(requests, "w").close()
  config = _rerank_config(requests, os.path.join(tmp_path, "out.jsonl"))
  config.batch_size = 0
  with pytest.raises(ValueError, match="rerank.batch_size=0"):
    _run(config, str(tmp_path))


@pytest.mark.parametrize("field, value", [("ckpt", "{workdir}/rl/exprt"),
                                          ("verify_with", "{workdir}/ar_rl/exprt")])
def test_a_misspelt_export_is_named_before_any_data_build(tmp_path, monkeypatch, field, value):
  """From an empty workdir (a self-contained export's use) a typo in rerank.ckpt used to build
  a whole data build there first, then say the path was not a model."""
  from gr2jax.data import pipeline

  def no_build(*args, **kwargs):
    raise AssertionError("a data build ran before the export was checked")

  monkeypatch.setattr(pipeline, "run", no_build)
  requests = os.path.join(tmp_path, "req.jsonl")
  open(requests, "w").close()
  workdir = tmp_path / "W"
  workdir.mkdir()
  config = _rerank_config(requests, os.path.join(tmp_path, "out.jsonl"))
  if field == "verify_with":  # the drafter exists: the verifier is the typo
    (workdir / "rl" / "export").mkdir(parents=True)
    (workdir / "rl" / "export" / "gr2jax_config.json").write_text("{}")
    config.ckpt = "{workdir}/rl/export"
  config[field] = value
  with pytest.raises(ValueError) as info:
    _run(config, str(workdir))
  assert str(info.value) == (f"rerank.{field}={workdir}/{value[len('{workdir}/'):]}: does not "
                             "exist (pass a gr2jax export or an HF Qwen3 directory)")
  assert sorted(os.listdir(workdir)) == (["rl"] if field == "verify_with" else [])


def test_a_path_with_braces_is_filled_literally(tmp_path, monkeypatch):
  """A directory named run{1} (or a '{checkout}' copied from a run record) used to be an
  IndexError / KeyError from str.format: only '{workdir}' and '{checkout}' are filled in."""
  from gr2jax import workdir as workdir_lib

  seen = {}

  def loaded(ckpt, **kwargs):
    seen.update(ckpt=ckpt, **kwargs)
    raise RuntimeError("loaded")

  monkeypatch.setattr(reranker_lib, "load_reranker", loaded)
  requests = os.path.join(tmp_path, "req.jsonl")
  open(requests, "w").close()
  workdir = tmp_path / "run{1}"
  export = workdir / "rl" / "export{0}"
  export.mkdir(parents=True)
  (export / "gr2jax_config.json").write_text("{}")
  config = _rerank_config(requests, os.path.join(tmp_path, "out.jsonl"))
  config.verify_with = "{checkout}"
  config.ckpt = "{workdir}/rl/export{0}"
  with pytest.raises(ValueError, match=r"rerank\.verify_with=.*: neither a gr2jax checkpoint"):
    _run(config, str(workdir))  # the checkout, filled in: a directory but not a model
  config.verify_with = ""
  with pytest.raises(RuntimeError, match="loaded"):
    _run(config, str(workdir))
  assert seen["ckpt"] == str(export) and seen["verify_with"] == ""
  assert workdir_lib.fill_path("{checkout}/data", "W") == os.path.join(
    workdir_lib.CHECKOUT_DIR, "data")


def test_failed_write_leaves_no_temp_file(tmp_path):
  out = os.path.join(tmp_path, "out.jsonl")
  os.mkdir(out)  # os.replace onto a directory fails after the temp file is written
  with pytest.raises(OSError):
    rerank.write_rows([{"line": 1}], out)
  assert os.listdir(tmp_path) == ["out.jsonl"]
