"""DecodeSpec, the policies' construction and their decode, and the one causal scorer."""

import dataclasses

import jax
import numpy as np
import pytest

from gr2jax import recipe, recipes, stage_registry
from gr2jax.decoding.policy import ARPolicy, DiffusionPolicy, causal_log_probs, make_policy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.model import generate
from gr2jax.model.params import init_params
from tests.train.toy_policy import AR, DIFFUSION, STOP


def test_retired_fields_stay_in_records_and_older_records_load():
  """rollout_tau / temperature left the spec (OPD's own settings now): records and cache keys
  keep them at their retired values, and an older export's recorded spec still loads."""
  spec = DecodeSpec(eval_tau=0.9)
  assert spec.record() == {**dataclasses.asdict(spec), "rollout_tau": 0.9, "temperature": 1.0}
  older = {**dataclasses.asdict(spec), "rollout_tau": 0.5, "temperature": 0.7}
  assert DecodeSpec.from_record(older) == spec


def test_paper_defaults():
  spec = DecodeSpec()
  assert (spec.block_size, spec.eval_tau, spec.max_steps_per_block) == (32, 1.0, 64)


@pytest.mark.parametrize("field,value", [
  ("block_size", 0), ("block_size", 2.0), ("max_steps_per_block", 0), ("eval_tau", 0.0),
  ("eval_tau", 1.5), ("eval_tau", float("nan"))])
def test_bad_fields_are_named(field, value):
  with pytest.raises(ValueError, match=f"decode.{field}"):
    DecodeSpec(**{field: value})


def test_every_stage_view_carries_the_recipes_decode_spec_whole():
  for variant in ("", "smoke"):
    r = recipe.from_config(recipes.config(variant, "table2"))
    for name in stage_registry.names():
      assert recipe.stage_config(r, name, "w").decode is r.decode


def test_make_policy_is_the_models_own_decoder():
  spec = DecodeSpec(block_size=4)
  assert isinstance(make_policy(AR, spec, 10), ARPolicy)
  assert isinstance(make_policy(DIFFUSION, spec, 10), DiffusionPolicy)
  with pytest.raises(ValueError, match="mask_token_id is None"):
    DiffusionPolicy(AR, DecodeSpec(block_size=1), 10)


def test_decoding_params_are_the_decoders_layout_converted_once():
  params = init_params(AR, jax.random.key(0))
  for policy in (make_policy(AR, DecodeSpec(block_size=1), 10),
                 make_policy(DIFFUSION, DecodeSpec(block_size=4), 10)):
    converted = policy.decoding_params(params)
    assert isinstance(converted["layers"], tuple) and len(converted["layers"]) == AR.num_layers
    assert policy.decoding_params(converted) is converted  # a no-op once converted
    np.testing.assert_array_equal(converted["layers"][0]["qkv"][:, :, -1], params["layers"]["v"][0])


def test_causal_scorer_is_the_cached_decoding_and_refuses_diffusion_models(prepared):
  """The causal scorer's log-probs of a sampled response equal what the cached AR sampler
  recorded; the scorer refuses a block-diffusion config. (4 rows: the sampler compiled for the
  rollouts of the `prepared` fixture.)"""
  params = prepared["params"][0]
  prompts, lengths = prepared["ar"][0].prompt_tokens[2:], prepared["ar"][0].prompt_lengths[2:]
  out = generate.generate(params, AR, prompts, lengths,
                          generate.ARDecoding(max_new_tokens=10, temperature=1.0),
                          key=jax.random.key(1))
  logp, full = jax.jit(causal_log_probs, static_argnames=("config", "return_log_probs"))(
    params, AR, prompts, lengths, out.tokens, out.lengths, return_log_probs=True)
  real = np.arange(10)[None, :] < np.asarray(out.lengths)[:, None]
  np.testing.assert_allclose(np.where(real, logp, 0), out.logprobs, atol=2e-5)
  assert full.shape == (4, 10, AR.vocab_size)
  with pytest.raises(ValueError, match="block_size=4"):
    causal_log_probs(params, DIFFUSION, prompts, lengths, out.tokens, out.lengths)


# A drafter with the AR verifier's own weights (its drafts are often accepted, up to the cap) and
# four prompts whose AR answers at R = CAP stop early (row 3) or are cut at the cap (rows 0-2: the
# verifier would write on past it).
CAP = 10
PROMPTS = np.array([[10, 11, 12, 13, 14, 0], [20, 21, 22, 0, 0, 0], [30, 31, 32, 33, 0, 0],
                    [40, 41, 0, 0, 0, 0]], np.int32)
LENGTHS = np.array([5, 3, 4, 2], np.int32)


def lossless_pair():
  """(the lossless policy of DIFFUSION verified by AR at CAP, its params {"drafter",
  "verifier"})."""
  verifier = init_params(AR, jax.random.key(1))
  policy = make_policy(DIFFUSION, DecodeSpec(block_size=4, draft_k=4), CAP, verifier_config=AR)
  return policy, policy.decoding_params({"drafter": verifier, "verifier": verifier})


def assert_ar_greedy_at_cap(policy, params, verifier_params):
  """policy.decode(params, PROMPTS) writes exactly AR's greedy tokens and lengths at CAP, and
  the prompts include an answer AR stops and one it leaves cut at CAP (that it would continue)."""
  ref = generate.generate(verifier_params, AR, PROMPTS, LENGTHS,
                          generate.ARDecoding(max_new_tokens=CAP))
  out = policy.decode(params, PROMPTS, LENGTHS)
  assert policy.max_new_tokens == CAP
  np.testing.assert_array_equal(out.tokens, np.asarray(ref.tokens))
  np.testing.assert_array_equal(out.lengths, np.asarray(ref.lengths))
  ref_lengths = np.asarray(ref.lengths)
  stopped = np.isin(np.asarray(ref.tokens)[np.arange(4), ref_lengths - 1], STOP)
  assert stopped.any() and (~stopped & (ref_lengths == CAP)).any()


def test_lossless_is_the_verifiers_decode_at_its_own_cap():
  """The lossless mode writes its verifier's tokens: AR's greedy tokens and lengths at R, an
  answer AR cuts at R cut there too."""
  policy, params = lossless_pair()
  assert_ar_greedy_at_cap(policy, params, params["verifier"])
