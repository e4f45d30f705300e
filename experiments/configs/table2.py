"""Table 2 of Diffusion-GR2 on the tiny default: every stage, every row (gr2jax/reproduce.py).

  python experiments/run.py --config=table2.py --workdir=workdir/table2
  python experiments/run.py --config=table2.py:smoke --workdir=/tmp/smoke   (CI: every row, tiny)

Reruns reuse finished stages; a changed field re-runs the stages it affects.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import get_common_config  # noqa: E402

STAGES = ("sft", "ar_rl", "cft", "opd", "rl")


def get_config(variant: str = ""):
  common = get_common_config("table2")
  c = ml_collections.ConfigDict()
  c.stage = "table2"  # experiments/run.py STAGES key
  c.data = common.data  # the data build (pin SIDs across machines with data.sids_file)
  c.mesh = common.mesh
  c.eval = common.eval  # eval.tau = 1.0 (quality mode), eval.limit = 0 (all users)
  c.splits = ("test_1615", "test")  # evaluated splits (the paper's 1,615 users, all users)
  c.diffusion_splits = ("test_1615",)  # of those, where the diffusion rows are evaluated too: at
  #   tau = 1.0 a row on all 22,363 users takes 13 min on 2 quiet CPU cores (one token per
  #   32-token block forward; the naive row, decoding to the length cap, ~1.4x that), over an
  #   hour for the five rows; ("test_1615", "test") on a GPU box
  c.block_size = 32  # B of the diffusion stages (paper: 32)
  c.rollout_max_steps_per_block = 64  # OPD / RL rollout step cap per block (eval: eval.*)
  c.results_dir = os.path.join("{workdir}", "results")  # where table2.{md,csv,json} go
  c.stages = ml_collections.ConfigDict()  # per-stage overrides of config.train (steps, ...)
  for name in STAGES:
    c.stages[name] = ml_collections.ConfigDict()
  if variant == "smoke":  # every stage and row on a few examples with a handful of steps
    c.data.learned_headroom = False
    c.splits = ("test_1615",)
    c.diffusion_splits = ("test_1615",)
    c.eval.limit = 32
    c.eval.batch_size = 32
    c.eval.max_steps_per_block = 4  # untrained models commit ~1 token per step
    c.rollout_max_steps_per_block = 4
    c.data.rqvae.epochs = 10
    for name in STAGES:
      c.stages[name] = ml_collections.ConfigDict(dict(steps=2, batch_size=4, limit=256,
                                                      save_every=2))
  elif variant:
    raise ValueError(f"table2.py: unknown variant {variant!r}; expected '' or 'smoke'")
  return c


def get_tables_config(stage: str, variant: str = "") -> ml_collections.ConfigDict:
  """The fields Table 3, Table 4 and Figure 6 share: table2.py's data build, eval settings and
  results directory (same variant), the evaluated split and the two models of a table2 workdir."""
  t2 = get_config(variant)  # raises on an unknown variant
  c = ml_collections.ConfigDict()
  c.stage = stage  # experiments/run.py STAGES key
  c.data = t2.data  # the data build the models were trained on (table2.py's)
  c.eval = t2.eval  # decode batch size, step cap per block, eval.limit (first N examples)
  c.split = "test_1615"  # the evaluated split (the paper's 1,615 users)
  c.ar_ckpt = os.path.join("{workdir}", "ar_rl", "export")  # AR GR2 (SFT + RL)
  c.diffusion_ckpt = os.path.join("{workdir}", "rl", "export")  # final Diffusion-GR2
  c.results_dir = t2.results_dir  # where the outputs go
  return c
