"""The server's adapter (gr2jax/apps/serve/engine.py): errors name the field, histories are cut as
the data build cuts them, and ranking in padded buckets gives exactly the offline tool's rows and
the evaluation's answers (all three through Reranker.answer)."""

import dataclasses
import json
import re

import numpy as np
import pytest

from gr2jax.apps import rerank
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import evaluation, prompt_io
from gr2jax.decoding.policy import make_policy
from gr2jax.decoding.spec import DecodeSpec
from tests.apps.serve.toy_server import PROMPT_LEN, settings, toy_engine
from tests.apps.test_rerank import _good, _model, _reranker, check_constrained, recording
from tests.decoding import tiny_export


@pytest.fixture(scope="module")
def engine(tok_dir):
  return toy_engine(tok_dir)


BAD = [  # request, kind, field
  (_good(0) | {"candidates": [*range(9), 40]}, "unknown_item", "candidates[9]"),
  (_good(0) | {"history": ["NOPE", 1]}, "unknown_item", "history[0]"),
  (_good(0) | {"history": [1, True]}, "bad_field", "history[1]"),
  (_good(0) | {"candidates": list(range(9))}, "wrong_candidate_count", "candidates"),
  (_good(0) | {"candidates": list(range(11))}, "wrong_candidate_count", "candidates"),
  (_good(0) | {"candidates": [*range(9), 3]}, "duplicate_candidates", "candidates[9]"),
  (_good(0) | {"history": 5}, "bad_field", "history"),
  (_good(0) | {"id": {"a": 1}}, "bad_field", "id"),
  ({"id": 1, "history": []}, "missing_field", "candidates"),
]


@pytest.mark.parametrize("request_obj,kind,field", BAD)
def test_bad_request_names_the_field(engine, request_obj, kind, field):
  with pytest.raises(engine_lib.InputError) as e:
    engine.parse(request_obj)
  assert (e.value.kind, e.value.field) == (kind, field)
  assert str(e.value)


def test_prompt_longer_than_every_compiled_length_is_refused(engine):
  short = engine_lib.Engine(engine.reranker, prompt_lengths=(32,), name="toy")
  with pytest.raises(engine_lib.InputError, match="compiled prompt lengths") as e:
    short.parse(_good(0))
  assert (e.value.kind, e.value.field) == ("prompt_too_long", "history")
  assert engine.parse(_good(0)).prompt_len == PROMPT_LEN


def test_long_history_is_cut_oldest_first_as_the_build_cuts(engine):
  keep = engine.reranker.rendering.max_history
  history = list(np.random.default_rng(0).integers(0, 40, keep + 5))
  request = _good(0) | {"history": [int(i) for i in history]}
  long = engine.parse(request)
  cut = engine.parse(request | {"history": request["history"][5:]})
  assert (long.history_dropped, cut.history_dropped) == (5, 0)
  np.testing.assert_array_equal(long.encoded.prompt, cut.encoded.prompt)


@pytest.mark.parametrize("diffusion", [False, True])
def test_rank_in_padded_buckets_equals_the_offline_tool(tok_dir, diffusion):
  """Requests ranked 3 + 4 + 3 in batches of 4 (rows repeated) give the offline tool's rows,
  raw responses included; once warm, nothing compiles."""
  engine = toy_engine(tok_dir, diffusion)
  requests = [_good(i) for i in range(10)]
  requests[3] = requests[3] | {"candidates": [f"B{i:09d}" for i in requests[3]["candidates"]]}
  offline = rerank.rerank_lines([json.dumps(r) for r in requests], engine.reranker,
                                batch_size=4)
  longest = max(len(engine.parse(r).encoded.prompt) for r in requests)
  assert lengths_lib.round_up(longest) == PROMPT_LEN  # the offline tool's width is the server's
  engine.warm(4, PROMPT_LEN)
  compiles = engine_lib.compile_count()
  prepared = [engine.parse(r) for r in requests]
  rows = []
  for chunk in (prepared[:3], prepared[3:7], prepared[7:]):
    rows += engine.rank(chunk, 4, PROMPT_LEN)
  assert engine_lib.compile_count() == compiles
  for row, want in zip(rows, offline, strict=True):
    assert row["response"] == want["response"]
    assert row["ranking"] == want["ranking"] and row["reasoning"] == want["reasoning"]
    assert (row["valid"], row["fallback"]) == (want["kind"] == "valid", want["fallback"])
    assert row["tokens"] >= 1 and row["forwards"] >= 1
  assert rows[3]["ranking"][0].startswith("B")  # ids come back as given


@pytest.mark.parametrize("diffusion", [False, True])
def test_evaluation_offline_tool_and_server_answer_identically(tok_dir, tmp_path, diffusion):
  """The same requests answered three ways through the Reranker (evaluation.evaluate of their
  encoded examples, the offline tool, the server's engine), in batches of 4 (the last padded):
  identical responses, rankings and answer kinds."""
  engine = toy_engine(tok_dir, diffusion)
  requests = [_good(i) for i in range(6)]
  offline = rerank.rerank_lines([json.dumps(r) for r in requests], engine.reranker,
                                      batch_size=4)
  prepared = [engine.parse(r) for r in requests]
  served = engine.rank(prepared[:4], 4, PROMPT_LEN) + engine.rank(prepared[4:], 4, PROMPT_LEN)
  split = prompt_io.SplitData(encoded=[p.encoded for p in prepared], users=np.arange(6),
                              labels=[p.labels for p in prepared],
                              teacher_top1=np.full(6, -1, np.int32))
  reranker = dataclasses.replace(engine.reranker, prompt_len=PROMPT_LEN)  # the offline width
  result = evaluation.evaluate(reranker, split, batch_size=4, out_path=str(tmp_path / "e.jsonl"))
  evaluated = [json.loads(line) for line in (tmp_path / "e.jsonl").read_text().splitlines()]
  responses = [r["response"] for r in offline]
  assert [r["response"] for r in evaluated] == responses == [r["response"] for r in served]
  assert [r["ranking"] for r in evaluated] == [r["ranking_slots"] for r in offline]
  assert [r["kind"] for r in evaluated] == [r["kind"] for r in offline]
  assert [r["ranking"] for r in served] == [r["ranking"] for r in offline]
  assert [r["valid"] for r in served] == [r["kind"] == "valid" for r in offline]
  assert result["num"] == 6 and result["valid_rate"] == np.mean([r["valid"] for r in served])


def test_constrained_engine_decodes_under_each_requests_answer_constraint(tok_dir):
  """decode.constrained=True in the server: the engine's batches carry the answer constraint of
  their requests' candidates (it was silently dropped) and answer as the offline tool does."""
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  reranker, policy = recording(_reranker(tok, True, spec=DecodeSpec(constrained=True)))
  engine = engine_lib.Engine(reranker, prompt_lengths=(PROMPT_LEN,), name="toy")
  requests = [_good(i) for i in range(5)]
  rows = engine.rank([engine.parse(r) for r in requests[:4]], 4, PROMPT_LEN)
  rows += engine.rank([engine.parse(requests[4])], 4, PROMPT_LEN)
  check_constrained(policy.steerings, tok, 5, 4)
  offline = rerank.rerank_lines([json.dumps(r) for r in requests], engine.reranker,
                                      batch_size=4)
  assert [r["response"] for r in rows] == [r["response"] for r in offline]


def test_example_request_is_valid(engine):
  prepared = engine.parse(engine.example())
  assert len(prepared.request.candidates) == engine.num_candidates


def test_a_compilation_cache_that_cannot_be_made_is_skipped(tmp_path, caplog):
  import jax

  from gr2jax.apps.serve import engine as engine_lib

  (tmp_path / "file").write_text("")
  before = jax.config.jax_compilation_cache_dir
  engine_lib.use_compilation_cache(str(tmp_path / "file" / "cache"))  # under a file: ENOTDIR
  assert jax.config.jax_compilation_cache_dir == before
  assert "serving without the persistent compilation cache" in caplog.text


@pytest.fixture(scope="module")
def export(tmp_path_factory):
  """(a tiny stage export with its inference bundle, the workdir of its build: P = 64, R = 48,
  max_position_embeddings 40960)."""
  config, summary, workdir = tiny_export.build(tmp_path_factory)
  path = str(tmp_path_factory.mktemp("stage") / "export")
  tiny_export.write_export(path, config, summary)
  return path, workdir


def test_prompt_lengths_that_cannot_hold_the_builds_prompts_are_refused_at_load(export):
  """serve.prompt_lengths=(32,) on a build of P = 64 started: /healthz said ready, then every
  request the build renders got a 422 blaming its history. The widest width must hold P;
  narrower ones beside it serve short prompts."""
  path, workdir = export
  with pytest.raises(ValueError) as e:
    engine_lib.Engine.load(settings(ckpt=path, prompt_lengths=(16, 32)), workdir=workdir)
  assert str(e.value) == (
    "serve.prompt_lengths=(16, 32): the widest, 32, is shorter than the build's prompt width "
    "P=64 (its longest prompt), so the build's longer prompts would fit no compiled width: "
    "include 64 (serve.prompt_lengths=() compiles P alone)")
  loaded = engine_lib.Engine.load(settings(ckpt=path, prompt_lengths=(32, 64)), workdir=workdir)
  assert loaded.prompt_lengths == (32, 64)
  assert engine_lib.Engine.load(settings(ckpt=path), workdir=workdir).prompt_lengths == (64,)


def test_max_new_tokens_past_the_models_positions_is_refused_at_load(export):
  """serve.max_new_tokens=40960 on a model of 40960 positions failed in the warm-up, with a
  traceback from init_cache."""
  path, workdir = export
  with pytest.raises(ValueError) as e:
    engine_lib.Engine.load(settings(ckpt=path, max_new_tokens=40960), workdir=workdir)
  assert str(e.value) == (
    "serve.max_new_tokens: a response cap of 40960 tokens (0 = the build's R) after prompts of "
    "width 64 (serve.prompt_lengths) needs 41024 positions; the model has 40960 "
    "(max_position_embeddings): set serve.max_new_tokens <= 40896")
  with pytest.raises(ValueError, match=r"needs 41024 positions.*<= 40832$"):
    engine_lib.Engine.load(settings(ckpt=path, max_new_tokens=40896, prompt_lengths=(64, 128)),
                           workdir=workdir)
  assert engine_lib.Engine.load(settings(ckpt=path, max_new_tokens=40896),
                                workdir=workdir).reranker.policy.max_new_tokens == 40896


def _positions(reranker, **models):
  """The reranker with its policy's models (config, verifier_config) given `positions`."""
  policy = reranker.policy
  return dataclasses.replace(reranker, policy=dataclasses.replace(policy, **{
    name: dataclasses.replace(getattr(policy, name), max_position_embeddings=m)
    for name, m in models.items()}))


@pytest.mark.parametrize("diffusion, models, message", [
  (False, dict(config=100), "needs 112 positions; the model has 100 (max_position_embeddings): "
   "set serve.max_new_tokens <= 4"),
  (True, dict(config=110), "needs 112 positions; the model has 110 (max_position_embeddings): "
   "set serve.max_new_tokens <= 8"),  # R = 16 in whole blocks of 8 after 96; 110 - 96 -> 8
  (True, dict(config=100), "needs 112 positions; the model has 100 (max_position_embeddings): "
   "no response fits after 96 tokens: lower serve.prompt_lengths"),
  ("lossless", dict(config=200, verifier_config=100), "needs 112 positions; the verifier has "
   "100 (max_position_embeddings): set serve.max_new_tokens <= 4"),
  ("lossless", dict(config=110, verifier_config=200), "needs 112 positions; the drafter has "
   "110 (max_position_embeddings): set serve.max_new_tokens <= 8"),
])
def test_positions_are_counted_per_model_in_its_own_blocks(tok_dir, diffusion, models, message):
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  reranker = _reranker(tok, diffusion is True)
  if diffusion == "lossless":
    drafter_config, drafter = _model(tok, True)
    policy = make_policy(drafter_config, DecodeSpec(draft_k=8), reranker.policy.max_new_tokens,
                         verifier_config=reranker.policy.config)
    reranker = dataclasses.replace(reranker, params={"drafter": drafter,
                                                     "verifier": reranker.params}, policy=policy)
  with pytest.raises(ValueError, match=r"^serve\.max_new_tokens: a response cap of 16 tokens .*"
                                       f"{re.escape(message)}$"):
    engine_lib.Engine(_positions(reranker, **models), prompt_lengths=(PROMPT_LEN,), name="toy")
