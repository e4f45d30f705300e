"""experiments/studies/batch_curve.py: the predicted curve's arithmetic (roofline times of compiled
records, prefills, speed-ups, memory fit), the crossover finder and the table, on written
records; the CPU section run end to end on the tiny shape (integration)."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from experiments import plan, roofline_steps, targets
from experiments.studies import batch_curve
from gr2jax.apps import tables

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "experiments", "studies", "batch_curve.py")
H100 = targets.TARGETS["h100"]


def _step(gb: float, tflop: float, total_gb: float = 20.0) -> dict:
  return {"bytes": gb * 1e9, "flops": tflop * 1e12, "memory": {"total": total_gb * 1e9}}


def test_curve_times_each_mode_at_the_roofline_of_its_forwards():
  s = plan.PRESETS["qwen3_8b"]
  # Batch 1: every forward memory-bound (33.5 GB: 10 ms); batch 64: the block compute-bound.
  steps = {1: {"ar": _step(33.5, 1), "block": _step(33.5, 1), "draft_k8": _step(33.5, 1),
               "verify_k8": _step(33.5, 1)},
           64: {"ar": _step(67, 1), "block": _step(67, 98.9), "draft_k8": _step(67, 98.9, 50),
                "verify_k8": _step(67, 1, 50)}}
  modes = batch_curve.predicted_modes({None: 1.0, 0.9: 0.5}, {(8, 0.0): {"draft": 0.25,
                                                                         "verify": 0.25}},
                                      [0.9], [8], [0.0], 32)
  assert list(modes) == ["AR", "diffusion tau 0.9 B 32", "draft-and-verify K 8"]
  rows = {(r["mode"], r["batch"]): r for r in batch_curve.curve(steps, modes, s, H100)}
  r = s.response_len
  for batch, ar_t, block_t in ((1, 0.01, 0.01), (64, 0.02, 0.1)):
    prefill = roofline_steps.prefill_seconds(s, H100, batch)
    ar = rows[("AR", batch)]
    assert ar["request_s"] == pytest.approx(prefill + r * ar_t)
    assert ar["tok_s"] == pytest.approx(batch * r / ar["request_s"]) and ar["speedup"] == 1.0
    diff = rows[("diffusion tau 0.9 B 32", batch)]
    assert diff["request_s"] == pytest.approx(prefill + r * 0.5 * block_t)
    assert diff["speedup"] == pytest.approx(ar["request_s"] / diff["request_s"])
    dv = rows[("draft-and-verify K 8", batch)]  # two prefills: drafter and verifier
    assert dv["request_s"] == pytest.approx(2 * prefill + r * 0.25 * (block_t + ar_t))
  assert rows[("diffusion tau 0.9 B 32", 64)]["bound"] == {"block": "compute"}
  assert rows[("AR", 64)]["bound"] == {"ar": "memory"}
  # Both models resident: 100 GB does not fit an 80 GB H100; one model's 20 GB does.
  assert rows[("draft-and-verify K 8", 64)]["resident_gb"] == pytest.approx(100)
  assert not rows[("draft-and-verify K 8", 64)]["fits"] and rows[("AR", 64)]["fits"]


def _curve_fixture():
  # Batch 1: every forward memory-bound (10 ms); batch 64: the block and the draft
  # compute-bound at peak, the verify memory-bound at peak (19.9 ms of FLOPs < 20 ms of bytes)
  # and compute-bound at 0.7 of it (28.5 ms).
  steps = {1: {"ar": _step(33.5, 1), "block": _step(33.5, 1), "draft_k8": _step(33.5, 1),
               "verify_k8": _step(33.5, 1)},
           64: {"ar": _step(67, 1), "block": _step(67, 98.9), "draft_k8": _step(67, 98.9),
                "verify_k8": _step(67, 19.7)}}
  modes = batch_curve.predicted_modes({None: 1.0, 0.9: 0.5, 0.6: 0.25},
                                      {(8, 0.0): {"draft": 0.25, "verify": 0.25}},
                                      [0.9, 0.6], [8], [0.0], 32)
  return steps, modes


def test_a_fraction_of_peak_never_gives_more_tokens_per_s():
  s = plan.PRESETS["qwen3_8b"]
  steps, modes = _curve_fixture()
  peak = {(r["mode"], r["batch"]): r for r in batch_curve.curve(steps, modes, s, H100)}
  low = {(r["mode"], r["batch"]): r for r in batch_curve.curve(steps, modes, s, H100, 0.7)}
  assert peak.keys() == low.keys()
  for key, r in low.items():
    assert r["tok_s"] <= peak[key]["tok_s"] and r["peak_fraction"] == 0.7
    # every step memory-bound: the same step times (the prefill, compute-bound, is slower)
    if all(b == "memory" for b in r["bound"].values()):
      assert r["step_ms"] == peak[key]["step_ms"]
  # a compute-bound step is priced at flops / (peak x fraction)
  block = low[("diffusion tau 0.9 B 32", 64)]
  assert block["bound"] == {"block": "compute"}
  assert block["step_ms"]["block"] == pytest.approx(1e3 * 98.9e12 / (989e12 * 0.7))
  # the ridge moves: the verify turns compute-bound at 0.7 of peak
  dv, dv_peak = low[("draft-and-verify K 8", 64)], peak[("draft-and-verify K 8", 64)]
  assert dv_peak["bound"]["verify_k8"] == "memory" and dv["bound"]["verify_k8"] == "compute"
  assert dv["step_ms"]["verify_k8"] == pytest.approx(1e3 * 19.7e12 / (989e12 * 0.7))


def test_all_memory_bound_steps_and_prefill_give_the_same_curve_at_any_fraction():
  s = plan.PRESETS["qwen3_8b"]
  steps, modes = _curve_fixture()
  steps = {1: steps[1]}
  # a target whose prefill is memory-bound too: a bandwidth so low the weights dominate
  slow = dataclasses.replace(H100, hbm_bytes_s=1e11)
  peak = batch_curve.curve(steps, modes, s, slow)
  low = batch_curve.curve(steps, modes, s, slow, 0.7)
  assert [r["tok_s"] for r in low] == [r["tok_s"] for r in peak]
  assert [r["speedup"] for r in low] == [r["speedup"] for r in peak]


def _table3(tmp_path, extra=None):
  """A Table 3 (table3.json in tmp_path, as gr2jax/apps/tables.py writes it): AR, tau 0.9 under
  the recipe's order (distinct) and under confidence, lossless K 8 and K 32."""
  rows = [{"row": label, "order": order, "tau": tau, "R@1": 0.4, "tokens_per_s": 10.0,
           "mean_nfe": nfe, "mean_response_len": 34.0}
          for label, order, tau, nfe in (
            ("AR GR2", None, None, 35.0), ("Diffusion-GR2", "distinct", 0.9, 14.6),
            ("Draft + verify (lossless), K=8 tau_d=0", None, None, 22.0),
            ("Draft + verify (lossless), K=32 tau_d=0", None, None, 20.0),
            ("Diffusion-GR2", "confidence", 0.9, 21.4))]
  saved = {"header": "Table 3 header", "commit_order": "distinct", "rows": rows,
           "full_split": [], **(extra or {})}
  (tmp_path / "table3.json").write_text(json.dumps(saved))
  return saved


def test_the_modes_read_table3s_rows_under_the_recipes_commit_order(tmp_path):
  saved = _table3(tmp_path)
  fpt = roofline_steps.forwards_per_token(saved)
  assert fpt == pytest.approx({None: 1.0, 0.9: 13.6 / 34})  # distinct's, not confidence's 0.6
  modes = batch_curve.predicted_modes(fpt, {}, [0.9], [], [], 32)
  assert modes["diffusion tau 0.9 B 32"]["forwards"] == {"block": fpt[0.9]}
  saved["commit_order"] = "confidence"
  assert roofline_steps.forwards_per_token(saved)[0.9] == pytest.approx(20.4 / 34)


def test_table3_speedups_price_each_row_with_its_own_forwards(tmp_path):
  s = plan.PRESETS["qwen3_8b"]
  steps, _ = _curve_fixture()
  rows = _table3(tmp_path)["rows"]
  spec = {(8, 0.0): {"draft": 0.25, "verify": 0.2}}
  at = batch_curve.table3_speedups(rows, steps[1], spec, s, H100, 0.7)
  t, prefill = 0.01, roofline_steps.prefill_seconds(s, H100, 1, 0.7)  # every step 10 ms
  ar = prefill + s.response_len * (34 / 34) * t
  assert at[0] == 1.0
  assert at[1] == pytest.approx(ar / (prefill + s.response_len * (13.6 / 34) * t))
  assert at[2] == pytest.approx(ar / (2 * prefill + s.response_len * 0.45 * t))
  assert at[3] is None  # K 32: no grid entry, no compiled step
  # the other commit order's row: its own forwards (20.4 / 34 per token), a prediction too
  assert at[4] == pytest.approx(ar / (prefill + s.response_len * (20.4 / 34) * t))


def test_table3_rerender_adds_the_two_columns_and_keeps_the_header(tmp_path):
  s = plan.PRESETS["qwen3_8b"]
  steps, _ = _curve_fixture()
  saved = _table3(tmp_path)
  spec = {(8, 0.0): {"draft": 0.25, "verify": 0.2}}
  rows, columns = batch_curve.table3_with_predictions(saved["rows"], steps[1], spec, s, H100)
  assert columns == ("pred_h100_b1_speedup", "pred_h100_b1_speedup_0.7")
  md = batch_curve.rerender_table3(str(tmp_path / "table3.json"), saved, rows, columns,
                                   "; pred = predicted")
  assert md.startswith("Table 3 header; pred = predicted\n\n")
  assert md.splitlines()[2].endswith("| pred_h100_b1_speedup | pred_h100_b1_speedup_0.7 |")
  assert md.splitlines()[4].endswith("| 1.0000 | 1.0000 |")
  assert md.splitlines()[7].endswith("| n/a | n/a |")
  written = json.load(open(tmp_path / "table3.json"))
  assert written["header"] == "Table 3 header" and written["commit_order"] == "distinct"
  assert [r["R@1"] for r in written["rows"]] == [0.4] * 5  # the other fields kept
  peak, low = (written["rows"][1][c] for c in columns)
  assert 1 < low <= peak  # tau 0.9 wins at batch 1, less at 0.7 of peak (slower prefill)
  other = written["rows"][4]  # tau 0.9 under confidence: more forwards, a smaller speed-up
  assert 1 < other[columns[1]] < low
  # again from what it wrote: the same table
  again = json.load(open(tmp_path / "table3.json"))
  rows, _ = batch_curve.table3_with_predictions(again["rows"], steps[1], spec, s, H100)
  assert batch_curve.rerender_table3(str(tmp_path / "table3.json"), again, rows, columns,
                                     "; pred = predicted") == md


def test_table3_rerender_passes_every_other_top_level_field(tmp_path, monkeypatch):
  saved = _table3(tmp_path, {"provenance": {"workdir": "W", "commit": "abc"}})
  got = {}

  def write_table3(table3, results, note="", extra_columns=()):
    got.update(table3=table3, results=results, columns=extra_columns)
    json.dump(table3, open(f"{results}/table3.json", "w"))
    return table3["header"] + note

  monkeypatch.setattr(tables, "write_table3", write_table3)
  rows = [{**r, "c": 1.0} for r in saved["rows"]]
  batch_curve.rerender_table3(str(tmp_path / "table3.json"), saved, rows, ("c",), "")
  assert got == {"table3": {**saved, "rows": rows}, "results": str(tmp_path), "columns": ("c",)}
  # a writer that drops a field is caught: the real one keeps its own fields only
  monkeypatch.undo()
  with pytest.raises(ValueError, match="did not keep provenance"):
    batch_curve.rerender_table3(str(tmp_path / "table3.json"), saved, saved["rows"], ("c",), "")


def test_a_mode_without_forwards_per_token_is_named():
  with pytest.raises(ValueError, match="tau 0.6, K 4 tau_d 0"):
    batch_curve.predicted_modes({None: 1.0, 0.9: 0.5}, {(8, 0.0): {}}, [0.6], [4, 8], [0.0], 32)


@pytest.mark.parametrize("points, expected", [
  # wins at 16 (1.2x), loses at 32 (0.8x): half-way on log2 batch
  ([(1, 2.0), (16, 1.2), (32, 0.8), (64, 0.5)], {"last_win": 16, "first_loss": 32,
                                                 "batch": 2 ** 4.5}),
  ([(4, 1.0), (1, 1.5)], {"last_win": 4, "first_loss": None, "batch": None}),  # 1.0 still wins
  ([(1, 0.9), (4, 1.5)], {"last_win": None, "first_loss": 1, "batch": None}),
  ([(1, 1.5), (4, 0.9), (8, 1.1)], {"last_win": 1, "first_loss": 4, "batch": pytest.approx(
    2 ** (0.5 / 0.6 * 2))}),  # the first loss counts
])
def test_crossover(points, expected):
  assert batch_curve.crossover(points) == expected


def test_markdown_table_marks_what_does_not_fit_and_names_the_crossover():
  rows = [dict(mode="AR", batch=b, tok_s=100.0 * b, speedup=1.0, request_s=1.0) for b in (1, 2)]
  rows += [dict(mode="dv", batch=1, tok_s=300.0, speedup=3.0, request_s=0.5),
           dict(mode="dv", batch=2, tok_s=1500.0, speedup=0.5, request_s=2.0, fits=False)]
  lines = batch_curve.markdown_table(rows, "s / request")
  assert lines[0] == "| batch | AR: tok/s, x AR, s / request | dv: tok/s, x AR, s / request |"
  assert lines[2] == "| 1 | 100, 1.00x, 1.00 | 300, 3.00x, 0.50 |"
  assert lines[3] == "| 2 | 200, 1.00x, 1.00 | 1,500, 0.50x, 2.00 (does not fit) |"
  assert lines[-1] == ("Crossover (first batch where the mode stops beating AR): dv: batch ~2 "
                       "(wins at 1, loses at 2).")


def test_cpu_rows_label_the_replayed_modes():
  replayed = [dict(method="AR", tau=None, block=1, tokens_per_s=10.0, seconds=2.0, batch=4),
              dict(method="diffusion", tau=0.9, block=32, tokens_per_s=5.0, seconds=4.0,
                   speedup=0.5, batch=4),
              dict(method="draft_verify", tau=0.0, block=32, k=8, tokens_per_s=20.0,
                   seconds=1.0, speedup=2.0, batch=4)]
  rows = batch_curve.cpu_rows(replayed)
  assert [(r["mode"], r["tok_s"], r["speedup"], r["request_s"]) for r in rows] == [
    ("AR", 10.0, 1.0, 2.0), ("diffusion tau 0.9 B 32", 5.0, 0.5, 4.0),
    ("draft-and-verify K 8", 20.0, 2.0, 1.0)]


@pytest.mark.integration
def test_cpu_section_replays_every_mode_at_every_batch(tmp_path):
  """The tiny shape at batch 1 and 2, the lossless schedules (diffusion tau 0.9, K 8): one JSON
  curve per run with every mode at every batch, the table and the plot."""
  result = subprocess.run(
    [sys.executable, SCRIPT, "--sections=cpu",
     "--schedules=docs/results/lossless/schedules.json", "--runs=tiny/float32@32",
     "--cpu_batches=1,2", "--spec_ks=8", "--repeats=1", f"--out_dir={tmp_path}"],
    capture_output=True, text=True, cwd=REPO, timeout=600,
    env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-3000:]
  out = json.load(open(tmp_path / "batch_curve.json"))["cpu"]
  rows = out["tiny/float32 P=32"]["rows"]
  assert sorted((r["mode"], r["batch"]) for r in rows) == sorted(
    (m, b) for m in ("AR", "diffusion tau 0.9 B 32", "draft-and-verify K 8") for b in (1, 2))
  assert all(r["tok_s"] > 0 for r in rows)
  assert "## tiny/float32 P=32, measured on" in open(tmp_path / "batch_curve.md").read()
  assert os.path.getsize(tmp_path / "cpu_curve.png") > 0


def test_a_bad_flag_is_one_line(tmp_path):
  result = subprocess.run(
    [sys.executable, SCRIPT, "--sections=gpu",
     f"--out_dir={tmp_path}"], capture_output=True, text=True, cwd=REPO, timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 1  # refused while absl parses the flags: nothing is compiled
  assert "Traceback" not in result.stderr  # the last line: JAX's plugins may log before it
  line = result.stderr.strip().splitlines()[-1]
  assert line == "--sections=gpu: 'gpu' is not one of predicted, cpu"


def test_a_corrupt_json_file_is_named(tmp_path):
  path = tmp_path / "compiled.json"
  path.write_text('{"header": ')
  with pytest.raises(ValueError) as e:
    batch_curve.read_json(str(path), "delete it")
  assert str(e.value) == f"{path}: not valid JSON (Expecting value at line 1 column 12); delete it"
  path.write_bytes(b"\xff\xfe")
  with pytest.raises(ValueError, match=f"^{path}: not UTF-8 text .*; delete it$"):
    batch_curve.read_json(str(path), "delete it")


def test_a_corrupt_batch_curve_json_is_one_line_naming_it(tmp_path):
  (tmp_path / "batch_curve.json").write_text('{"cpu": {')
  result = subprocess.run(
    [sys.executable, SCRIPT, "--sections=cpu",
     "--schedules=docs/results/lossless/schedules.json", f"--out_dir={tmp_path}"],
    capture_output=True, text=True, cwd=REPO, timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 1 and "Traceback" not in result.stderr
  assert result.stderr.strip().splitlines()[-1] == (
    f"{tmp_path / 'batch_curve.json'}: not valid JSON (Expecting property name enclosed in double "
    "quotes at line 1 column 10); it keeps the sections of earlier commands: repair it, or move "
    "it aside to start afresh")
