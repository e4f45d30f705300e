"""GR2 reward on hand cases: promotion, demotion, kept top-1, target moved off top-1, invalid."""

import numpy as np
import pytest

from gr2jax.train import rewards

N = 10


def _reward(ranking, target, valid=True):
  return float(rewards.rank_rewards(np.asarray([ranking]), np.asarray([valid]),
                                    np.asarray([target]), alpha=0.2)[0])


def test_promotion_pays_rank_gain_plus_format():
  ranking = [3] + [s for s in range(N) if s != 3]  # target at slot 3 (rank 4) moved to rank 1
  assert _reward(ranking, 3) == pytest.approx(0.3 + 0.2)


def test_demotion_pays_no_format_reward():
  ranking = [s for s in range(N) if s != 3]
  ranking.insert(6, 3)  # rank 4 -> rank 7
  assert _reward(ranking, 3) == pytest.approx(-0.3)


def test_kept_top1_earns_format_only():
  assert _reward(list(range(N)), 0) == pytest.approx(0.2)


def test_copying_d_earns_nothing_when_target_not_first():
  assert _reward(list(range(N)), 4) == pytest.approx(0.0)


def test_target_moved_off_top1():
  ranking = [1, 0] + list(range(2, N))
  assert _reward(ranking, 0) == pytest.approx(-0.1)


@pytest.mark.parametrize("kind", ["malformed_json", "duplicate", "omitted", "out_of_set",
                                  "truncated", "overflow"])
def test_every_invalid_kind_gets_minus_one(kind):
  # The parser falls back to D's order for every invalid kind; validity decides the reward.
  del kind
  assert _reward(list(range(N)), 0, valid=False) == -1.0
  assert _reward([3] + [s for s in range(N) if s != 3], 3, valid=False) == -1.0


def test_shapes_are_checked():
  with pytest.raises(ValueError, match="batch size"):
    rewards.rank_rewards(np.zeros((2, N), int), np.ones(3, bool), np.zeros(2, int))


def test_speed_reward_is_a_valid_rollouts_tokens_per_forward():
  speed = rewards.speed_rewards(np.array([4, 8, 0, 8]), np.array([8, 8, 0, 16]),
                                np.array([True, True, True, False]))
  np.testing.assert_allclose(speed, [2.0, 1.0, 0.0, 0.0])  # an invalid rollout earns no speed
  with pytest.raises(ValueError, match="speed_rewards"):
    rewards.speed_rewards(np.array([1, 2]), np.array([1]), np.array([True, True]))
