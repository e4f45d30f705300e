"""Every training stage of gr2jax/stage_registry.py (sft, ar_rl, cft, opd, rl, and any stage added
there): the recipe as that stage's config, its own settings under `stages.<stage>` (the
registry's docstring says what each stage trains).

  python experiments/run.py --config=cft.py --workdir=W
  python experiments/run.py --config=cft.py:qwen3_8b --config.hf_dir=DIR --workdir=W
  python experiments/run.py --config=stage.py:cft:qwen3_8b --config.hf_dir=DIR --workdir=W

No stage has a file of its own: experiments/run.py reads `--config=<stage>.py[:VARIANT]` as
`--config=stage.py:<stage>[:VARIANT]` (this file, the stage in its config string).
"""

from gr2jax import recipes, stage_registry


def get_config(stage_and_variant: str = ""):
  """The recipe VARIANT ('' = tiny) as the config of training stage STAGE.

  Args:
    stage_and_variant: 'STAGE' or 'STAGE:VARIANT', e.g. 'cft' or 'cft:qwen3_8b,smoke'.

  Raises:
    ValueError: STAGE is not a registered training stage, or VARIANT is not a recipe.
  """
  stage, _, variant = stage_and_variant.partition(":")
  if stage not in stage_registry.STAGES:
    raise ValueError(f"{stage!r} is not a training stage; "
                     f"expected stage.py:STAGE[:VARIANT] (or <stage>.py[:VARIANT]) with STAGE "
                     f"in {list(stage_registry.names())}")
  return recipes.config(variant, stage)
