"""Figure 6 of Diffusion-GR2: speed-up of the final diffusion model over AR vs output length and
vs prompt length (every example decoded alone, warm jit); writes <results>/fig6.{json,png}.

  python experiments/run.py --config=fig6.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=fig6.py:smoke --workdir=W  (after table2.py:smoke)

The data build, eval settings and results directory are table2.py's (same variant), so the models
and the data build of W are reused. gr2jax/tables.py holds the logic.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table2 import get_tables_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_tables_config("fig6", variant)
  c.fig6 = ml_collections.ConfigDict()
  c.fig6.tau = 0.9  # diffusion commit threshold of the timed decodes
  c.fig6.limit = 300  # examples decoded one by one by each model (0 = the whole split)
  c.fig6.num_bins = 6  # quantile bins of output / prompt length
  c.fig6.output_lengths = (32, 64, 128, 256)  # forced output lengths of the controlled sweep
  c.fig6.sweep_examples = 20  # examples decoded (batch 1) at each forced length by each model
  if variant == "smoke":
    c.fig6.limit = 8
    c.fig6.output_lengths = (16, 32)
    c.fig6.sweep_examples = 2
  return c
