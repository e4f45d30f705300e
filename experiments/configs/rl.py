"""Diffusion RL (Diffusion-GR2 §2): TraceRL-style GRPO that replays each rollout's denoising trace
for per-token ratios; rank-promotion + conditional format reward, from the OPD export.

  python experiments/run.py --config=rl.py --workdir=workdir
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import use_constant_lr, use_qwen3_8b_model  # noqa: E402
from diffusion_common import get_diffusion_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_diffusion_config("rl", os.path.join("{workdir}", "opd", "export"))
  c.rl = ml_collections.ConfigDict()
  c.rl.group_size = 8  # G rollouts per prompt (paper: 8)
  c.rl.eps_low = 0.2  # ratio clip (paper: symmetric 0.2)
  c.rl.eps_high = 0.2
  c.rl.alpha = 0.2  # conditional format-reward weight
  c.train.steps = 30
  c.train.batch_size = 4  # prompts per step (x G)
  c.train.save_every = 10
  use_constant_lr(c, 2e-5, 2)
  c.train.micro_batches = 4  # rollout rows per micro-batch bound the replay's memory
  if variant == "qwen3_8b":
    use_qwen3_8b_model(c)
    c.train.prepare_chunk = 256  # of 1,024 rollouts; 32 per batch shard on fsdp 8 fit 80 GB (plan)
    c.train.batch_size = 128
    c.train.micro_batches = 64  # 16 rows per micro-batch: 45.4 GiB/device on fsdp 8 (plan)
    c.train.steps = 600  # paper: 600 steps, lr 5e-7
    c.optimizer.learning_rate = 5e-7
  elif variant:
    raise ValueError(f"rl.py: unknown variant {variant!r}; expected '' or 'qwen3_8b'")
  return c
