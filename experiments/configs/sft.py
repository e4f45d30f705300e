"""AR GR2 SFT (research/papers.md §1.4): the decoupled lambda_r / lambda_o loss; the SFT stage of
a recipe (experiments/configs/recipe.py: its settings are `stages.sft`).

  python experiments/run.py --config=sft.py --workdir=W
  python experiments/run.py --config=sft.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B --workdir=W

Tiny (default): a fresh `tiny` model sized to the project tokenizer. HF recipes: the HF
checkpoint converted with the project's tokens added (the `convert` step, convert.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  return get_recipe("sft", variant)
