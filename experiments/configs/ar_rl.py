"""AR GR2 RL (research/papers.md §1.5): GRPO with the rank-promotion + conditional format reward,
from the SFT export; the AR RL stage of a recipe (its settings: `stages.ar_rl`). G rollouts per
prompt, group z-score advantages, zero-variance groups dropped, clipped ratio, token-sum
normalisation; rollouts at the recipe's decode.temperature.

  python experiments/run.py --config=ar_rl.py --workdir=W
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("ar_rl", variant)
