"""Table 4 of Diffusion-GR2, the checkable part (no LLM judge offline): for AR and the final
diffusion model (decoded at decode.eval_tau), identifier correctness, parse rate, reasoning length
and a grounding proxy; writes <results>/table4.{md,json}.

  python experiments/run.py --config=table4.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=table4.py:smoke --workdir=W  (after table2.py:smoke)

A view of the recipe (same variant as the table2 run). gr2jax/apps/tables.py holds the logic.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "table4")
