"""bench_speedup's column of Table 3: the emulated batch-1 speed-up per tau, added to a rendered
Table 3 (gr2jax/apps/tables.py's table3.{md,json}) in the same results directory.

`python experiments/studies/bench_speedup.py ... --table3_results=DIR` writes DIR/EMULATION_FILE
and re-renders DIR's Table 3 with the column; a later run of the tables rewrites Table 3 without it
(rerun bench_speedup with --table3_results to add it back).
"""

import json
import os

from gr2jax.apps import tables

EMULATION_FILE = "speedup_emulation.json"  # in the results dir: bench_speedup's per-tau
#                                            best-block speed-up of a big random model
COLUMN = "emulated_b1_speedup"
EMULATION_NOTE = ("; emulated_b1_speedup = batch-1 decode speed-up over AR of random weights of "
                  "a bigger Qwen3 shape replaying this model's recorded commit schedule at that "
                  "tau, best block size (experiments/studies/bench_speedup.py, {run}, prompt "
                  "{prompt_len}; an emulation of the trained model's schedule)")


def with_emulation(rows: list[dict], summary: dict) -> tuple[list[dict], str]:
  """Table 3's rows with the emulated speed-up column (1.00x for the AR rows, None where the
  summary has no such tau) and its header note."""
  by_tau = {float(t): v for t, v in summary["by_tau"].items()}
  out = []
  for row in rows:
    best = by_tau.get(row["tau"]) if row["tau"] is not None else None
    cell = "1.00x" if row["tau"] is None else (
      f"{best['speedup']:.2f}x (B={best['block']})" if best else None)
    out.append({**row, COLUMN: cell})
  return out, EMULATION_NOTE.format(**summary)


def add_emulated_speedup(results: str, summary: dict) -> str:
  """Writes bench_speedup's summary (run, prompt_len, by_tau {tau: {speedup, block}}) into the
  results dir and re-renders its Table 3 with the column (idempotent)."""
  with open(os.path.join(results, EMULATION_FILE), "w") as f:
    json.dump(summary, f, indent=1)
  saved = json.load(open(os.path.join(results, "table3.json")))
  header = saved.get("header") or open(os.path.join(results, "table3.md")).read().split(
    "\n\n")[0].split("; " + COLUMN)[0]
  rows, note = with_emulation(saved["rows"], summary)
  return tables.write_table3(rows, results, header, note=note, extra_columns=(COLUMN,))
