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
  c.block_size = 32  # B of the diffusion stages (paper: 32)
  c.rollout_max_steps_per_block = 64  # OPD / RL rollout step cap per block (eval: eval.*)
  c.results_dir = os.path.join("{workdir}", "results")  # where table2.{md,csv,json} go
  c.stages = ml_collections.ConfigDict()  # per-stage overrides of config.train (steps, ...)
  for name in STAGES:
    c.stages[name] = ml_collections.ConfigDict()
  if variant == "smoke":  # every stage and row on a few examples with a handful of steps
    c.data.learned_headroom = False
    c.splits = ("test_1615",)
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
