"""Evaluate any checkpoint, AR or diffusion, on a split: R@1/R@3/N@3, validity, NFE, tokens/s.

  python experiments/run.py --config=eval.py --workdir=workdir --config.eval.ckpt=workdir/sft/export
  python experiments/run.py --config=eval.py --config.eval.ckpt=... --config.eval.tau=0.9 \
      --config.eval.split=test --config.eval.limit=500

  python experiments/run.py --config=eval.py --config.eval.ckpt=workdir/ar_rl/export \
      --config.eval.block_size=32   (naive Diffusion-GR2: the AR model converted, untrained)

Writes <eval.out_dir or ckpt>/eval_<split>_tau<tau>[_B<B>].{json,jsonl} (per-example rows a
person can read: user, response text, validity kind, ranking, target rank).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import get_common_config  # noqa: E402


def get_config():
  c = get_common_config("eval")
  c.eval.ckpt = ""  # the checkpoint to evaluate (a gr2jax checkpoint or HF directory)
  c.eval.out_dir = ""  # where results go ('' = next to the checkpoint)
  c.eval.block_size = 0  # > 0: convert an AR checkpoint to block diffusion first (the naive row)
  return c
