"""GRPO on a policy (train/rl.py) on the toy models: ratios of 1 at theta_old for the AR and the
diffusion policy, the GR2 reward's stats, dropped groups, and pi_old from the replay."""

import functools

import jax
import numpy as np
import pytest

from gr2jax.data.batches import Batch
from gr2jax.train import rl, rollouts
from tests.train.toy_policy import AR_POLICY, BATCH, STUDENT


@pytest.mark.parametrize("stage,policy", [("ar", AR_POLICY), ("rl", STUDENT)])
def test_every_ratio_is_one_at_theta_old(prepared, stage, policy):
  train, stats = prepared[stage]
  params = prepared["params"][0 if stage == "ar" else 1]
  assert len({tuple(t) for t in train.response_tokens.tolist()}) == len(train.rewards)
  groups = train.advantages.reshape(2, 3)
  np.testing.assert_allclose(groups.mean(axis=1), 0.0, atol=1e-6)  # group z-scores
  np.testing.assert_allclose(groups.std(axis=1), 1.0, atol=1e-5)
  w = train.response_weights
  np.testing.assert_array_equal(w.sum(axis=1), train.response_lengths)
  assert stats["kept_groups"] == 1.0 and 0 < stats["valid_rate"] < 1
  assert 0 <= stats["promoted"] <= 1
  loss_fn = jax.jit(functools.partial(rl.rl_loss, rollout=policy, eps_low=0.2, eps_high=0.2))
  loss_sum, weight, aux = loss_fn(params, train, jax.random.key(0))
  np.testing.assert_allclose(weight, w.sum())
  np.testing.assert_allclose(aux["ratio"], w.sum(), rtol=1e-6)  # sum of rho = token count
  assert float(aux["clip_frac"]) == 0.0
  np.testing.assert_allclose(loss_sum, -np.sum(train.advantages[:, None] * w), atol=1e-5)


def test_diffusion_pi_old_is_the_replay_of_what_the_decoder_sampled(prepared):
  """logp_old, replayed in calls of 4 rows (the last padded), equals one unchunked replay and
  the decoder's own record of the committed tokens' log-probs."""
  train, stats = prepared["rl"]
  whole = jax.jit(lambda p, b: STUDENT.log_probs(p, b)[0])(prepared["params"][1], train)
  np.testing.assert_allclose(train.logp_old, whole, atol=1e-6)
  np.testing.assert_allclose(train.logp_old, train.commit_logprob, atol=2e-5)
  assert stats["forwards_per_token"] > 0


def test_zero_variance_groups_are_dropped(prepared):
  constant = lambda batch: (np.ones(batch.num_rows), {})
  train, stats = rollouts.prepare(prepared["params"][1], BATCH, jax.random.key(4),
                                  rollout=STUDENT, group_size=3, reward_fn=constant, chunk_rows=4)
  assert stats["kept_groups"] == 0.0 and (train.response_weights == 0).all()
  np.testing.assert_array_equal(train.advantages, 0.0)


def test_answer_rewards_reads_each_rollouts_example():
  """Rows of two examples with their own labels and targets: one valid answer each."""
  class Tokenizer:
    def decode(self, ids, skip_special_tokens=False):
      return '</think>{"ranking":["b","a"]}' if ids[0] == 1 else '</think>{"ranking":["y","x"]}'

  reward_fn = rl.answer_rewards(Tokenizer(), {3: ("a", "b"), 7: ("x", "y")}, (9,), alpha=0.2)
  rows = Batch(response_tokens=np.array([[1, 9], [5, 9]]), response_lengths=np.array([2, 2]),
               example_index=np.array([3, 7]), target_position=np.array([1, 0]))
  rewards, stats = reward_fn(rows)
  assert rl.COMPONENTS == ("rank", "valid", "speed")
  np.testing.assert_allclose(rewards[:, 0], [0.5 + 0.2, -0.5])  # target promoted / demoted
  np.testing.assert_allclose(rewards[:, 1:], 1.0)  # valid; an AR row: one forward per token
  assert stats == {"valid_rate": 1.0, "promoted": 1.0, "tokens_per_forward": 1.0}
  rows = rows.replace(forwards=np.array([1, 2]))  # a diffusion rollout's forwards per row
  rewards, stats = reward_fn(rows)
  np.testing.assert_allclose(rewards[:, 2], [2.0, 1.0])
  assert stats["tokens_per_forward"] == 4 / 3
