"""serve.mode='auto' (gr2jax/apps/serve/auto.py): the cheapest decoder of each bucket from a cost
table; whichever decodes, every request gets the AR verifier's own ranking; /healthz reports the
table and the choice, /metrics counts batches by decoder; 'auto' without a verifier is refused
by name."""

import dataclasses
import itertools
import json

import httpx
import pytest

from gr2jax import recipes
from gr2jax.apps.serve import auto, server
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.apps.serve.client import scrape
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.policy import make_policy
from gr2jax.decoding.spec import DecodeSpec
from tests.apps.serve.toy_server import PROMPT_LEN, ThreadServer, settings, toy_engine
from tests.apps.test_rerank import _good, _model, _reranker
from tests.decoding.test_policy import PROMPTS, assert_ar_greedy_at_cap, lossless_pair

DRAFT_KS = (2, 8)  # the toy drafter's block is 8
DECODERS = ("ar", "lossless_k2", "lossless_k8")


def test_choose_takes_the_cheapest_decoder_of_each_bucket():
  table = {4: {"ar": 2.0, "lossless_k4": 1.0}, 1: {"ar": 0.5, "lossless_k4": 0.9},
           8: {"lossless_k8": 1.0, "ar": 1.0}}
  assert auto.choose(table) == {1: "ar", 4: "lossless_k4", 8: "ar"}  # a tie: the first name


def test_measure_keeps_each_decoders_fastest_run_interleaved():
  calls, ticks = [], iter([0, 5, 5, 6, 6, 8, 8, 10])  # a: 5 then 2; b: 1 then 2
  seconds = auto.measure(calls.append, ("a", "b"), repeats=2, clock=lambda: next(ticks))
  assert seconds == {"a": 2, "b": 1} and calls == ["a", "b", "a", "b"]


def _table_file(tmp_path, table) -> str:
  path = tmp_path / "costs.json"
  path.write_text(table if isinstance(table, str) else json.dumps(table))
  return str(path)


@pytest.mark.parametrize("table,says", [
  ("{not json", "cannot read it as JSON"),
  ([1, 4], "must be a JSON object"),
  ({"1": {"ar": 1.0}}, r"no costs for the batch buckets \[4\]"),
  ({"1": {"ar": 1.0}, "4": {"ar": 1.0}, "2": {"ar": 1.0}}, "bucket '2' is not a compiled"),
  ({"1": {"ar": 1.0}, "4": {}}, "bucket 4 must map decoder names"),
  ({"1": {"ar": 1.0}, "4": {"fast": 1.0}}, "bucket 4: unknown decoder 'fast'"),
  ({"1": {"ar": 0}, "4": {"ar": 1.0}}, "bucket 1, ar: 0 must be seconds > 0"),
  ({"1": {"ar": True}, "4": {"ar": 1.0}}, "bucket 1, ar: True must be seconds"),
])
def test_a_bad_cost_table_names_the_file_and_the_entry(tmp_path, table, says):
  path = _table_file(tmp_path, table)
  with pytest.raises(ValueError, match=rf"^serve\.cost_table={path}: .*{says}"):
    auto.read_cost_table(path, (1, 4), DECODERS)


def test_a_missing_cost_table_is_named():
  with pytest.raises(ValueError, match=r"^serve\.cost_table=missing\.json: .*No such file"):
    auto.read_cost_table("missing.json", (1, 4), DECODERS)


def test_a_cost_table_file_is_read_per_bucket(tmp_path):
  path = _table_file(tmp_path, {"1": {"lossless_k2": 0.5, "ar": 1}, "4": {"ar": 2.0}})
  assert auto.read_cost_table(path, (1, 4), DECODERS) == {1: {"lossless_k2": 0.5, "ar": 1.0},
                                                          4: {"ar": 2.0}}


@pytest.mark.parametrize("field,value", [("mode", "fast"), ("draft_ks", (8, 4)),
                                         ("draft_ks", (0,))])
def test_bad_auto_settings_name_the_field(field, value):
  with pytest.raises(ValueError, match=rf"^serve\.{field}[= \[]"):
    settings(**{field: value})


def test_a_cost_table_without_auto_is_refused():
  with pytest.raises(ValueError, match=r"^serve\.cost_table='t\.json' .*serve\.mode='fixed'"):
    settings(cost_table="t.json")


def test_auto_without_a_verifier_is_refused_by_name_before_anything_loads(tmp_path, tok_dir):
  block = recipes.config("", "serve").serve
  block.update(dict(port=0, mode="auto", ckpt=str(tmp_path / "no_export")))
  with pytest.raises(ValueError, match=r"^serve\.mode='auto' .*set serve\.verify_with"):
    server.run(None, block, str(tmp_path))
  assert not list(tmp_path.iterdir())  # nothing loaded, no compilation cache made
  with pytest.raises(ValueError, match=r"^serve\.mode='auto' .*set serve\.verify_with"):
    settings(mode="auto")
  with pytest.raises(ValueError, match=r"^serve\.mode='auto' .*set serve\.verify_with"):
    engine_lib.Engine(toy_engine(tok_dir).reranker, prompt_lengths=(PROMPT_LEN,), name="toy",
                      choice=auto.Auto(DRAFT_KS))


def _lossless_engine(tok_dir, choice: auto.Auto | None = None) -> engine_lib.Engine:
  """The toy AR model (toy_engine's) verifying a toy block-diffusion drafter, in mode 'auto'."""
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  ar = _reranker(tok)
  drafter_config, drafter = _model(tok, True)
  policy = make_policy(drafter_config, DecodeSpec(draft_k=8), ar.policy.max_new_tokens,
                       verifier_config=ar.policy.config)
  lossless = dataclasses.replace(ar, params={"drafter": drafter, "verifier": ar.params},
                                 policy=policy)
  return engine_lib.Engine(lossless, prompt_lengths=(PROMPT_LEN,), name="toy",
                           choice=choice or auto.Auto(DRAFT_KS))


def test_every_exact_decoder_is_the_verifiers_decode_at_its_cap():
  """'auto' builds the verifier-alone decoder from the lossless policy: both decoders keep the
  verifier's own cap R and write AR's greedy tokens and lengths at R
  (tests/decoding/test_policy.py's prompts: an answer stopped, one cut at R)."""
  policy, params = lossless_pair()
  lossless = reranker_lib.Reranker(params, policy, tokenizer=None, rendering=None,
                                   prompt_len=PROMPTS.shape[1])
  decoders = auto.exact_decoders(lossless, (policy.spec.draft_k,))
  assert tuple(decoders) == ("ar", "lossless_k4")
  for decoder in decoders.values():
    assert_ar_greedy_at_cap(decoder.policy, decoder.params, params["verifier"])


def test_a_k_the_drafter_cannot_draft_is_refused_by_name(tok_dir):
  with pytest.raises(ValueError, match=r"^serve\.draft_ks=\(4, 16\): k=16 exceeds"):
    _lossless_engine(tok_dir, auto.Auto((4, 16)))


@pytest.mark.integration
def test_every_choice_ranks_as_the_ar_model_and_the_table_switches_decoders(tok_dir):
  """Each decoder chosen in turn for bucket 4 (and another for bucket 1): the rows are the AR
  model's own, raw responses included, and say which decoder wrote them; the engine's warm-up
  timing gives every bucket a cost per decoder."""
  ar = toy_engine(tok_dir)
  engine = _lossless_engine(tok_dir)
  assert tuple(engine.decoders) == DECODERS
  requests = [engine.parse(_good(i)) for i in range(8)]
  want = ar.rank(requests[:4], 4, PROMPT_LEN) + ar.rank(requests[4:], 4, PROMPT_LEN)
  for fast, other in itertools.permutations(DECODERS, 2):
    engine.use_costs({4: {fast: 1.0, other: 2.0}, 1: {fast: 2.0, other: 1.0}})
    rows = engine.rank(requests[:4], 4, PROMPT_LEN) + engine.rank(requests[4:], 4, PROMPT_LEN)
    assert [r["decoder"] for r in rows] == [fast] * 8
    for row, expected in zip(rows, want, strict=True):
      assert {k: row[k] for k in ("response", "ranking", "reasoning", "valid", "tokens")} == {
        k: expected[k] for k in ("response", "ranking", "reasoning", "valid", "tokens")}
    [single] = engine.rank(requests[:1], 1, PROMPT_LEN)
    assert single["decoder"] == other and single["ranking"] == want[0]["ranking"]
  seconds = engine.time_decoders(4, PROMPT_LEN)
  assert set(seconds) == set(DECODERS) and all(s > 0 for s in seconds.values())


@pytest.mark.integration
def test_server_reports_the_table_and_the_choice_and_counts_batches_by_decoder(tok_dir,
                                                                               tmp_path):
  """An injected table: bucket 1 drafts (K = 2), bucket 4 decodes AR; /healthz reports both,
  answers are the AR model's, /metrics counts each decoder's batches."""
  table = {"1": {"ar": 2.0, "lossless_k2": 1.0, "lossless_k8": 3.0}, "4": {"ar": 1.0}}
  spec = settings(batch_buckets=(1, 4), mode="auto", draft_ks=DRAFT_KS, verify_with="verifier",
                  cost_table=_table_file(tmp_path, table))
  s = ThreadServer(_lossless_engine(tok_dir, spec.choice), spec)
  ar = toy_engine(tok_dir)
  try:
    health = s.health
    assert (health["mode"], health["kind"]) == ("auto", "lossless")
    assert health["decoders"] == {"1": "lossless_k2", "4": "ar"}
    assert health["cost_table"] == {"source": str(tmp_path / "costs.json"), "seconds": table}
    assert health["startup"]["programs"] == 2 * 3
    before = scrape(s.url)
    one = httpx.post(f"{s.url}/v1/rerank", json=_good(0), timeout=60).json()
    four = httpx.post(f"{s.url}/v1/rerank:batch", json=[_good(i) for i in range(1, 5)],
                      timeout=60).json()
    after = scrape(s.url)
  finally:
    s.close()
  want = ar.rank([ar.parse(_good(i)) for i in range(4)], 4, PROMPT_LEN)
  want += ar.rank([ar.parse(_good(4))], 4, PROMPT_LEN)
  assert [a["ranking"] for a in [one, *four]] == [w["ranking"] for w in want]
  count = lambda decoder: (after[("gr2jax_serve_decoder_batches_total", (("decoder", decoder),))]
                           - before[("gr2jax_serve_decoder_batches_total",
                                     (("decoder", decoder),))])
  assert (count("lossless_k2"), count("ar"), count("lossless_k8")) == (1, 1, 0)
