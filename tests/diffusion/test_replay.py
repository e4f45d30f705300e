"""Differentiable trace replay vs the decoder's recorded log-probs (tiny 1-layer model, CPU).

Shapes are shared with tests/train/test_opd.py (batch 2, prompt 6, 10 new tokens, B = 4) so the
decoder compiles once per temperature across the suite.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.diffusion import decode, replay
from gr2jax.model import attention
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from tests.diffusion import helpers

MASK = 63
CONFIG = ModelConfig.tiny(
  vocab_size=64, num_layers=1, block_size=4, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0
)
PROMPTS = jnp.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], jnp.int32)
LENGTHS = jnp.array([5, 3], jnp.int32)
MAX_NEW, STEPS = 10, 8
ROUNDS = replay.rounds_needed(CONFIG.block_size, STEPS)


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _decode(params, threshold, temperature=0.0, stop=()):
  return helpers.generate(
    params, CONFIG, PROMPTS, LENGTHS, threshold=threshold, max_steps_per_block=STEPS,
    max_new_tokens=MAX_NEW, temperature=temperature, key=jax.random.key(5), stop_token_ids=stop,
  )


def _stopped_mid_block(params, threshold, temperature):
  """A decode whose row 0 stops at its response index 5 (block 1, offset 1)."""
  free = _decode(params, threshold, temperature)
  stop = int(free.tokens[0, 5])
  out = _decode(params, threshold, temperature, stop=(stop,))
  n = int(out.lengths[0])
  assert n <= 6 and n % CONFIG.block_size != 0 and n < MAX_NEW
  return out


@pytest.mark.parametrize(
  ("threshold", "temperature"), [(0.9, 0.0), (0.03, 0.0), (0.03, 1.0)]
)
def test_replay_equals_recorded_log_probs(params, threshold, temperature):
  out = _stopped_mid_block(params, threshold, temperature)
  steps = np.asarray(out.commit_step)
  assert (steps[:, 0] == decode.SEED_STEP).all() and steps[steps >= 0].max() >= 1
  lp = helpers.replay_log_probs(
    params, CONFIG, PROMPTS, LENGTHS, out, temperature=temperature, num_rounds=ROUNDS
  )
  np.testing.assert_allclose(lp, out.commit_logprob, atol=2e-5)
  committed = steps != decode.NEVER_STEP
  assert (np.asarray(lp)[committed] < 0).all() and (np.asarray(lp)[~committed] == 0).all()


def test_replay_is_differentiable(params):
  out = _decode(params, 0.03)
  replay.check_rounds(out.commit_step, ROUNDS)

  def total(p):
    res = replay.replay(
      p, CONFIG, helpers.trace(PROMPTS, LENGTHS, out),
      num_rounds=ROUNDS, return_log_probs=True,
    )
    return jnp.sum(res.logp), res

  grads, res = jax.jit(jax.grad(total, has_aux=True))(params)
  assert res.log_probs.shape == (2, MAX_NEW, CONFIG.vocab_size)
  chosen = jnp.take_along_axis(res.log_probs, out.trace_tokens[..., None], -1)[..., 0]
  committed = out.commit_step < decode.NEVER_STEP
  np.testing.assert_allclose(jnp.where(committed, chosen, 0), res.logp, atol=1e-6)
  np.testing.assert_allclose(res.logp, out.commit_logprob, atol=2e-5)
  norms = jax.tree.map(lambda g: float(jnp.linalg.norm(g)), grads)
  assert all(np.isfinite(v) for v in jax.tree.leaves(norms))
  assert norms["embed"] > 0 and norms["layers"]["q"] > 0 and norms["lm_head"] > 0


def test_replay_per_noisy_block_equals_the_dense_mask(params, monkeypatch):
  """The replay's attention per noisy block (attention.two_stream, the default) gives the dense
  mask's log-probs, distributions and gradients; both equal the decoder's log-probs."""
  out = _decode(params, 0.03, 1.0)

  def run():  # traced afresh: picks up the attention path
    def total(p):
      res = replay.replay(
        p, CONFIG, helpers.trace(PROMPTS, LENGTHS, out),
        num_rounds=ROUNDS, temperature=1.0, return_log_probs=True,
      )
      return jnp.sum(res.logp), res

    return jax.jit(jax.grad(total, has_aux=True))(params)

  grads, res = run()
  monkeypatch.setattr(attention, "STRUCTURED_TWO_STREAM", False)
  dense_grads, dense = run()
  np.testing.assert_allclose(res.logp, dense.logp, atol=1e-5)
  np.testing.assert_allclose(res.log_probs, dense.log_probs, atol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), grads, dense_grads)
  for logp in (res.logp, dense.logp):
    np.testing.assert_allclose(logp, out.commit_logprob, atol=2e-5)


@pytest.mark.slow  # one more replay compile (the optional shrinkage)
def test_shrink_merges_rounds(params):
  out = _decode(params, 0.9)
  steps = np.asarray(out.commit_step)
  exact = helpers.replay_log_probs(params, CONFIG, PROMPTS, LENGTHS, out, num_rounds=ROUNDS)
  merged = helpers.replay_log_probs(params, CONFIG, PROMPTS, LENGTHS, out, shrink=2)
  # Steps 0 and 1 share round 0: step-0 tokens and seeds keep their context, step-1 tokens lose
  # the view of step-0 tokens (the documented approximation).
  keep = steps <= 0
  np.testing.assert_allclose(merged[keep], exact[keep], atol=2e-5)
  assert not np.allclose(merged[steps == 1], exact[steps == 1], atol=1e-4)
  assert replay.rounds_needed(4, STEPS, shrink=2) == 2 and replay.rounds_needed(1, STEPS) == 0
  with pytest.raises(ValueError, match="num_rounds"):
    replay.check_rounds(out.commit_step, 1)


def test_block_size_conflict_is_an_error(params):
  out = _decode(params, 0.9)
  with pytest.raises(ValueError, match="block_size"):
    helpers.replay_log_probs(params, CONFIG, PROMPTS, LENGTHS, out, block_size=8)
  with pytest.raises(ValueError, match="block_size"):
    helpers.replay_log_probs(
      params, dataclasses.replace(CONFIG, block_size=2), PROMPTS, LENGTHS, out, block_size=4
    )
