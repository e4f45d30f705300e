"""What the result writers share (apps/table2.py's Table 2, apps/tables.py's Table 3, Table 4 and
Figure 6): a table cell, a paired difference's cell, and the stamp every results file carries.

The stamp is two fields, written at the top of each results JSON and on a line of its markdown:
- `recipe_digest`: the digest of what decides the numbers (`recipe_digest`): the chain's digest
  of its final step (gr2jax/run_identity.py step_digests: the data build and every training
  stage, less what changes no export, run_identity.result_fields) joined with the settings the
  tables evaluate under (the TablesView less RESULTS_NEUTRAL: the decode spec, eval.limit and
  batch_size, Table 3's taus, commit orders, full-split taus and drafts, the timed examples,
  Figure 6's settings);
- `commit`: the git commit of the checkout gr2jax is imported from (`commit`).
`check_results` reads a results directory and lists where the four files disagree.
"""

import json
import os
import re
import subprocess

from gr2jax import files, run_identity, stage_registry
from gr2jax import recipe as recipe_lib
from gr2jax import workdir as workdir_lib
from gr2jax.data import answer
from gr2jax.recipe import TablesView

INVALID_KINDS = tuple(k for k in answer.KINDS if k != "valid")  # the answers' failure counts
STAMP_FIELDS = ("recipe_digest", "commit")
RESULTS_FILES = ("table2.json", "table3.json", "table4.json", "fig6.json")  # the writers' JSON
# TablesView fields that change no number: which table runs, where it is written, whether the
# timings are taken again. Its data build and exports are the chain digest's (_CHAIN_FIELDS).
RESULTS_NEUTRAL = ("stage", "results_dir", "remeasure")
_CHAIN_FIELDS = ("data", "ar_ckpt", "diffusion_ckpt")
_COMMIT = re.compile(r"[0-9a-f]{40}")
NO_GIT = "unknown (not a git checkout)"


def cell(row: dict, column: str, missing: str) -> str:
  """A table cell: row[column], else the answer-kind count row['counts'][column]; floats with
  4 decimals, `missing` when the row has neither."""
  value = row.get(column, row.get("counts", {}).get(column))
  if value is None:
    return missing
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def interval(difference) -> str:
  """'+d [+lo, +hi]' of a paired difference [d, lo, hi] (metrics.versus)."""
  diff, lo, hi = difference
  return f"{diff:+.4f} [{lo:+.4f}, {hi:+.4f}]"


def interval_column(metric: str) -> str:
  """The header of a paired difference's column: 'dR@1 [95% CI]'."""
  return f"d{metric} [95% CI]"


def _added_at_default(view: TablesView) -> dict:
  """TablesView fields added after results were stamped without them, each at the value that
  does what those results did (Table 3 under the recipe's own order alone, no full-split rows):
  a view holding one at that value has the digest of one without it."""
  return {"commit_orders": (view.decode.commit_order,), "full_split_taus": ()}


def _digest(chain_digest: str, view: TablesView) -> str:
  """json_digest of [the chain's final-step digest, the view's fields but RESULTS_NEUTRAL,
  _CHAIN_FIELDS and those at their added default (_added_at_default)]."""
  added = _added_at_default(view)
  fields = {k: v for k, v in view.to_dict().items()
            if k not in RESULTS_NEUTRAL + _CHAIN_FIELDS
            and not (k in added and tuple(v) == added[k])}
  fields["decode"] = fields["decode"].record()  # its retired fields kept (DecodeSpec.record)
  return files.json_digest([chain_digest, fields])


def recipe_digest(recipe: recipe_lib.Recipe, workdir: str) -> str:
  """The digest of what decides a recipe's results (module docstring): the same for every
  workdir and checkout location (paths are run_identity.step_digests' portable ones), for another
  results_dir, restart flag, remeasure, save / eval interval or mesh. Which splits Table 2 shows
  and which tables follow (table.splits, diffusion_splits, then) pick rows and files, not their
  numbers, and are left out."""
  final = recipe_lib.chain(recipe)[-1]
  return _digest(run_identity.step_digests(recipe, workdir)[final],
                 recipe_lib.tables_config(recipe, "table2", workdir))


def recorded_digest(view: TablesView, workdir: str) -> str:
  """recipe_digest of the recipe that made the workdir's models, read from the chain's record
  of its final step (W/<step>/done.json, whose digest chains every step before it) and the
  tables' view; 'unknown (...)' without that record."""
  step = stage_registry.names()[-1]
  path = os.path.join(recipe_lib.stage_dir(workdir, step), run_identity.DONE_FILE)
  if not os.path.isfile(path):
    return f"unknown (no {step}/{run_identity.DONE_FILE} in the workdir)"
  with open(path) as f:
    return _digest(json.load(f)["digest"], view)


def _git(checkout: str, *args: str) -> str:
  return subprocess.run(["git", "-C", checkout, *args], capture_output=True, text=True,
                        check=True).stdout.strip()


def commit(checkout: str = workdir_lib.CHECKOUT_DIR) -> str:
  """The checkout's HEAD commit, '+dirty' appended when a tracked file is modified (untracked
  files do not count); NO_GIT where git is missing or `checkout` is not a repository's root."""
  try:
    top, head = _git(checkout, "rev-parse", "--show-toplevel", "HEAD").splitlines()
    dirty = _git(checkout, "status", "--porcelain", "--untracked-files=no")
  except (OSError, subprocess.CalledProcessError, ValueError):
    return NO_GIT
  if os.path.realpath(top) != os.path.realpath(checkout):
    return NO_GIT
  return head + ("+dirty" if dirty else "")


def stamp(digest: str) -> dict:
  """{'recipe_digest': digest, 'commit': commit()}: what a results file records at its top."""
  return {"recipe_digest": digest, "commit": commit()}


def stamp_of(record: dict) -> dict:
  """The stamp fields `record` holds, None values left out: of a saved results JSON (what a
  re-render passes through) or of a writer's keywords."""
  return {k: record[k] for k in STAMP_FIELDS if record.get(k) is not None}


def stamp_line(fields: dict) -> str:
  """The stamp fields of `fields` as a markdown line ('' with none)."""
  return ", ".join(f"{k} {fields[k]}" for k in STAMP_FIELDS if k in fields)


def check_results(results_dir: str) -> list[str]:
  """Problems of a results directory's RESULTS_FILES, each naming its file(s): a file missing,
  a stamp field missing, a commit that is not 40 hex digits (dirty or unknown), a field whose
  value differs between files. [] when all agree."""
  problems, values = [], {field: {} for field in STAMP_FIELDS}
  for name in RESULTS_FILES:
    path = os.path.join(results_dir, name)
    if not os.path.isfile(path):
      problems.append(f"{name}: missing")
      continue
    with open(path) as f:
      record = json.load(f)
    for field in STAMP_FIELDS:
      if field in record:
        values[field][name] = record[field]
      else:
        problems.append(f"{name}: no {field}")
    if "commit" in record and not _COMMIT.fullmatch(str(record["commit"])):
      problems.append(f"{name}: commit {record['commit']!r} is not a clean commit (40 hex "
                      "digits, no +dirty)")
  for field, by_file in values.items():
    if len(set(by_file.values())) > 1:
      problems.append(f"{field} differs: "
                      + ", ".join(f"{name} {value}" for name, value in by_file.items()))
  return problems
