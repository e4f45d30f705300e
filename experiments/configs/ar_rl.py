"""AR GR2 RL (GR2, arXiv 2602.07774): GRPO with the rank-promotion + conditional format reward,
from the SFT export; the AR RL stage of a recipe (its settings: `stages.ar_rl`). G rollouts per
prompt, group z-score advantages, zero-variance groups dropped, clipped ratio, token-sum
normalisation; rollouts at its rl.temperature.

  python experiments/run.py --config=ar_rl.py --workdir=W
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "ar_rl")
