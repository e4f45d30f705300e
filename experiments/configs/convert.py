"""The HF recipes' first step: the local HF Qwen3 checkpoint (--config.hf_dir) converted to a
gr2jax checkpoint with the project's tokens added (the data build's extended tokenizer,
gr2jax/hf/convert.py), into <workdir>/convert/export, which SFT starts from.

  python experiments/run.py --config=convert.py:qwen3_8b --config.hf_dir=DIR --workdir=W
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "convert")
