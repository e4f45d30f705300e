"""experiments/studies/table3_emulation.py: bench_speedup's column added to a rendered Table 3,
idempotently; the tables alone never add it."""

import json

from experiments.studies import table3_emulation
from gr2jax.apps import tables


def test_table3_emulated_speedup_column(tmp_path):
  rows = [{"row": "AR GR2", "tau": None, "R@1": 0.4, "tokens_per_s": 10.0},
          {"row": "Diffusion-GR2", "tau": 1.0, "R@1": 0.4, "tokens_per_s": 2.0},
          {"row": "Diffusion-GR2", "tau": 0.9, "R@1": 0.41, "tokens_per_s": 3.0}]
  md = tables.write_table3(rows, str(tmp_path), "Table 3 header")
  assert "emulated" not in md and md.startswith("Table 3 header\n\n")
  md = table3_emulation.add_emulated_speedup(str(tmp_path), {
    "source": "bench.json", "run": "qwen3_0_6b/float32", "prompt_len": 256,
    "by_tau": {"0.9": {"speedup": 1.61, "block": 8}}})
  assert md.startswith("Table 3 header; emulated_b1_speedup = ")
  lines = md.splitlines()
  assert lines[2].endswith("| emulated_b1_speedup |")
  assert lines[4].endswith("| 1.00x |") and lines[5].endswith("| n/a |")
  assert lines[6].endswith("| 1.61x (B=8) |")
  saved = json.load(open(tmp_path / "table3.json"))
  assert saved["header"] == "Table 3 header" and saved["rows"][2]["emulated_b1_speedup"]
  assert table3_emulation.add_emulated_speedup(str(tmp_path), json.load(
    open(tmp_path / table3_emulation.EMULATION_FILE))) == md  # re-rendering is idempotent
  # The tables themselves ignore the file beside them: a rerun of Table 3 has no such column.
  assert "emulated" not in tables.write_table3(rows, str(tmp_path), "Table 3 header")
