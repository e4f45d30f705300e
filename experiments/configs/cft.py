"""CFT (Diffusion-GR2 §2): masked-diffusion fine-tuning of the converted AR GR2 (block size
decode.block_size) on the re-ranking data, reasoning / answer weights decoupled as in SFT; the
CFT stage of a recipe (its settings: `stages.cft`).

  python experiments/run.py --config=cft.py --workdir=W
  python experiments/run.py --config=cft.py:qwen3_8b --config.hf_dir=DIR --workdir=W
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("cft", variant)
