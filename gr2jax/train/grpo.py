"""Group-relative policy optimisation (GRPO/DAPO), shared by AR RL and trace-replay diffusion RL.

  A_i   = (R_i - mean_g R) / std_g R         group z-score, no value model (Diffusion-GR2 §RL);
          with several rewards, sum_k w_k z_k(R_k): each z-scored on its own (LightningRL)
  rho_t = exp(clip(log pi_theta - log pi_old, -10, 10))                      (TraceRL's clamp)
  J     = (1 / sum_i |o_i|) sum_i sum_t min(rho_t A_i, clip(rho_t, 1 - eps_low, 1 + eps_high) A_i)

GR2 (arXiv 2602.07774; DAPO: token-level normalisation, clip-higher) and Diffusion-GR2 (arXiv
2607.01170) RL (G = 8, symmetric eps = 0.2, zero-variance groups dropped). The loss follows the
train step's contract:
it returns the *sum* of per-token terms and the token count, and the step divides once after
micro-batches and hosts, so the normalisation is by the total tokens of the kept groups.
"""

import jax
import jax.numpy as jnp
import numpy as np

LOG_RATIO_CLIP = 10.0


def group_advantages(rewards: np.ndarray,
                     weights: tuple[float, ...] = (1.0,)) -> tuple[np.ndarray, np.ndarray]:
  """Group-normalised advantages of one reward or of several, each normalised on its own.

  A_i = sum_k w_k (R_ik - mean_g R_k) / std_g R_k: each component is z-scored inside its group
  apart from the others (LightningRL, arXiv 2603.13319: the larger-scale reward does not swamp
  the other), and a component whose rollouts all agree in a group adds 0 there. A group in which
  no weighted component has spread gives no gradient (dropped; Diffusion-GR2's zero-variance
  groups). With one component this is the plain GRPO z-score.

  Args:
    rewards: [P, G] rewards of G rollouts for each of P prompts, or [P, G, K] with K components.
    weights: [K] each component's weight (>= 0; a 0-weight component neither moves nor keeps a
      group).

  Returns:
    (advantages [P, G] f32, 0 in dropped groups; keep [P] bool, False where no weighted
     component has std > 0).
  """
  rewards = np.asarray(rewards, np.float64)
  if rewards.ndim == 2:
    rewards = rewards[..., None]
  if rewards.ndim != 3 or rewards.shape[1] < 2:
    raise ValueError(f"group_advantages: rewards {rewards.shape} must be [P, G] or [P, G, K] "
                     "with G >= 2")
  weights = np.asarray(weights, np.float64)
  if weights.shape != rewards.shape[2:] or not np.all(np.isfinite(weights) & (weights >= 0)):
    raise ValueError(f"group_advantages: weights {weights.tolist()} must be {rewards.shape[2]} "
                     "finite values >= 0, one per reward component")
  mean = rewards.mean(axis=1, keepdims=True)
  std = rewards.std(axis=1, keepdims=True)
  spread = std > 1e-8  # [P, 1, K]
  z = np.where(spread, (rewards - mean) / np.where(spread, std, 1.0), 0.0)
  keep = np.any(spread[:, 0, :] & (weights > 0), axis=1)
  adv = np.where(keep[:, None], np.sum(z * weights, axis=2), 0.0)
  return adv.astype(np.float32), keep


def policy_loss(logp: jax.Array, logp_old: jax.Array, advantages: jax.Array,
                token_weights: jax.Array, *, eps_low: float = 0.2, eps_high: float = 0.2):
  """The clipped surrogate as (loss_sum, token_count, aux sums); the train step divides once.

  Args:
    logp: [B, M] f32 log-probs of the sampled tokens under the current policy.
    logp_old: [B, M] f32 the same under the policy that sampled them (constant).
    advantages: [B] f32 per-rollout advantage.
    token_weights: [B, M] f32, 1 on the rollout's scored tokens (0 on padding, dropped groups).
    eps_low: lower clip range (ratio >= 1 - eps_low).
    eps_high: upper clip range (ratio <= 1 + eps_high; > eps_low is DAPO's clip-higher).

  Returns:
    (loss_sum f32[] = -sum_t w_t min(rho A, clip(rho) A), weight f32[] = sum_t w_t,
     aux {'ratio', 'clip_frac', 'approx_kl'}: sums over weighted tokens).
  """
  log_ratio = jnp.clip(logp - jax.lax.stop_gradient(logp_old), -LOG_RATIO_CLIP, LOG_RATIO_CLIP)
  ratio = jnp.exp(log_ratio)
  adv = advantages[:, None]
  unclipped = ratio * adv
  clipped = jnp.clip(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv
  surrogate = jnp.minimum(unclipped, clipped)
  w = token_weights.astype(jnp.float32)
  aux = {
    "ratio": jnp.sum(ratio * w),
    "clip_frac": jnp.sum((clipped < unclipped) * w),
    "approx_kl": jnp.sum((ratio - 1.0 - log_ratio) * w),  # k3 estimator of KL(old || new)
  }
  return -jnp.sum(surrogate * w), jnp.sum(w), aux
