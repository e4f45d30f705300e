"""The one on-policy prepare (train/rollouts.py) gives what the three prepares it replaced gave.

tests/train/prepare_reference.npz holds the train batches, stats and losses of AR RL
(train/ar_rl.py), diffusion RL (train/trace_rl.py) and OPD (train/opd.py) `prepare` at commit
d57e6af, and its SFT loss, on the toy models of tests/train/toy_policy.py: recorded there by
`git show 244fc0b:tests/train/record_prepare_reference.py` (same seeds, 4 rows per call). The
unified prepare, with the same decode settings as a DecodeSpec, must reproduce the rollouts
exactly, and rewards, advantages, pi_old, the teacher's distributions and every loss to float
precision. Renamed fields: trace_lengths -> response_lengths, replay_rounds [B, S] -> Rounds(S),
token_weights -> response_weights (the train batch is a typed Batch).
"""

import functools
import os

import jax
import numpy as np
import pytest

from gr2jax.decoding.policy import ARPolicy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode
from gr2jax.train import opd, rl, rollouts, sft
from gr2jax.train.rollout import ARRollout
from tests.train.toy_policy import AR, AR_POLICY, BATCH, REWARDS, STUDENT, sft_batch

REFERENCE = os.path.join(os.path.dirname(__file__), "prepare_reference.npz")
RENAMED = {"trace_lengths": "response_lengths", "token_weights": "response_weights"}


@pytest.fixture(scope="module")
def reference():
  with np.load(REFERENCE) as f:
    return dict(f)


@pytest.fixture(scope="module")
def losses(prepared):
  ar_params, student, _ = prepared["params"]
  rl_loss = lambda policy: jax.jit(functools.partial(rl.rl_loss, rollout=policy, eps_low=0.2,
                                                     eps_high=0.2))
  return {
    "ar": rl_loss(AR_POLICY)(ar_params, prepared["ar"][0], None),
    "rl": rl_loss(STUDENT)(student, prepared["rl"][0], None),
    "opd": jax.jit(functools.partial(opd.opd_loss, rollout=STUDENT))(
      student, prepared["opd"][0], None),
    "sft": jax.jit(functools.partial(sft.sft_loss, config=AR))(ar_params, sft_batch(), None),
  }


def _fields(reference, stage):
  prefix = f"{stage}/"
  return {k[len(prefix):]: v for k, v in reference.items()
          if k.startswith(prefix) and "/" not in k[len(prefix):]}


@pytest.mark.parametrize("stage", ["ar", "rl", "opd"])
def test_same_rollouts_rewards_advantages_and_pi_old(reference, prepared, stage):
  batch, stats = prepared[stage]
  want = _fields(reference, stage)
  for name in ("loss_sum", "weight"):
    want.pop(name)
  rounds = want.pop("num_rounds", None)
  if rounds is not None:
    assert batch.replay_rounds.count == int(rounds) == 3
  assert want, stage
  for name, value in want.items():
    got = getattr(batch, RENAMED.get(name, name))
    if value.dtype.kind in "iub":
      np.testing.assert_array_equal(got, value, err_msg=f"{stage}/{name}")
    else:
      np.testing.assert_allclose(got, value, rtol=1e-5, atol=1e-6, err_msg=f"{stage}/{name}")
  prefix = f"{stage}/stats/"
  old_stats = {k[len(prefix):]: float(v) for k, v in reference.items() if k.startswith(prefix)}
  assert old_stats
  for name, value in old_stats.items():
    np.testing.assert_allclose(stats[name], value, rtol=1e-6, err_msg=f"{stage} stats {name}")


def test_the_toy_rollouts_are_not_trivial(reference):
  """Rewards vary within groups (no all-zero advantages), rollouts stop at different lengths and
  the traces commit over several steps: the comparison above covers every path."""
  assert np.ptp(reference["ar/advantages"]) > 1 and np.ptp(reference["rl/advantages"]) > 1
  assert len(set(reference["ar/response_lengths"].tolist())) > 1
  steps = reference["rl/commit_step"]
  assert steps[steps < decode.NEVER_STEP].max() == 2  # 3 rounds out of the 3 possible


@pytest.mark.parametrize("stage", ["ar", "rl", "opd", "sft"])
def test_same_losses(reference, losses, stage):
  total, weight, aux = losses[stage]
  np.testing.assert_allclose(total, reference[f"{stage}/loss_sum"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(weight, reference[f"{stage}/weight"], rtol=1e-6)
  prefix = f"{stage}/aux/"
  old_aux = {k[len(prefix):]: v for k, v in reference.items() if k.startswith(prefix)}
  assert old_aux.keys() == aux.keys()
  for name, value in old_aux.items():
    np.testing.assert_allclose(aux[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_chunked_ar_pi_old_is_the_one_call_score(prepared):
  """6 AR rollouts scored in calls of 4 rows (the last padded) = one unchunked causal scorer."""
  batch, _ = prepared["ar"]
  whole = jax.jit(lambda p, b: AR_POLICY.log_probs(p, b)[0])(prepared["params"][0], batch)
  np.testing.assert_allclose(batch.logp_old, whole, atol=1e-6)
  np.testing.assert_array_equal(batch.prompt_lengths, [5, 5, 5, 3, 3, 3])


def test_prepare_needs_a_target_and_sampled_rollouts(prepared):
  ar_params = prepared["params"][0]
  with pytest.raises(ValueError, match="reward_fn"):
    rollouts.prepare(ar_params, BATCH, jax.random.key(0), rollout=AR_POLICY, group_size=2)
  greedy = ARRollout(ARPolicy(AR, DecodeSpec(block_size=1), 10), temperature=0.0)
  with pytest.raises(ValueError, match="temperature"):
    rollouts.prepare(ar_params, BATCH, jax.random.key(0), rollout=greedy, group_size=2,
                     reward_fn=REWARDS)
