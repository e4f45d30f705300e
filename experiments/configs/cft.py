"""CFT (Diffusion-GR2 §2): masked-diffusion fine-tuning of the converted AR GR2 on the re-ranking
data, reasoning / answer weights decoupled as in SFT.

  python experiments/run.py --config=cft.py --workdir=workdir
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import use_qwen3_8b_model  # noqa: E402
from diffusion_common import get_diffusion_config  # noqa: E402


def get_config(variant: str = ""):
  c = get_diffusion_config("cft", os.path.join("{workdir}", "ar_rl", "export"))
  c.cft = ml_collections.ConfigDict()
  c.cft.eps = 1e-3  # per-block masking rate t ~ U(eps, 1)
  c.cft.complementary = True  # also train the inverted mask (every token supervised per pair)
  c.cft.rate_power = 1.0  # masking-rate density ~ t^(p-1) (1 = U(eps, 1); 2 favours heavily
  #                         masked blocks)
  c.train.steps = 1000  # 1.7 epochs of the 9,199 tiny traces (500 = 0.87 epoch: valid .70, loss
  #                       still falling when the cosine schedule ended)
  c.train.batch_size = 16
  c.optimizer.learning_rate = 5e-4
  c.optimizer.warmup_steps = 30
  if variant == "qwen3_8b":
    use_qwen3_8b_model(c)
    c.train.batch_size = 32
    c.train.micro_batches = 1  # one row per device fits 80 GB (docs/plan_qwen3_8b.md)
    c.train.steps = 860  # 3 epochs of 9.2k examples at batch 32
    c.optimizer.learning_rate = 1e-5
  elif variant:
    raise ValueError(f"cft.py: unknown variant {variant!r}; expected '' or 'qwen3_8b'")
  return c
