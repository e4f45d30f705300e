"""Diffusion RL (Diffusion-GR2 §2): TraceRL-style GRPO that replays each rollout's denoising trace
for per-token ratios; rank-promotion + conditional format reward, from the OPD export; the RL
stage of a recipe (its settings: `stages.rl`; rollouts at its rl.rollout_tau and rl.temperature).

  python experiments/run.py --config=rl.py --workdir=W
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "rl")
