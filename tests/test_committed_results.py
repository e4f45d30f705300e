"""The committed results/ (the tiny Table 2 run's table2 / table3 / table4 / fig6): every file
carries the same stamp (apps/report.py: recipe digest, clean commit), and that recipe digest is
the one of the tiny Table 2 recipe as the committed results are made, so a changed recipe cannot
leave them stale unnoticed."""

import json
import os

from gr2jax import recipe, recipes
from gr2jax.apps import report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(REPO, "results")
SIDS = os.path.join("results", "sids_table2.npy")
COMMAND = ("python experiments/run.py --config=table2.py --workdir=W "
           f"--config.data.sids_file={SIDS}")  # Table 2, then Tables 3, 4 and Figure 6
REMAKE = (f"remake them from a clean checkout with `{COMMAND}`, then `cp W/results/* results/` "
          "(written outside the checkout, so the files after the first do not record a dirty "
          "commit) and batch_curve.py's predicted section (docs/results/table2.md)")


def _tiny_table2_recipe() -> recipe.Recipe:
  """COMMAND's recipe, built as experiments/run.py builds it (the config file's ConfigDict, the
  overrides, recipe.from_config), run from the checkout's root."""
  c = recipes.config("", "table2")  # experiments/configs/table2.py's get_config()
  c.data.sids_file = os.path.join(REPO, SIDS)
  return recipe.from_config(c)


def test_committed_results_carry_one_clean_stamp():
  problems = report.check_results(RESULTS)
  assert not problems, "results/: " + "; ".join(problems) + f"; {REMAKE}"


def test_committed_results_were_made_by_the_tiny_table2_recipe(tmp_path):
  with open(os.path.join(RESULTS, "table2.json")) as f:
    saved = json.load(f).get("recipe_digest")
  want = report.recipe_digest(_tiny_table2_recipe(), str(tmp_path))
  assert saved == want, (f"results/table2.json records recipe_digest {saved}, the tiny Table 2 "
                         f"recipe's is {want}: {REMAKE}")
