"""Figure 6 of Diffusion-GR2: speed-up of the final diffusion model over AR vs output length and
vs prompt length (every example decoded alone, warm jit; settings table.fig6); writes
<results>/fig6.{json,png}.

  python experiments/run.py --config=fig6.py --workdir=W        (W: a finished table2.py workdir)
  python experiments/run.py --config=fig6.py:smoke --workdir=W  (after table2.py:smoke)

A view of the recipe (same variant as the table2 run). gr2jax/apps/tables.py holds the logic.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "fig6")
