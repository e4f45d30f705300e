"""The decode spec: how every stage of one recipe decodes (evaluation and on-policy rollouts).

One frozen value per recipe (gr2jax/recipe.py builds it from the run's config), read by the
evaluation, the AR and block-diffusion rollouts of AR RL / OPD / RL and the Table 2 rows, so two
stages of one recipe cannot decode differently. Paper values (research/papers.md §2): B = 32,
eval tau = 1.0 (quality mode), rollouts at tau = 0.9, at most 64 denoising steps per block.
"""

import dataclasses
import math


@dataclasses.dataclass(frozen=True)
class DecodeSpec:
  """Decoding settings of a recipe.

  Attributes:
    block_size: B of the diffusion stages (1 = AR decoding).
    eval_tau: commit threshold of evaluations, in (0, 1] (1.0 = one token per step).
    rollout_tau: commit threshold of OPD / RL rollouts, in (0, 1].
    max_steps_per_block: denoising-step cap per block, evaluation and rollouts alike.
    temperature: rollout sampling temperature (>= 0; rollout log-probs use the same).
  """
  block_size: int = 32
  eval_tau: float = 1.0
  rollout_tau: float = 0.9
  max_steps_per_block: int = 64
  temperature: float = 1.0

  def __post_init__(self):
    for name in ("block_size", "max_steps_per_block"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"DecodeSpec.{name}={value!r} must be an int >= 1")
    for name in ("eval_tau", "rollout_tau"):
      value = getattr(self, name)
      if not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"DecodeSpec.{name}={value!r} must be in (0, 1]")
    t = self.temperature
    if not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
      raise ValueError(f"DecodeSpec.temperature={t!r} must be a finite number >= 0")
