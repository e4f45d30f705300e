"""Table 3 of Diffusion-GR2: the final diffusion model at tau in {1.0, 0.9, 0.6, 0.4} plus AR
(R@1, valid rate, forwards and the paper's NFE per token, tokens/s, speed-up over AR); writes
<results>/table3.{md,json} and table3_frontier.png (accuracy-speed frontier).

  python experiments/run.py --config=table3.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=table3.py:smoke --workdir=W  (after table2.py:smoke)

The data build, eval settings and results directory are table2.py's (same variant), so the models
and the data build of W are reused. gr2jax/tables.py holds the logic.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table2 import get_tables_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_tables_config("table3", variant)
  c.taus = (1.0, 0.9, 0.6, 0.4)  # diffusion commit thresholds (paper Table 3)
  c.speed_examples = 100  # examples decoded alone per row for the batch-1 tokens/s (0 = skip)
  if variant == "smoke":
    c.speed_examples = 4
    c.eval.batch_size = 16  # >= 2 batches, so tokens/s (measured after the first) exists
  return c
