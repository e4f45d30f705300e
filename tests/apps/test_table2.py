"""gr2jax/apps/table2.py: the report's files and the paired intervals against AR GR2 (the rows
themselves are evaluated end to end in tests/test_chain.py, on the HF-layout run)."""

import csv
import json

import numpy as np
import pytest

from gr2jax import metrics
from gr2jax.apps import table2


def test_write_tables_orders_the_rows_and_writes_md_csv_json_with_the_papers_numbers(tmp_path):
  rows = [{"row": "rl", "label": "+ CFT + OPD -> RL", "split": "test_1615", "num": 4, "R@1": 0.5},
          {"row": "floor", "label": "Pre-rank floor", "split": "validation", "num": 4,
           "R@1": 0.25},
          {"row": "floor", "label": "Pre-rank floor", "split": "test_1615", "num": 4,
           "R@1": 0.25, "counts": {"duplicate": 1}}]
  timings = {"sft": {"seconds": 61.0, "how": "reused"}}
  md = table2.write_tables(rows, timings, {"recipe": "tiny"}, str(tmp_path))
  lines = md.splitlines()
  assert [line.split(" | ")[1] for line in lines[2:5]] == ["Pre-rank floor", "+ CFT + OPD -> RL",
                                                           "Pre-rank floor"]
  assert lines[2].split(" | ")[table2.COLUMNS.index("duplicate") + 2] == "1"
  assert lines[3].endswith("| 0.2951 / 0.5671 / 0.4517 |")  # the paper's RL row
  assert "sft 61 (reused)" in md and "Provenance: recipe tiny" in md
  assert (tmp_path / "table2.md").read_text() == md
  with open(tmp_path / "table2.csv", newline="") as f:
    table = list(csv.reader(f))
  assert table[0][:3] == ["split", "row", "num"] and len(table) == 4
  saved = json.loads((tmp_path / "table2.json").read_text())
  assert saved["paper"]["rl"] == list(table2.PAPER["rl"]) and len(saved["rows"]) == 3


def test_every_row_has_a_paper_entry_and_the_lossless_verifier_is_a_row_stage():
  names = [name for name, _, _ in table2.ROWS]
  assert set(table2.PAPER) == {"floor", "teacher", *names}
  assert set(table2.DIFFUSION_ROWS) < set(names)
  assert table2.LOSSLESS_VERIFIER in {stage for _, _, stage in table2.ROWS}


def _per_user(ranks, users=None):
  ranks = np.asarray(ranks)
  return metrics.PerUser(np.arange(len(ranks)) if users is None else np.asarray(users), ranks)


def test_every_row_but_ar_gr2_gets_its_paired_difference_on_the_same_users():
  rows = [{"row": "ar_gr2", "split": "test_1615", "per_user": _per_user([1, 2, 1, 4])},
          {"row": "floor", "split": "test_1615", "per_user": _per_user([1, 1, 1, 1])},
          {"row": "floor", "split": "test", "per_user": _per_user([1, 1])}]
  out = table2.with_versus(rows)
  assert all("per_user" not in r for r in out)
  assert table2.VERSUS not in out[0] and table2.VERSUS not in out[2]  # no AR GR2 row on 'test'
  versus = out[1][table2.VERSUS]
  assert versus["method"] == "paired bootstrap, 10000 resamples of users, percentile"
  assert versus["R@1"][0] == pytest.approx(0.5)  # AR GR2 has the target first for 2 of 4
  assert versus["N@3"][0] == pytest.approx((1 - 1 / np.log2(3)) / 4 + 1 / 4)
  rows[1]["per_user"] = _per_user([1, 1, 1, 1], users=[3, 2, 1, 0])
  with pytest.raises(ValueError, match="same users"):
    table2.with_versus(rows)


def test_write_tables_renders_the_paired_columns_and_the_stamp(tmp_path):
  rows = table2.with_versus(
    [{"row": "ar_gr2", "label": "AR GR2 (SFT + RL)", "split": "test_1615", "num": 3,
      "R@1": 2 / 3, "per_user": _per_user([1, 1, 2])},
     {"row": "rl", "label": "+ CFT + OPD -> RL", "split": "test_1615", "num": 3, "R@1": 1 / 3,
      "per_user": _per_user([1, 3, 2])}])
  stamp = {"recipe_digest": "066aafb788d55543", "commit": "0" * 40}
  md = table2.write_tables(rows, {}, {"recipe": "tiny"}, str(tmp_path), **stamp)
  lines = md.splitlines()
  assert lines[0].endswith("| dR@1 [95% CI] | dN@3 [95% CI] | paper R@1 / R@3 / N@3 |")
  assert lines[2].split(" | ")[-3:-1] == ["", ""]  # AR GR2 itself
  r1, n3 = lines[3].split(" | ")[-3:-1]
  assert r1.startswith("-0.3333 [") and n3.startswith("-0.") and lines[-1] == (
    "recipe_digest 066aafb788d55543, commit " + "0" * 40)
  with open(tmp_path / "table2.csv", newline="") as f:
    assert list(csv.reader(f))[2][-3] == r1
  saved = json.loads((tmp_path / "table2.json").read_text())
  assert {k: saved[k] for k in stamp} == stamp
  diff, lo, hi = saved["rows"][1]["vs_ar_gr2"]["R@1"]
  assert diff == pytest.approx(-1 / 3) and lo <= diff <= hi
