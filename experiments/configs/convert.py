"""The HF recipes' first step: the local HF Qwen3 checkpoint (--config.hf_dir) converted to a
gr2jax checkpoint with the project's tokens added (the data build's extended tokenizer,
gr2jax/hf/convert.py), into <workdir>/convert/export, which SFT starts from.

  python experiments/run.py --config=convert.py:qwen3_8b --config.hf_dir=DIR --workdir=W
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("convert", variant)
