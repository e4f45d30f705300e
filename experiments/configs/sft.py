"""AR GR2 SFT (GR2, arXiv 2602.07774): the decoupled lambda_r / lambda_o loss; the SFT stage of
a recipe (gr2jax/recipes.py: its settings are `stages.sft`).

  python experiments/run.py --config=sft.py --workdir=W
  python experiments/run.py --config=sft.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B --workdir=W

Tiny (default): a fresh `tiny` model sized to the project tokenizer. HF recipes: the HF
checkpoint converted with the project's tokens added (the `convert` step, convert.py).
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "sft")
