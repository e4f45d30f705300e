"""Group-relative policy optimisation (GRPO/DAPO), shared by AR RL and trace-replay diffusion RL.

  A_i   = (R_i - mean_g R) / std_g R         group z-score, no value model (Diffusion-GR2 §RL)
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


def group_advantages(rewards: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Group-normalised advantages; groups whose rewards all agree are dropped.

  Args:
    rewards: [P, G] rewards of G rollouts for each of P prompts.

  Returns:
    (advantages [P, G] f32, 0 in dropped groups; keep [P] bool, False where std = 0).
  """
  rewards = np.asarray(rewards, np.float64)
  if rewards.ndim != 2 or rewards.shape[1] < 2:
    raise ValueError(f"group_advantages: rewards {rewards.shape} must be [P, G] with G >= 2")
  mean = rewards.mean(axis=1, keepdims=True)
  std = rewards.std(axis=1, keepdims=True)
  keep = std[:, 0] > 1e-8
  adv = np.where(keep[:, None], (rewards - mean) / np.where(keep[:, None], std, 1.0), 0.0)
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
