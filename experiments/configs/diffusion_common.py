"""Settings shared by the diffusion stages (cft.py, opd.py, rl.py), each field commented."""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import get_common_config  # noqa: E402


def get_diffusion_config(stage: str, init: str) -> ml_collections.ConfigDict:
  c = get_common_config(stage)
  c.init = init  # the previous stage's export ({workdir} = this run's workdir)
  c.block_size = 32  # B: an AR init is converted (mask token <|mask|>; weights copied 1:1)
  c.diffusion = ml_collections.ConfigDict()
  c.diffusion.tau = 0.9  # rollout commit threshold (OPD/RL; eval uses eval.tau)
  c.diffusion.temperature = 1.0  # rollout sampling temperature (log-probs use the same)
  c.diffusion.max_steps_per_block = 64  # rollout denoising-step cap per block (paper: 64)
  c.diffusion.shrink = 1  # replay step shrinkage (1 = exact; k merges k steps per round)
  return c
