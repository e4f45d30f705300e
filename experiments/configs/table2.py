"""Table 2 of Diffusion-GR2: every step of a recipe, every row (gr2jax/reproduce.py).

  python experiments/run.py --config=table2.py --workdir=W                  (tiny, 2 CPU cores)
  python experiments/run.py --config=table2.py:smoke --workdir=/tmp/smoke   (CI: every row, tiny)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B \
      --workdir=W                                                           (a GPU / TPU box)

Reruns reuse finished steps; a changed field re-runs the steps it affects. The recipe's
`table.then` tables (Table 3, Table 4, Figure 6; the qwen3 recipes) run after the rows.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("table2", variant)
