"""CFT (Diffusion-GR2 §2): masked-diffusion fine-tuning of the converted AR GR2 (block size
decode.block_size) on the re-ranking data, reasoning / answer weights decoupled as in SFT; the
CFT stage of a recipe (its settings: `stages.cft`).

  python experiments/run.py --config=cft.py --workdir=W
  python experiments/run.py --config=cft.py:qwen3_8b --config.hf_dir=DIR --workdir=W
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "cft")
