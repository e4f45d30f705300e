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

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table2 import get_config as get_table2_config  # noqa: E402


def get_config(variant: str = ""):
  t2 = get_table2_config(variant)  # raises on an unknown variant
  c = ml_collections.ConfigDict()
  c.stage = "table3"  # experiments/run.py STAGES key
  c.data = t2.data  # the data build the models were trained on (table2.py's)
  c.eval = t2.eval  # decode batch size, step cap per block, eval.limit (first N examples)
  c.split = "test_1615"  # the evaluated split (the paper's 1,615 users)
  c.ar_ckpt = os.path.join("{workdir}", "ar_rl", "export")  # AR GR2 (SFT + RL)
  c.diffusion_ckpt = os.path.join("{workdir}", "rl", "export")  # final Diffusion-GR2
  c.results_dir = t2.results_dir  # where the outputs go
  c.taus = (1.0, 0.9, 0.6, 0.4)  # diffusion commit thresholds (paper Table 3)
  c.speed_examples = 100  # examples decoded alone per row for the batch-1 tokens/s (0 = skip)
  if variant == "smoke":
    c.speed_examples = 4
    c.eval.batch_size = 16  # >= 2 batches, so tokens/s (measured after the first) exists
  return c
