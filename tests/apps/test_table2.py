"""gr2jax/apps/table2.py: the report's files (the rows themselves are evaluated end to end in
tests/test_chain.py, on the HF-layout run)."""

import csv
import json

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
