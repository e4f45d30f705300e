"""Diffusion RL (Diffusion-GR2 §2): TraceRL-style GRPO that replays each rollout's denoising trace
for per-token ratios; rank-promotion + conditional format reward, from the OPD export; the RL
stage of a recipe (its settings: `stages.rl`; rollouts at decode.rollout_tau).

  python experiments/run.py --config=rl.py --workdir=W
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("rl", variant)
