"""Block-diffusion decoder on a tiny random model (fp32, CPU).

All decode calls share the static shapes below (batch 2, prompt 6, 12 new tokens) so the suite
compiles the decoder once per block size.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.diffusion import decode
from gr2jax.model import generate, masks, qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from tests.diffusion import helpers

MASK = 63
CONFIG = ModelConfig.tiny(vocab_size=64, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0)
PROMPTS = jnp.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], jnp.int32)
LENGTHS = jnp.array([5, 3], jnp.int32)
MAX_NEW = 12


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _decode(params, prompts=PROMPTS, lengths=LENGTHS, block_size=4, threshold=0.9, **kw):
  kw = {"max_steps_per_block": 8, "max_new_tokens": MAX_NEW, "stop_token_ids": (), **kw}
  config = dataclasses.replace(CONFIG, block_size=block_size)
  return helpers.generate(params, config, prompts, lengths, threshold=threshold, **kw)


_forward = jax.jit(qwen3.forward, static_argnums=1, static_argnames="update_cache")


def _ar_greedy_reference(params, prompt, n):
  """Greedy AR decoding by full cache-free causal forwards (the slowest obviously-right way).

  The sequence lives in a fixed-size buffer; the causal mask makes the unused tail irrelevant.
  """
  seq = np.zeros((1, len(prompt) + n), np.int32)
  seq[0, : len(prompt)] = prompt
  for i in range(len(prompt), len(prompt) + n):
    logits, _ = _forward(params, CONFIG, jnp.asarray(seq))
    seq[0, i] = int(jnp.argmax(logits[0, i - 1].at[MASK].set(-jnp.inf)))
  return seq[0, len(prompt) :]


def _block_causal_logits(params, tokens, start, block_size):
  """Cache-free forward of full sequences [B, N] under the block-causal mask."""
  b, n = tokens.shape
  pos = jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32), (b, n))
  mask = masks.make_attention_mask(pos, pos, jnp.ones((b, n), bool), start, block_size)
  return _forward(params, CONFIG, tokens, pos, mask)[0]


def test_block_size_one_is_ar_greedy(params):
  out = _decode(params, block_size=1)
  np.testing.assert_array_equal(out.lengths, [MAX_NEW, MAX_NEW])
  for row in range(2):
    prompt = np.asarray(PROMPTS[row, : LENGTHS[row]]).tolist()
    np.testing.assert_array_equal(out.tokens[row], _ar_greedy_reference(params, prompt, MAX_NEW))
  # B=1: one prefill, then one commit forward per token but the last.
  np.testing.assert_array_equal(out.nfe, [MAX_NEW, MAX_NEW])
  np.testing.assert_array_equal(out.commit_step, np.full((2, MAX_NEW), decode.SEED_STEP))


def test_block_size_one_equals_generate(params):
  # The mask token's LM-head column is zeroed so AR never picks it (the decoder never commits it);
  # the remaining 63 random logits then contain a positive maximum.
  params = {**params, "lm_head": params["lm_head"].at[:, MASK].set(0.0)}
  out = _decode(params, block_size=1)
  ar = generate.generate(params, CONFIG, PROMPTS, LENGTHS,
                         generate.ARDecoding(max_new_tokens=MAX_NEW))
  np.testing.assert_array_equal(out.tokens, ar.tokens)
  np.testing.assert_array_equal(out.lengths, ar.lengths)


def test_cached_block_equals_cache_free_block_causal_forward(params):
  t = 4
  rng = np.random.default_rng(0)
  resp = jnp.asarray(rng.integers(1, MASK, (2, 2 * t)), jnp.int32)  # block 0 clean, block 1 noisy
  resp = resp.at[:, t + 2 :].set(MASK)
  p = PROMPTS.shape[1]
  cache = init_cache(CONFIG, 2, p + 2 * t)
  _, cache = jax.jit(qwen3.ragged_prefill, static_argnums=1)(
    params, CONFIG, PROMPTS, LENGTHS, cache
  )
  step = jax.jit(decode.block_forward, static_argnums=1)
  _, cache = step(params, CONFIG, cache, resp[:, :t], LENGTHS)
  logits, written = step(params, CONFIG, cache, resp[:, t:], LENGTHS)
  for row in range(2):
    n = int(LENGTHS[row])
    seq = jnp.concatenate([PROMPTS[row : row + 1, :n], resp[row : row + 1]], axis=1)
    ref = _block_causal_logits(params, seq, n, t)[0, n + t :]
    np.testing.assert_allclose(logits[row], ref, atol=1e-5, rtol=1e-5)
  # The decoder keeps the input lengths for a denoising row: the valid cache is untouched.
  kept = written.replace(lengths=cache.lengths)
  valid = np.repeat(masks.padding_mask(cache.lengths, cache.max_len), CONFIG.num_kv_heads, 0)
  for name, where in (("k", valid[None, :, None, :]), ("v", valid[None, :, :, None])):
    np.testing.assert_array_equal(jnp.where(where, np.stack(getattr(kept, name)), 0),  # L,B*K,..
                                  jnp.where(where, np.stack(getattr(cache, name)), 0))
  again, _ = step(params, CONFIG, kept, resp[:, t:], LENGTHS)
  np.testing.assert_allclose(again, logits, atol=1e-6)


def test_later_blocks_never_influence_earlier_blocks(params):
  t, n = 4, 5
  rng = np.random.default_rng(1)
  seq = jnp.asarray(rng.integers(1, MASK, (1, n + 3 * t)), jnp.int32)
  base = _block_causal_logits(params, seq, n, t)
  perturbed = seq.at[:, n + 2 * t :].set(jnp.asarray(rng.integers(1, MASK, (1, t))))
  pert = _block_causal_logits(params, perturbed, n, t)
  np.testing.assert_allclose(pert[:, : n + 2 * t], base[:, : n + 2 * t], atol=1e-6)
  assert not np.allclose(pert[:, n + 2 * t :], base[:, n + 2 * t :])


@pytest.mark.slow  # one more decoder compile
def test_longer_budget_decodes_the_same_first_blocks(params):
  short = _decode(params, max_new_tokens=8, threshold=0.05)
  long = _decode(params, threshold=0.05)
  np.testing.assert_array_equal(long.tokens[:, :8], short.tokens)
  np.testing.assert_array_equal(long.commit_step[:, :8], short.commit_step)


@pytest.mark.parametrize("threshold", [0.9, 0.03])
def test_trace_replay_reproduces_log_probs(params, threshold):
  out = _decode(params, threshold=threshold)
  steps = np.asarray(out.commit_step)
  assert (steps[:, 0] == decode.SEED_STEP).all() and (steps[:, 4] == decode.SEED_STEP).all()
  assert steps.max() < decode.NEVER_STEP
  if threshold < 0.5:  # several tokens per step somewhere, so fewer forwards than tokens
    assert int(out.num_forwards) < 1 + MAX_NEW + MAX_NEW // 4
  config = dataclasses.replace(CONFIG, block_size=4)
  lp = helpers.replay_log_probs(params, config, PROMPTS, LENGTHS, out)
  np.testing.assert_allclose(lp, out.commit_logprob, atol=2e-5)
  assert (np.asarray(out.commit_logprob) < 0).all()


@pytest.mark.slow  # decoder + replay compiles at temperature 1
def test_sampled_trace_replays(params):
  out = _decode(params, threshold=0.03, temperature=1.0, key=jax.random.key(7))
  config = dataclasses.replace(CONFIG, block_size=4)
  lp = helpers.replay_log_probs(params, config, PROMPTS, LENGTHS, out, temperature=1.0)
  np.testing.assert_allclose(lp, out.commit_logprob, atol=2e-5)


@pytest.mark.parametrize("block_size", [1, 4])
def test_stop_tokens(params, block_size):
  free = _decode(params, block_size=block_size)
  stop = int(free.tokens[0, 5])
  first = int(np.argmax(np.asarray(free.tokens[0]) == stop))
  out = _decode(params, block_size=block_size, stop_token_ids=(stop,))
  assert int(out.lengths[0]) == first + 1
  np.testing.assert_array_equal(out.tokens[0, : first + 1], free.tokens[0, : first + 1])
  assert (np.asarray(out.tokens[0, first + 1 :]) == CONFIG.pad_token_id).all()
  assert int(out.nfe[0]) < int(free.nfe[0]) or first + 1 == MAX_NEW
  hits = np.flatnonzero(np.asarray(free.tokens[1]) == stop)
  assert int(out.lengths[1]) == (hits[0] + 1 if hits.size else MAX_NEW)


def test_ragged_prompts_decode_as_if_alone(params):
  both = _decode(params)
  for row in range(2):
    alone = _decode(params, jnp.stack([PROMPTS[row]] * 2), jnp.stack([LENGTHS[row]] * 2))
    np.testing.assert_array_equal(alone.tokens[0], both.tokens[row])
    np.testing.assert_array_equal(alone.commit_step[0], both.commit_step[row])
    np.testing.assert_allclose(alone.commit_logprob[0], both.commit_logprob[row], atol=1e-5)


@pytest.mark.slow  # one more decoder compile (four LM-head branches)
def test_head_buckets_and_cache_size_do_not_change_tokens(params):
  base = _decode(params, threshold=0.03)
  lever = _decode(params, threshold=0.03, head_buckets=3, cache_size=64)
  np.testing.assert_array_equal(lever.tokens, base.tokens)
  np.testing.assert_array_equal(lever.commit_step, base.commit_step)
  np.testing.assert_allclose(lever.commit_logprob, base.commit_logprob, atol=1e-5)


def test_bad_input_raises():
  with pytest.raises(ValueError, match="mask_token_id is None"):
    helpers.generate(
      {}, ModelConfig.tiny(), PROMPTS, LENGTHS, threshold=0.9, max_steps_per_block=4,
      max_new_tokens=4,
    )
  with pytest.raises(ValueError, match=r"prompt_lengths has shape \(3,\), expected \(2,\)"):
    helpers.generate(
      {}, CONFIG, PROMPTS, jnp.ones(3, jnp.int32), threshold=0.9, max_steps_per_block=4,
      max_new_tokens=4,
    )


BAD_ARGUMENTS = {  # each was once accepted (and misbehaved)
  "tau_zero": (dict(threshold=0.0), ValueError, r"threshold=0.0 must be in \(0, 1\]"),
  "tau_negative": (dict(threshold=-0.5), ValueError, r"threshold=-0.5 must be in \(0, 1\]"),
  "tau_above_one": (dict(threshold=1.5), ValueError, r"threshold=1.5 must be in \(0, 1\]"),
  "tau_inf": (dict(threshold=float("inf")), ValueError, "threshold=inf must be finite"),
  "tau_nan": (dict(threshold=float("nan")), ValueError, "threshold=nan must be finite"),
  "tau_str": (dict(threshold="0.9"), TypeError, "threshold must be a real number"),
  "negative_temperature": (dict(temperature=-1.0), ValueError, r"temperature=-1.0 must be >= 0"),
  "token_too_big": (dict(prompt_tokens=PROMPTS.at[0, 1].set(64)), ValueError,
                    r"prompt_tokens\[0, 1\] = 64 is outside the vocab \[0, 63\]"),
  "token_negative": (dict(prompt_tokens=PROMPTS.at[1, 0].set(-3)), ValueError,
                     r"prompt_tokens\[1, 0\] = -3 is outside the vocab"),
  "float_tokens": (dict(prompt_tokens=PROMPTS.astype(jnp.float32)), TypeError,
                   "prompt_tokens must be an integer array"),
  "length_zero": (dict(prompt_lengths=jnp.array([0, 3])), ValueError,
                  r"prompt_lengths\[0\] = 0 is outside \[1, 6\]"),
  "length_past_p": (dict(prompt_lengths=jnp.array([5, 7])), ValueError,
                    r"prompt_lengths\[1\] = 7 is outside \[1, 6\]"),
  "mask_is_stop": (dict(stop_token_ids=(MASK,)), ValueError, "the mask token 63 is a stop token"),
  "stop_outside_vocab": (dict(stop_token_ids=(70,)), ValueError,
                         r"stop_token_ids\[0\] = 70 is outside the vocab"),
  "max_new_float": (dict(max_new_tokens=4.0), TypeError, "max_new_tokens must be an int"),
  "bad_key": (dict(key=7, temperature=1.0), TypeError, "key must be a PRNG key"),
}


@pytest.mark.parametrize("case", sorted(BAD_ARGUMENTS))
def test_bad_arguments_are_named_before_tracing(case):
  override, error, message = BAD_ARGUMENTS[case]
  kw = dict(prompt_tokens=PROMPTS, prompt_lengths=LENGTHS, threshold=0.9, max_steps_per_block=4,
            max_new_tokens=4)
  kw.update(override)
  config = dataclasses.replace(CONFIG, block_size=4)
  with pytest.raises(error, match=message):
    helpers.generate({}, config, kw.pop("prompt_tokens"), kw.pop("prompt_lengths"), **kw)


def test_tau_one_commits_one_token_per_step_on_a_peaked_model(params):
  """with a peaked LM head fp32 confidences round to exactly 1.0; `conf >= tau`
  then committed several tokens per step at tau = 1.0. Each step must commit exactly one."""
  peaked = {**params, "lm_head": params["lm_head"] * 1e4}
  out = _decode(peaked, threshold=1.0)
  assert (np.asarray(out.commit_logprob) == 0).mean() > 0.5  # mostly probability exactly 1.0
  steps = np.asarray(out.commit_step).reshape(2, MAX_NEW // 4, 4)
  np.testing.assert_array_equal(steps[..., 0], decode.SEED_STEP)
  np.testing.assert_array_equal(np.sort(steps[..., 1:], axis=-1),
                                np.broadcast_to([0, 1, 2], (2, MAX_NEW // 4, 3)))
  # NFE both ways: 3 denoising steps per block (the paper's count); plus the prefill and one
  # commit forward per block but the last.
  np.testing.assert_array_equal(out.denoise_steps, [3 * MAX_NEW // 4] * 2)
  np.testing.assert_array_equal(out.nfe, out.denoise_steps + MAX_NEW // 4)


def test_step_cap_commits_the_rest(params):
  out = _decode(params, threshold=1.0, max_steps_per_block=2)
  steps = np.asarray(out.commit_step)
  assert steps.max() == 1
  # tau=1 commits one per step; the capped second step commits the remaining two.
  np.testing.assert_array_equal(np.sum(steps[:, :4] == 1, axis=1), [2, 2])


def test_left_to_right_order_at_tau_one_writes_each_block_in_order(params):
  out = _decode(params, threshold=1.0, commit_order="left_to_right")
  steps = np.asarray(out.commit_step).reshape(2, MAX_NEW // 4, 4)
  np.testing.assert_array_equal(steps[..., 1:], np.broadcast_to([0, 1, 2], (2, MAX_NEW // 4, 3)))
  with pytest.raises(ValueError, match="commit_order='random' not in"):
    _decode(params, commit_order="random")


def _same_step_new_repeats(out) -> int:
  """Places whose token was also committed elsewhere in their block by the same denoising step
  and by no earlier step (nor the block's seed): a token new to the block written twice."""
  tokens = np.asarray(out.tokens).reshape(2, MAX_NEW // 4, 4)
  steps = np.asarray(out.commit_step).reshape(2, MAX_NEW // 4, 4)
  same_token = tokens[..., :, None] == tokens[..., None, :]
  same = same_token & (steps[..., :, None] == steps[..., None, :])
  earlier = same_token & (steps[..., None, :] < steps[..., :, None])
  return int(((same.sum(-1) > 1) & ~earlier.any(-1) & (steps >= 0)).sum())


def test_distinct_order_never_commits_a_new_token_twice_in_a_step(params):
  loose = _decode(params, threshold=0.01)
  assert _same_step_new_repeats(loose) > 0  # the paper's rule does, on this random model
  out = _decode(params, threshold=0.01, commit_order="distinct")
  assert _same_step_new_repeats(out) == 0
  assert out.denoise_steps.sum() > loose.denoise_steps.sum()
  # Without repeats to defer (tau = 1.0: one place per step) it is the paper's rule.
  np.testing.assert_array_equal(_decode(params, threshold=1.0, commit_order="distinct").tokens,
                                _decode(params, threshold=1.0).tokens)


def test_response_prefix_is_given_and_a_whole_given_block_changes_nothing_after_it(params):
  out = _decode(params)
  given = np.asarray(out.tokens)
  # The first block given as it was decoded: every later block decodes the same.
  same = _decode(params, response_prefix=(given[:, :4], np.array([4, 4])))
  np.testing.assert_array_equal(same.tokens, out.tokens)
  np.testing.assert_array_equal(same.commit_step[:, :4], decode.SEED_STEP)
  np.testing.assert_array_equal(same.commit_step[:, 4:], out.commit_step[:, 4:])
  # Other tokens given: they are written and never re-predicted (rows may give different spans).
  other = (given[:, :6] + 1) % (MASK - 1)
  forced = _decode(params, response_prefix=(other, np.array([6, 2])))
  np.testing.assert_array_equal(forced.tokens[0, :6], other[0])
  np.testing.assert_array_equal(forced.tokens[1, :2], other[1, :2])
  assert (np.asarray(forced.commit_step[1, 2:4]) >= 0).all()
  with pytest.raises(ValueError, match="response_prefix lengths must be in"):
    _decode(params, response_prefix=(other, np.array([7, 2])))
