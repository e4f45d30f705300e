"""Data stage: raw Beauty -> split / retriever / candidate lists / teacher -> SIDs -> tokenizer ->
prompts -> TFDS, cached in the workdir (gr2jax/data/pipeline.py).

  python experiments/run.py --config=data.py --workdir=workdir
  python experiments/run.py --config=data.py:qwen3_8b --config.hf_dir=DIR --workdir=W

The data fields are every recipe's `data` block (gr2jax/recipes.py `data_config`); the qwen3
recipes change its prompt and extend the HF directory's tokenizer instead of training the tiny
BPE.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "data")
