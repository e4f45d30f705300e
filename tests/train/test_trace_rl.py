"""Diffusion RL on a tiny 1-layer model (fp32, CPU): pi_old from the same replay, GRPO ratios.

Decoder shapes match tests/diffusion/test_replay.py (2 rows, prompt 6, 10 new tokens, B = 4,
temperature 1): one prompt times G = 2 rollouts.
"""

import functools

import jax
import numpy as np
import pytest

from gr2jax.diffusion import replay
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import trace_rl

MASK = 63
CONFIG = ModelConfig.tiny(
  vocab_size=64, num_layers=1, block_size=4, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0
)
BATCH = {"prompt_tokens": np.array([[5, 6, 7, 8, 9, 0]], np.int32),
         "prompt_lengths": np.array([5], np.int32), "example_mask": np.array([True]),
         "target_position": np.array([3], np.int32)}
DECODE = {"threshold": 0.03, "max_steps_per_block": 8, "max_new_tokens": 10, "temperature": 1.0}
ROUNDS = replay.rounds_needed(4, 8)


def _small_token_share(tokens, lengths, rows):
  """A toy reward: the share of token ids < 32 in the response."""
  assert rows["target_position"].tolist() == [3, 3]
  real = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
  return ((tokens < 32) & real).sum(axis=1) / lengths


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _prepare(params, reward_fn, **kw):
  return trace_rl.prepare(params, BATCH, jax.random.key(4), config=CONFIG, reward_fn=reward_fn,
                          group_size=2, num_rounds=ROUNDS, **{**DECODE, **kw})


def test_every_ratio_is_one_at_theta_old(params):
  train, stats = _prepare(params, _small_token_share)
  assert not np.array_equal(train["trace_tokens"][0], train["trace_tokens"][1])
  np.testing.assert_allclose(np.abs(train["advantages"]), 1.0, atol=1e-5)  # G = 2 z-scores
  w = train["token_weights"]
  np.testing.assert_array_equal(w.sum(axis=1), train["trace_lengths"])
  assert stats["kept_groups"] == 1.0
  loss_fn = jax.jit(functools.partial(trace_rl.trace_rl_loss, config=CONFIG, num_rounds=ROUNDS,
                                      temperature=1.0))
  loss_sum, weight, aux = loss_fn(params, train, jax.random.key(0))
  np.testing.assert_allclose(weight, w.sum())
  np.testing.assert_allclose(aux["ratio"], w.sum(), rtol=1e-6)  # sum of rho = token count
  assert float(aux["clip_frac"]) == 0.0
  want = -np.sum(train["advantages"][:, None] * w)
  np.testing.assert_allclose(loss_sum, want, atol=1e-5)
  # pi_old is the replay's, which matches what the decoder sampled from.
  np.testing.assert_allclose(train["logp_old"], train["commit_logprob"], atol=2e-5)


def test_zero_variance_group_and_constraint(params):
  train, stats = _prepare(params, lambda tokens, lengths, rows: np.ones(len(tokens)))
  assert stats["kept_groups"] == 0.0 and (train["token_weights"] == 0).all()
  with pytest.raises(ValueError, match="constraint"):
    _prepare(params, _small_token_share, constraint=object())
  with pytest.raises(ValueError, match="temperature"):
    _prepare(params, _small_token_share, temperature=0.0)


def test_chunked_prepare_gives_the_pi_old_of_one_call(params):
  """G = 3 rollouts in calls of 2 rows (the last padded): pi_old equals one unchunked replay."""
  train, _ = trace_rl.prepare(params, BATCH, jax.random.key(4), config=CONFIG,
                              reward_fn=lambda tokens, lengths, rows: np.zeros(len(lengths)),
                              group_size=3, num_rounds=ROUNDS, chunk_rows=2, **DECODE)
  assert train["logp_old"].shape == (3, 10)
  whole = trace_rl.replay_log_probs(params, train, config=CONFIG,
                                    num_rounds=train["replay_rounds"].shape[1],
                                    temperature=DECODE["temperature"])
  np.testing.assert_allclose(train["logp_old"], whole, atol=1e-6)
