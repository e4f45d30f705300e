"""OPD (Diffusion-GR2 §2): the CFT student decodes with its own block diffusion at the recipe's
decode.rollout_tau; the frozen AR GR2 (SFT + RL export) gives per-token forward-KL targets on
those trajectories; the OPD stage of a recipe (its settings: `stages.opd`).

  python experiments/run.py --config=opd.py --workdir=W
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "opd")
