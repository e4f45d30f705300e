"""Table 3 of Diffusion-GR2: the final diffusion model at tau in table.taus plus AR (R@1, valid
rate, forwards and the paper's NFE per token, tokens/s, speed-up over AR); writes
<results>/table3.{md,json} and table3_frontier.png (accuracy-speed frontier).

  python experiments/run.py --config=table3.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=table3.py:smoke --workdir=W  (after table2.py:smoke)

A view of the recipe (same variant as the table2 run), so W's models and data build are reused.
gr2jax/apps/tables.py holds the logic.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "table3")
