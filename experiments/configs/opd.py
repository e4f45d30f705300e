"""OPD (Diffusion-GR2 §2): the CFT student decodes with its own block diffusion; the frozen AR
GR2 (SFT + RL) gives per-token forward-KL targets on those trajectories.

  python experiments/run.py --config=opd.py --workdir=workdir
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import use_constant_lr, use_qwen3_8b_model  # noqa: E402
from diffusion_common import get_diffusion_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_diffusion_config("opd", os.path.join("{workdir}", "cft", "export"))
  c.opd = ml_collections.ConfigDict()
  c.opd.teacher = os.path.join("{workdir}", "ar_rl", "export")  # the frozen AR GR2
  c.opd.group_size = 4  # G' student trajectories per prompt (paper: 4)
  c.opd.teacher_dtype = "float32"  # storage of the cached teacher log-probs [B, M, V]:
  #                                  'float32' | 'bfloat16' (half the memory; the loss reads f32)
  c.train.steps = 20  # tiny: 20 x 8 prompts; lr 5e-5 for 40 steps lowered validity .70 -> .30
  c.train.batch_size = 8  # prompts per step (x G')
  c.train.save_every = 20
  use_constant_lr(c, 5e-6, 2)  # tiny: CFT valid .702 -> .733 in 20 steps (README)
  c.train.micro_batches = 4  # rollout rows per micro-batch bound the replay's memory
  if variant == "qwen3_8b":
    use_qwen3_8b_model(c)
    c.train.prepare_chunk = 256  # of 512 rollouts; 32 per batch shard on fsdp 8 fit 80 GB (plan)
    c.train.batch_size = 128  # paper: 128 prompts per step, 1 epoch
    c.opd.teacher_dtype = "bfloat16"  # f32: [512, 256, 151,936] = 80 GB per step (the plan)
    c.train.micro_batches = 32  # 16 rows per micro-batch: 59.3 GiB/device on fsdp 8 (plan)
    c.train.steps = 1500
    c.optimizer.learning_rate = 1e-6
  elif variant:
    raise ValueError(f"opd.py: unknown variant {variant!r}; expected '' or 'qwen3_8b'")
  return c
