"""The optimiser: AdamW with linear warm-up then cosine or constant, global-norm clipping.

No weight decay on norm scales. Moments are kept in fp32 whatever the param dtype: the train step
updates an fp32 view of the params and casts back (bf16 params, fp32 moments).
"""

import jax
import optax

from gr2jax.stage_registry import OptimizerSettings


def learning_rate_schedule(cfg: OptimizerSettings) -> optax.Schedule:
  """Linear warm-up from 0 to cfg.learning_rate over cfg.warmup_steps, then cosine decay to
  cfg.learning_rate * cfg.end_lr_factor at cfg.total_steps, or constant.

  Args:
    cfg: a stage's optimizer settings (checked: its schedule is one of the two).

  Returns:
    step -> learning rate.
  """
  warmup = optax.linear_schedule(0.0, cfg.learning_rate, max(cfg.warmup_steps, 1))
  if cfg.schedule == "constant":
    after = optax.constant_schedule(cfg.learning_rate)
  else:
    decay_steps = max(cfg.total_steps - cfg.warmup_steps, 1)
    after = optax.cosine_decay_schedule(cfg.learning_rate, decay_steps, alpha=cfg.end_lr_factor)
  return optax.join_schedules([warmup, after], [cfg.warmup_steps])


def decay_mask(params) -> dict:
  """True for every param that takes weight decay: all but the norm scales."""
  return jax.tree_util.tree_map_with_path(
    lambda path, _: "norm" not in str(getattr(path[-1], "key", "")), params)


def make_optimizer(cfg: OptimizerSettings) -> optax.GradientTransformation:
  """AdamW (decoupled weight decay, masked off norms) after global-norm clipping.

  Args:
    cfg: learning_rate, warmup_steps, total_steps, schedule, end_lr_factor, b1, b2, eps,
      weight_decay, clip_norm (0 = no clipping).

  Returns:
    The optax transformation (its state is built from fp32 params, see the module docstring).
  """
  chain = [optax.clip_by_global_norm(cfg.clip_norm)] if cfg.clip_norm > 0 else []
  chain.append(optax.adamw(learning_rate_schedule(cfg), b1=cfg.b1, b2=cfg.b2, eps=cfg.eps,
                           weight_decay=cfg.weight_decay, mask=decay_mask))
  return optax.chain(*chain)
