"""The one on-policy prepare of AR RL, OPD and diffusion RL (host side, before the jitted step).

  rows      the batch's Bp prompts, each repeated G times (rows i*G .. i*G + G - 1)
  rollouts  policy.sample (train/policy.py): one on-policy sample per row, with its trace, in
            calls of chunk_rows rows (gr2jax/chunks.py; chunk i samples with fold_in(key, i))
  then the part a stage learns from:
  rewards   (RL) reward_fn -> group advantages (grpo.group_advantages: z-scores, zero-variance
            groups and padded prompts dropped) -> token weights (1 on each kept rollout's
            response_lengths tokens), and pi_old = policy.log_probs under the rollout params
            (one update per rollout batch, so at theta = theta_old every ratio is exactly 1,
            whatever the float differences between the cached decoder and the scorer; TraceRL
            `compute_logp_old_tok_parallel`)
  teacher   (OPD) the frozen teacher's distribution at every response token, cached in the batch

The train batch: prompt_tokens, prompt_lengths, example_mask, the rollout fields, then
rewards [B], advantages [B], token_weights [B, M], logp_old [B, M] (RL) and / or
teacher_log_probs [B, M, V] (OPD).
"""

from collections.abc import Callable

import jax
import numpy as np

from gr2jax import chunks
from gr2jax.train import grpo
from gr2jax.train.policy import Policy

# (response_tokens [B, M] (pad after the stop), response_lengths [B], the batch's fields repeated
# per rollout) -> (rewards [B] f32, stats {name: float}).
RewardFn = Callable[[np.ndarray, np.ndarray, dict], tuple[np.ndarray, dict]]
# A chunk {prompt_tokens, prompt_lengths, response_tokens, response_lengths} -> [C, M, V]
# distributions (on the device; jitted).
TeacherFn = Callable[[dict], jax.Array]


def _log_probs(policy: Policy, params: dict, batch: dict) -> jax.Array:
  return policy.log_probs(params, batch)[0]


_old_log_probs = jax.jit(_log_probs, static_argnums=0)


def prepare(params: dict, batch: dict, key: jax.Array, *, policy: Policy, group_size: int,
            reward_fn: RewardFn | None = None, teacher: TeacherFn | None = None,
            chunk_rows: int = 0, sharding=None) -> tuple[dict, dict]:
  """Rollouts -> the train batch of an on-policy stage (module docstring).

  Args:
    params: the policy's current params (they sample, and pi_old = them).
    batch: a training batch of Bp prompts (inputs.make_train_batch: prompt_tokens,
      prompt_lengths, example_mask and what reward_fn reads); its [Bp, ...] fields are repeated
      G times.
    key: the step's PRNG key.
    policy: the policy (train/policy.py); rollouts need spec.temperature > 0.
    group_size: G rollouts per prompt (paper: 8 for RL, 4 for OPD).
    reward_fn: RL: the rollouts' rewards (RewardFn).
    teacher: OPD: the teacher's distributions of a chunk (TeacherFn).
    chunk_rows: rows per sampling / scoring call (0 = all at once).
    sharding: the placement of each chunk (the batch sharding; None: numpy inputs).

  Returns:
    (the train batch with Bp * G rows, stats {'response_len', the policy's and the reward's
     stats, 'reward', 'kept_groups'}).
  """
  if reward_fn is None and teacher is None:
    raise ValueError("rollouts.prepare: give reward_fn (RL) or teacher (OPD), or both")
  if not policy.spec.temperature > 0:
    raise ValueError(f"rollouts.prepare: on-policy rollouts need DecodeSpec.temperature > 0, got "
                     f"{policy.spec.temperature}")
  bp = len(batch["prompt_tokens"])
  rows = {k: np.repeat(np.asarray(v), group_size, axis=0) for k, v in batch.items()
          if np.ndim(v) >= 1 and len(v) == bp}
  rollouts, policy_stats = policy.sample(params, rows["prompt_tokens"], rows["prompt_lengths"],
                                         key, chunk_rows=chunk_rows, sharding=sharding)
  train = {k: rows[k] for k in ("prompt_tokens", "prompt_lengths", "example_mask")}
  train.update(rollouts)
  tokens, lengths = train["response_tokens"], train["response_lengths"]
  stats = {"response_len": float(lengths.mean()), **policy_stats}
  scored = {k: train[k] for k in ("prompt_tokens", "prompt_lengths", "response_tokens",
                                   "response_lengths")}
  if teacher is not None:
    train["teacher_log_probs"] = chunks.map_row_chunks(lambda chunk, _: teacher(chunk), scored,
                                                       chunk_rows, sharding=sharding)
  if reward_fn is not None:
    rewards, reward_stats = reward_fn(tokens, lengths, rows)
    rewards = np.asarray(rewards, np.float32)
    advantages, keep = grpo.group_advantages(rewards.reshape(bp, group_size))
    keep &= np.asarray(batch["example_mask"], bool)
    weights = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    weights &= np.repeat(keep, group_size)[:, None]
    train.update(rewards=rewards, advantages=advantages.reshape(-1),
                 token_weights=weights.astype(np.float32))
    # policy.log_probs reads the prompts and what policy.sample returned; a static field
    # (replay.Rounds) goes whole to every chunk.
    sampled = {**scored, **rollouts}
    static = {k: v for k, v in sampled.items() if not jax.tree.leaves(v)}
    train["logp_old"] = chunks.map_row_chunks(
      lambda chunk, _: _old_log_probs(policy, params, {**chunk, **static}),
      {k: v for k, v in sampled.items() if k not in static}, chunk_rows, sharding=sharding)
    stats.update(reward=float(rewards.mean()), **reward_stats, kept_groups=float(keep.mean()))
  return train, stats
