"""The one on-policy prepare of AR RL, OPD and diffusion RL (host side, before the jitted step).

  rows      the batch's Bp prompts, each repeated G times (rows i*G .. i*G + G - 1)
  rollouts  rollout.sample (a train/rollout.py Rollout): one on-policy sample per row, with its
            trace, in calls of chunk_rows rows (gr2jax/chunks.py; chunk i samples with
            fold_in(key, i))
  then the part a stage learns from:
  rewards   (RL) reward_fn -> group advantages (grpo.group_advantages: z-scores, each reward
            component on its own, weighed by reward_weights; zero-variance groups and padded
            prompts dropped) -> response_weights (1 on each kept rollout's
            response_lengths tokens), and pi_old = rollout.log_probs under the rollout params
            (one update per rollout batch, so at theta = theta_old every ratio is exactly 1,
            whatever the float differences between the cached decoder and the scorer; TraceRL
            `compute_logp_old_tok_parallel`)
  teacher   (OPD) the frozen teacher's distribution at every response token, cached in the batch

The train batch is the same Batch (gr2jax/data/batches.py) with Bp * G rows: the rows' fields
repeated (the teacher's response dropped), the policy's rollout fields, then rewards,
advantages, response_weights and logp_old (RL) and / or teacher_log_probs (OPD). A rollout's
`fields` name what its log_probs reads of it.
"""

from collections.abc import Callable

import jax
import numpy as np

from gr2jax import chunks
from gr2jax.data.batches import Batch
from gr2jax.train import grpo
from gr2jax.train.rollout import SCORED_FIELDS, Rollout

# The rollouts' Batch (response_tokens [B, M] pad after the stop, response_lengths [B], the
# rows' example_index / target_position, a diffusion rollout's forwards) -> (rewards [B] f32, or
# [B, K] f32 with K components weighed by prepare's reward_weights, stats {name: float}).
RewardFn = Callable[[Batch], tuple[np.ndarray, dict]]
# A chunk of the rollouts' Batch (SCORED_FIELDS) -> [C, M, V] distributions (on the device;
# jitted).
TeacherFn = Callable[[Batch], jax.Array]


def _log_probs(rollout: Rollout, params: dict, batch: Batch) -> jax.Array:
  return rollout.log_probs(params, batch)[0]


_old_log_probs = jax.jit(_log_probs, static_argnums=0)


def prepare(params: dict, batch: Batch, key: jax.Array, *, rollout: Rollout, group_size: int,
            reward_fn: RewardFn | None = None, reward_weights: tuple[float, ...] | None = None,
            teacher: TeacherFn | None = None, chunk_rows: int = 0,
            sharding=None) -> tuple[Batch, dict]:
  """Rollouts -> the train batch of an on-policy stage (module docstring).

  Args:
    params: the policy's current params (they sample, and pi_old = them).
    batch: a training batch of Bp prompts (inputs.make_batch: prompt_tokens, prompt_lengths,
      example_mask and what reward_fn reads); its row fields are repeated G times.
    key: the step's PRNG key.
    rollout: the trained policy's rollout (train/rollout.py); it needs a temperature > 0.
    group_size: G rollouts per prompt (paper: 8 for RL, 4 for OPD).
    reward_fn: RL: the rollouts' rewards (RewardFn).
    reward_weights: RL: the weight of each of reward_fn's components, one per column (None:
      the first column alone, at weight 1).
    teacher: OPD: the teacher's distributions of a chunk (TeacherFn).
    chunk_rows: rows per sampling / scoring call (0 = all at once).
    sharding: the placement of each chunk (the batch sharding; None: numpy inputs).

  Returns:
    (the train Batch with Bp * G rows, stats {'response_len', the policy's and the reward's
     stats, 'reward' (the first component's mean), 'kept_groups'}).
  """
  if reward_fn is None and teacher is None:
    raise ValueError("rollouts.prepare: give reward_fn (RL) or teacher (OPD), or both")
  if not rollout.temperature > 0:
    raise ValueError("rollouts.prepare: on-policy rollouts need a sampling temperature > 0 "
                     "(OPD: opd.temperature, AR RL / RL: rl.temperature), got "
                     f"{rollout.temperature}")
  bp = batch.num_rows
  prompts = batch.replace(response_tokens=None, response_lengths=None, response_weights=None)
  rows = jax.tree.map(lambda x: np.repeat(np.asarray(x), group_size, axis=0), prompts)
  rollouts, policy_stats = rollout.sample(params, rows.prompt_tokens, rows.prompt_lengths, key,
                                         chunk_rows=chunk_rows, sharding=sharding)
  train = rows.replace(**rollouts)
  tokens, lengths = train.response_tokens, train.response_lengths
  stats = {"response_len": float(lengths.mean()), **policy_stats}
  if teacher is not None:
    train = train.replace(teacher_log_probs=chunks.map_row_chunks(
      lambda chunk, _: teacher(chunk), train.select(SCORED_FIELDS), chunk_rows,
      sharding=sharding))
  if reward_fn is not None:
    rewards, reward_stats = reward_fn(train)
    rewards = np.asarray(rewards, np.float32).reshape(bp * group_size, -1)
    if reward_weights is None:
      reward_weights = (1.0,) + (0.0,) * (rewards.shape[1] - 1)
    advantages, keep = grpo.group_advantages(rewards.reshape(bp, group_size, -1),
                                             reward_weights)
    rewards = rewards[:, 0]
    keep &= np.asarray(batch.example_mask, bool)
    weights = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    weights &= np.repeat(keep, group_size)[:, None]
    train = train.replace(rewards=rewards, advantages=advantages.reshape(-1),
                          response_weights=weights.astype(np.float32))
    # pi_old: rollout.log_probs on what it reads (a static replay.Rounds goes whole to every
    # chunk).
    train = train.replace(logp_old=chunks.map_row_chunks(
      lambda chunk, _: _old_log_probs(rollout, params, chunk), train.select(rollout.fields),
      chunk_rows, sharding=sharding))
    stats.update(reward=float(rewards.mean()), **reward_stats, kept_groups=float(keep.mean()))
  return train, stats
