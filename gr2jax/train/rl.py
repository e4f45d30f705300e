"""GRPO on a policy: AR RL of the GR2 teacher and TraceRL-style diffusion RL, one objective.

GR2 (arXiv 2602.07774) and Diffusion-GR2 (arXiv 2607.01170) RL, TraceRL (Gen-Verse dLLM-RL):

  J = E[ (1 / sum_i |o_i|) sum_i sum_t min(rho_it A_i, clip(rho_it, 1 - eps_lo, 1 + eps_hi) A_i) ]

  - Rollouts, rewards, advantages and pi_old: train/rollouts.py `prepare` with `answer_rewards`
    (GR2's R_rank + alpha R_fmt, gr2jax/train/rewards.py: an invalid, truncated or overflowing
    output gets -1 and stays in its group; beside it, weighted by rl.valid_weight and
    rl.speed_weight and each z-scored on its own, R_valid and R_speed = tokens per forward of a
    valid rollout: RL aimed at the fast decode, LightningRL arXiv 2603.13319), G rollouts per
    prompt at the stage's
    rl.temperature > 0 (the rollout's temperature, train/stages.py).
  - rho_it = exp(clip(log pi_theta - log pi_old, -10, 10)) per response token, both log-probs
    from the SAME `rollout.log_probs` (train/rollout.py): for an AR policy the causal scorer over
    [prompt | response], for a diffusion policy the differentiable replay of the trace
    (gr2jax/diffusion/replay.py), each token in the context the decoder committed it in.
    Log-probs are commit.token_log_probs at the sampling temperature: the distribution the
    sampler drew from.
  - The objective is `grpo.policy_loss` (the sum over tokens and the token count, so the step
    normalises by the total tokens of the kept groups). No KL term (the paper's objective has
    none).
  - Diffusion rollouts are never decoded with the answer constraint (gr2jax/diffusion/
    constrain.py; DiffusionRollout does not take one): the replay scores the unconstrained policy.
  - Optional replay step shrinkage (replay.py: `shrink` adjacent steps of a block merged into one
    round) is an approximation: fewer rounds, but a token's replayed context hides the tokens
    committed earlier in its merged round. pi_old uses the same shrink, so rho = 1 at theta_old
    still holds.
"""

import jax
import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.train import grpo, rewards
from gr2jax.train.rollout import Rollout
from gr2jax.train.rollouts import RewardFn


def answer_rewards(tokenizer, labels, stop_token_ids: tuple[int, ...], *,
                   alpha: float) -> RewardFn:
  """The GR2 reward of a data build and the fast-decode rewards, as a rollouts.RewardFn.

  Args:
    tokenizer: the data build's tokenizer.
    labels: example index -> that example's candidate label strings (SplitData.labels).
    stop_token_ids: the ids that end a response (the model's eos ids).
    alpha: the conditional format-reward weight (paper: 0.2).

  Returns:
    reward_fn(batch) -> (rewards [B, 3] = the columns of COMPONENTS, {'valid_rate', 'promoted',
    'tokens_per_forward'}) of the rollouts' Batch (response_tokens, response_lengths,
    example_index, target_position, and a diffusion rollout's forwards; an AR rollout takes one
    forward per token); 'promoted' = the share of rollouts that put another candidate than D's
    first on top. `reward_weights` weighs the columns.
  """
  def reward_fn(batch: Batch):
    row_labels = [labels[int(i)] for i in batch.example_index]
    reward, valid, results = rewards.rollout_rewards(
      tokenizer, batch.response_tokens, batch.response_lengths, row_labels,
      np.asarray(batch.target_position), stop_token_ids, alpha=alpha)
    lengths = np.asarray(batch.response_lengths)
    forwards = lengths if batch.forwards is None else np.asarray(batch.forwards)
    speed = rewards.speed_rewards(forwards, lengths, valid)
    stats = {"valid_rate": float(valid.mean()),
             "promoted": float(np.mean([r.ranking[0] != 0 for r in results])),
             "tokens_per_forward": float(lengths.sum() / max(int(forwards.sum()), 1))}
    return np.stack([reward, valid.astype(np.float32), speed], axis=1), stats

  return reward_fn


# The columns of answer_rewards' rewards: GR2's R (rank + conditional format, -1 if invalid),
# R_valid and R_speed (gr2jax/train/rewards.py).
COMPONENTS = ("rank", "valid", "speed")


def reward_weights(valid_weight: float, speed_weight: float) -> tuple[float, float, float]:
  """The weights of COMPONENTS in the advantage (grpo.group_advantages): GR2's R at 1, the
  fast-decode rewards at rl.valid_weight / rl.speed_weight (0 = GR2's reward alone)."""
  return 1.0, float(valid_weight), float(speed_weight)


def fields(rollout: Rollout) -> tuple[str, ...]:
  """The Batch fields rl_loss reads: the rollout's (its log_probs' `fields`), logp_old,
  advantages, response_weights."""
  return rollout.fields + ("logp_old", "advantages", "response_weights")


def rl_loss(params: dict, batch: Batch, key: jax.Array, *, rollout: Rollout, eps_low: float,
            eps_high: float):
  """GRPO on prepared rollouts (train-step contract; module docstring).

  Args:
    params: the policy's params (theta).
    batch: from rollouts.prepare with a reward_fn (`fields`): the policy's fields, logp_old
      [B, M], advantages [B], response_weights [B, M] (1 on the kept rollouts' tokens).
    key: unused (the rollouts are in the batch).
    rollout: the rollout that sampled them (train/rollout.py).
    eps_low: lower clip range.
    eps_high: upper clip range.

  Returns:
    grpo.policy_loss's (loss_sum, token count, aux sums).
  """
  del key
  logp, _ = rollout.log_probs(params, batch)
  return grpo.policy_loss(logp, batch.logp_old, batch.advantages, batch.response_weights,
                          eps_low=eps_low, eps_high=eps_high)
