"""Table 4 of Diffusion-GR2, the checkable part (no LLM judge offline): for AR and the final
diffusion model, identifier correctness, parse rate, reasoning length and a grounding proxy;
writes <results>/table4.{md,json}.

  python experiments/run.py --config=table4.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=table4.py:smoke --workdir=W  (after table2.py:smoke)

The data build, eval settings and results directory are table2.py's (same variant), so the models
and the data build of W are reused. gr2jax/tables.py holds the logic.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from table2 import get_tables_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_tables_config("table4", variant)
  # the diffusion model is decoded at eval.tau (1.0, quality mode; Table 3's tau = 1.0 decode)
  return c
