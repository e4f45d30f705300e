"""gr2jax/apps/report.py: the table cell, the results stamp (recipe digest, commit) and the check
of a results directory."""

import json
import os
import subprocess

import pytest

from gr2jax import recipe, recipes, run_identity
from gr2jax.apps import report

CLEAN = "0123456789abcdef0123456789abcdef01234567"


def _digest(workdir: str, **overrides) -> str:
  """report.recipe_digest of the tiny Table 2 recipe with `overrides` ({'a.b': value})."""
  c = recipes.config("tiny", "table2")
  for path, value in overrides.items():
    *parents, field = path.split(".")
    block = c
    for name in parents:
      block = block[name]
    block[field] = value
  return report.recipe_digest(recipe.from_config(c), workdir)


def test_the_recipe_digest_ignores_what_changes_no_number(tmp_path):
  base = _digest(str(tmp_path))
  assert _digest(str(tmp_path / "elsewhere")) == base  # paths are portable
  for neutral in ({"table.results_dir": "results"}, {"table.remeasure": True},
                  {"stages.sft.train.restart": True}, {"stages.cft.train.save_every": 7},
                  {"stages.rl.train.eval_every": 5}, {"mesh.fsdp": 2}, {"table.then": ("fig6",)},
                  {"table.commit_orders": ("distinct",)}):  # the recipe's order: the default's
    assert _digest(str(tmp_path), **neutral) == base, neutral
  for changed in ({"decode.eval_tau": 0.5}, {"eval.limit": 16}, {"eval.batch_size": 8},
                  {"stages.cft.optimizer.learning_rate": 1e-3}, {"data.seed": 3},
                  {"table.taus": (1.0, 0.6)}, {"table.commit_orders": ("distinct", "confidence")},
                  {"table.full_split_taus": (0.6,)}):
    assert _digest(str(tmp_path), **changed) != base, changed


def test_the_tables_read_the_digest_from_the_chains_record(tmp_path):
  """recorded_digest (the tables: a view and the workdir) equals recipe_digest (Table 2: the
  recipe) when the final step's done.json holds the recipe's chain digest."""
  r, workdir = recipes.get("tiny"), str(tmp_path)
  view = recipe.tables_config(r, "table3", workdir)
  assert report.recorded_digest(view, workdir).startswith("unknown (no rl/done.json")
  final = recipe.chain(r)[-1]
  os.makedirs(tmp_path / final)
  (tmp_path / final / run_identity.DONE_FILE).write_text(
    json.dumps({"digest": run_identity.step_digests(r, workdir)[final]}))
  assert report.recorded_digest(view, workdir) == report.recipe_digest(r, workdir)
  fig6 = recipe.tables_config(r, "fig6", workdir)  # another table of the same run
  assert report.recorded_digest(fig6, workdir) == report.recipe_digest(r, workdir)


def _git(repo, *args):
  subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True)


def test_commit_is_head_dirty_only_for_modified_tracked_files(tmp_path):
  assert report.commit(str(tmp_path)) == report.NO_GIT
  _git(tmp_path, "init", "-q")
  (tmp_path / "a.txt").write_text("a")
  _git(tmp_path, "add", "a.txt")
  _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "a")
  head = subprocess.run(["git", "-C", str(tmp_path), "rev-parse", "HEAD"], check=True,
                        capture_output=True, text=True).stdout.strip()
  assert report.commit(str(tmp_path)) == head
  (tmp_path / "untracked.txt").write_text("b")
  assert report.commit(str(tmp_path)) == head
  (tmp_path / "a.txt").write_text("changed")
  assert report.commit(str(tmp_path)) == head + "+dirty"
  (tmp_path / "sub").mkdir()
  assert report.commit(str(tmp_path / "sub")) == report.NO_GIT  # not the repository's root


def _write(results, stamps: dict):
  results.mkdir(exist_ok=True)
  for name in report.RESULTS_FILES:
    (results / name).write_text(json.dumps({**stamps.get(name, {}), "rows": []}))


def test_check_results_names_each_problem_and_its_file(tmp_path):
  good = {"recipe_digest": "066aafb788d55543", "commit": CLEAN}
  _write(tmp_path / "ok", {name: good for name in report.RESULTS_FILES})
  assert report.check_results(str(tmp_path / "ok")) == []
  stamps = {name: good for name in report.RESULTS_FILES}
  stamps["table3.json"] = {**good, "recipe_digest": "ffffffffffffffff"}
  stamps["table4.json"] = {"commit": CLEAN}
  stamps["fig6.json"] = {**good, "commit": CLEAN + "+dirty"}
  _write(tmp_path / "bad", stamps)
  problems = report.check_results(str(tmp_path / "bad"))
  assert "table4.json: no recipe_digest" in problems
  assert any(p.startswith("fig6.json: commit") and "+dirty" in p for p in problems)
  digest = [p for p in problems if p.startswith("recipe_digest differs")]
  assert len(digest) == 1 and "table3.json ffffffffffffffff" in digest[0]
  commits = [p for p in problems if p.startswith("commit differs")]
  assert len(commits) == 1 and "fig6.json" in commits[0]
  (tmp_path / "bad" / "table2.json").unlink()
  assert "table2.json: missing" in report.check_results(str(tmp_path / "bad"))


def test_only_the_writers_files_are_checked(tmp_path):
  _write(tmp_path, {name: {"recipe_digest": "d", "commit": CLEAN}
                    for name in report.RESULTS_FILES})
  (tmp_path / "speedup_emulation.json").write_text(json.dumps({"by_tau": {}}))
  assert report.check_results(str(tmp_path)) == []


def test_stamp_passes_through_a_rerender():
  saved = {"recipe_digest": "d", "commit": CLEAN, "header": "h", "rows": []}
  assert report.stamp_of(saved) == {"recipe_digest": "d", "commit": CLEAN}
  assert report.stamp_line(report.stamp_of(saved)) == f"recipe_digest d, commit {CLEAN}"
  assert report.stamp_of({"recipe_digest": None, "commit": CLEAN}) == {"commit": CLEAN}
  assert set(report.stamp("d")) == set(report.STAMP_FIELDS)


@pytest.mark.parametrize(("row", "want"), [
  ({"R@1": 0.25}, "0.2500"), ({"num": 4}, "4"), ({"counts": {"duplicate": 2}}, "2"),
  ({}, "-")])
def test_cell_reads_a_field_or_an_answer_kind_count(row, want):
  column = "duplicate" if "counts" in row else next(iter(row), "R@1")
  assert report.cell(row, column, "-") == want


def test_a_paired_difference_cell_and_its_header():
  assert report.interval([0.01, -0.002, 0.0215]) == "+0.0100 [-0.0020, +0.0215]"
  assert report.interval_column("R@1") == "dR@1 [95% CI]"
