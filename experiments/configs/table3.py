"""Table 3 of Diffusion-GR2: the final diffusion model at tau in table.taus plus AR (R@1, valid
rate, forwards and the paper's NFE per token, tokens/s, speed-up over AR); writes
<results>/table3.{md,json} and table3_frontier.png (accuracy-speed frontier).

  python experiments/run.py --config=table3.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=table3.py:smoke --workdir=W  (after table2.py:smoke)

A view of the recipe (same variant as the table2 run), so W's models and data build are reused.
gr2jax/tables.py holds the logic.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("table3", variant)
