"""Table 2 of Diffusion-GR2: every step of a recipe, every row (gr2jax/apps/table2.py).

  python experiments/run.py --config=table2.py --workdir=W                  (tiny, 2 CPU cores)
  python experiments/run.py --config=table2.py:smoke --workdir=/tmp/smoke   (CI: every row, tiny)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B \
      --workdir=W                                                           (a GPU / TPU box)

Reruns reuse finished steps; a changed field re-runs the steps it affects. The recipe's
`table.then` tables (Table 3, Table 4, Figure 6; the qwen3 recipes) run after the rows.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "table2")
