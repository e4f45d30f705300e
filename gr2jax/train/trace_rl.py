"""Diffusion RL: TraceRL-style trajectory replay + the shared GRPO objective.

research/papers.md §2 RL and §4 (TraceRL):

  J = E[ (1 / sum_i |o_i|) sum_i sum_t min(rho_it A_i, clip(rho_it, 1 - eps, 1 + eps) A_i) ]

  - Rollouts (`prepare`, host side): G trajectories per prompt from the policy's own decoder
    (`replay.sample_traces`, temperature > 0) with their step maps; rewards from a caller-given
    `reward_fn` (the stage binds GR2's R_rank + alpha R_fmt, gr2jax/train/rewards.py: an invalid
    output gets -1 and stays in its group); advantages and the zero-variance-group filter from
    `grpo.group_advantages`.
  - rho_it = exp(clip(log pi_theta - log pi_old, -10, 10)) per committed token, where both
    log-probs come from the SAME differentiable replay (gr2jax/diffusion/replay.py): log pi_old
    is recomputed in `prepare` under the rollout params theta_old, not taken from the decoder's
    recorded log-probs (TraceRL `compute_logp_old_tok_parallel`), so at theta = theta_old every
    ratio is exactly 1 whatever the float differences between the cached decoder and the
    cache-free replay.
  - The objective is `grpo.policy_loss` (one GRPO for AR and diffusion RL): the sum over tokens
    and the token count, so the step normalises by the total tokens of the kept groups. No KL
    term (the paper's objective has none).
  - Rollouts decoded with the answer constraint (gr2jax/diffusion/constrain.py) are refused: the
    replay scores the unconstrained policy, so the ratio would not be the sampler's.
  - Optional step shrinkage (replay.py: merging `shrink` adjacent steps of a block into one
    round) is an approximation: fewer replay rounds, but a token's replayed context hides the
    tokens committed earlier in its merged round. logp_old uses the same shrink, so rho = 1 at
    theta_old still holds.
"""

from collections.abc import Callable

import jax
import numpy as np

from gr2jax import chunks
from gr2jax.diffusion import replay
from gr2jax.model.config import ModelConfig
from gr2jax.train import grpo

# (response tokens [B, M] (pad after the stop), lengths [B], the batch rows repeated per rollout)
# -> rewards [B] f32.
RewardFn = Callable[[np.ndarray, np.ndarray, dict], np.ndarray]


def replay_log_probs(params: dict, batch: dict, *, config: ModelConfig, num_rounds: int,
                     temperature: float, shrink: int = 1):
  """[B, M] log-probs of the batch's trace tokens in their replayed decoding contexts."""
  return replay.replay(
    params, config, batch["prompt_tokens"], batch["prompt_lengths"], batch["trace_tokens"],
    batch["commit_step"], batch["trace_lengths"], num_rounds=num_rounds,
    temperature=temperature, shrink=shrink,
  ).logp


_old_log_probs = jax.jit(
  replay_log_probs, static_argnames=("config", "num_rounds", "temperature", "shrink")
)


def trace_rl_loss(
  params: dict,
  batch: dict,
  key: jax.Array,
  *,
  config: ModelConfig,
  temperature: float,
  num_rounds: int | None = None,
  shrink: int = 1,
  eps_low: float = 0.2,
  eps_high: float = 0.2,
):
  """GRPO on replayed trajectories (train-step contract; module docstring).

  Args:
    params: the policy's params (theta).
    batch: from `prepare`: prompt_tokens [B, P], prompt_lengths [B], trace_tokens [B, M],
      commit_step [B, M], trace_lengths [B], logp_old [B, M], advantages [B],
      token_weights [B, M].
    key: unused.
    config: the model.
    temperature: the rollout temperature (log-probs of the distribution sampled from).
    num_rounds: the replay's static round count; None = the width of batch['replay_rounds']
      (set by `prepare`: the rounds this batch needs, replay.round_bucket).
    shrink: replay step shrinkage (as in `prepare`).
    eps_low: lower clip range.
    eps_high: upper clip range.

  Returns:
    grpo.policy_loss's (loss_sum, token count, aux sums).
  """
  del key
  if num_rounds is None:
    num_rounds = batch["replay_rounds"].shape[1]
  logp = replay_log_probs(params, batch, config=config, num_rounds=num_rounds,
                          temperature=temperature, shrink=shrink)
  return grpo.policy_loss(logp, batch["logp_old"], batch["advantages"], batch["token_weights"],
                          eps_low=eps_low, eps_high=eps_high)


def prepare(
  params: dict,
  batch: dict,
  key: jax.Array,
  *,
  config: ModelConfig,
  reward_fn: RewardFn,
  group_size: int,
  threshold: float,
  max_steps_per_block: int,
  max_new_tokens: int,
  temperature: float,
  num_rounds: int,
  shrink: int = 1,
  constraint=None,
  chunk_rows: int = 0,
  sharding=None,
) -> tuple[dict, dict]:
  """Rollouts -> rewards -> advantages -> pi_old: the diffusion RL train batch (host side).

  Args:
    params: the current params (they sample, and pi_old = them).
    batch: a training batch of Bp prompts (prompt_tokens, prompt_lengths, example_mask and
      whatever reward_fn reads, e.g. target_position); every [Bp, ...] field is repeated G times.
    key: the step's PRNG key.
    config: the model (config.block_size is the decode block size).
    reward_fn: RewardFn (module docstring).
    group_size: G rollouts per prompt (paper: 8).
    threshold, max_steps_per_block, max_new_tokens, temperature: the decoder's settings
      (temperature > 0).
    num_rounds: the replay's static round count (replay.rounds_needed).
    shrink: replay step shrinkage (1 = exact).
    constraint: must be None: constrained rollouts are refused (module docstring).
    chunk_rows: rows per rollout / pi_old call (gr2jax/chunks.py; 0 = all at once).
    sharding: the placement of each chunk (the batch sharding; None: numpy inputs).

  Returns:
    (the train batch with Bp * G rows, see trace_rl_loss, plus rewards [B]; rollout stats
     {'reward', 'kept_groups', 'response_len', 'forwards_per_token'}).
  """
  if constraint is not None:
    raise ValueError(
      "trace_rl.prepare: rollouts decoded with the answer constraint are refused (the replay "
      "scores the unconstrained policy, so the importance ratio would be wrong)"
    )
  bp = len(batch["prompt_tokens"])
  keys = [k for k, v in batch.items() if np.ndim(v) >= 1 and len(v) == bp]
  rows = replay.repeat_rows(batch, group_size, keys)
  traces, stats = replay.sample_traces(
    params, config, rows["prompt_tokens"], rows["prompt_lengths"], key, threshold=threshold,
    max_steps_per_block=max_steps_per_block, max_new_tokens=max_new_tokens,
    temperature=temperature, num_rounds=num_rounds, shrink=shrink, chunk_rows=chunk_rows,
    sharding=sharding,
  )
  rewards = np.asarray(
    reward_fn(traces["response_tokens"], traces["trace_lengths"], rows), np.float32
  )
  advantages, keep = grpo.group_advantages(rewards.reshape(bp, group_size))
  keep &= np.asarray(batch["example_mask"], bool)
  m = traces["trace_tokens"].shape[1]
  weights = np.arange(m)[None, :] < traces["trace_lengths"][:, None]
  weights = (weights & np.repeat(keep, group_size)[:, None]).astype(np.float32)
  train = {
    "prompt_tokens": rows["prompt_tokens"], "prompt_lengths": rows["prompt_lengths"],
    "example_mask": rows["example_mask"], **traces, "rewards": rewards,
    "advantages": advantages.reshape(-1), "token_weights": weights,
  }
  replayed = {k: train[k] for k in ("prompt_tokens", "prompt_lengths", "trace_tokens",
                                     "commit_step", "trace_lengths")}
  train["logp_old"] = chunks.map_row_chunks(
    lambda chunk, _: _old_log_probs(params, chunk, config=config,
                                    num_rounds=train["replay_rounds"].shape[1],
                                    temperature=float(temperature), shrink=shrink),
    replayed, chunk_rows, sharding=sharding)
  stats = {**stats, "reward": float(rewards.mean()), "kept_groups": float(keep.mean())}
  return train, stats

