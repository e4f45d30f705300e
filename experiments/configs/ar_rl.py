"""AR GR2 RL (research/papers.md §1.5): GRPO with the rank-promotion + conditional format reward,
from the SFT export. G rollouts per prompt, group z-score advantages, zero-variance groups dropped,
clipped ratio, token-sum normalisation.

  python experiments/run.py --config=ar_rl.py --workdir=workdir
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import get_common_config, use_constant_lr, use_qwen3_8b_model  # noqa: E402


def get_config(variant: str = ""):
  c = get_common_config("ar_rl")
  c.init = os.path.join("{workdir}", "sft", "export")  # the SFT stage's export
  c.train.steps = 60
  c.train.batch_size = 8  # prompts per step (x G rollouts)
  c.train.save_every = 20
  use_constant_lr(c, 1e-4, 5)
  c.rl = ml_collections.ConfigDict()
  c.rl.group_size = 8  # G rollouts per prompt (paper: 8)
  c.rl.temperature = 1.0  # sampling temperature; log-probs use the same (commit.token_log_probs)
  c.rl.eps_low = 0.2  # ratio clip 1 - eps_low (paper: symmetric 0.2)
  c.rl.eps_high = 0.2  # ratio clip 1 + eps_high (> eps_low = DAPO clip-higher)
  c.rl.alpha = 0.2  # conditional format-reward weight (Diffusion-GR2 App. B)
  if variant == "qwen3_8b":
    use_qwen3_8b_model(c)
    c.train.prepare_chunk = 256  # of 1,024 rollouts; 32 per batch shard on fsdp 8 fit 80 GB (plan)
    c.train.batch_size = 128
    c.train.micro_batches = 16  # 64 rows per micro-batch fit 80 GB on fsdp 8 (plan, predicted)
    c.optimizer.learning_rate = 1e-6
  elif variant:
    raise ValueError(f"ar_rl.py: unknown variant {variant!r}; expected '' or 'qwen3_8b'")
  return c
