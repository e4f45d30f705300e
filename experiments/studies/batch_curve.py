r"""Speed under load: AR, block diffusion and draft-and-verify against the batch size, predicted
for Qwen3-8B on the real compilers and measured on this CPU.

  # predicted: every forward compiled for one H100 and one TPU v5p chip (~112 compiles, 30 min;
  # the compiles are cached in --out_dir/compiled.json, so a rerun only redoes the arithmetic);
  # also re-renders results/table3.{md,json} with the predicted H100 batch-1 speed-up columns
  python experiments/studies/batch_curve.py --sections=predicted \
      --out_dir=docs/results/speed_under_load
  # measured on this CPU: the recorded schedules replayed at each batch on random weights
  python experiments/studies/batch_curve.py --sections=cpu \
      --schedules=docs/results/lossless/schedules.json --runs=tiny/float32@2200 \
      --cpu_batches=1,4,16,64 --spec_ks=8 --out_dir=docs/results/speed_under_load

predicted  Qwen3-8B bf16, prompt P = 2,200 + R = 256 new tokens per row, one chip of each
           --targets: the AR step (one token after the cache), the block-diffusion step (a block
           of B = 32) and, per K of --spec_ks, the drafter's forward (a block of B, LM head at K
           queries) and the verifier's (K + 1 causal tokens), each compiled at every batch of
           --batches (experiments/roofline_steps.py compile_step; the cache of every row
           donated).
           A forward takes max(bytes / bandwidth, FLOPs / (peak x f)): bytes from the compiled
           program's memory_analysis (arguments + outputs not aliased: the weights and every
           row's cache read once), FLOPs analytic (the GPU compiler has no cost analysis). Every
           curve is priced twice: at f = 1 (peak) and at the target's peak_fraction
           (experiments/targets.py: 0.7, an assumption with its source there); the bandwidth is
           full in both. Forwards per output token are the trained tiny models' recorded
           schedules: AR GR2's and Diffusion-GR2's at every tau of --table3 under its
           commit_order (the chosen model's Table 3, the recipe's own order's rows; --taus
           narrows them), draft-and-verify's drafter and verifier forwards at
           tau_d of --spec_taus from --grid_json (bench_speculative.py's grid over the 1,615 test
           users: Table 3's lossless rows record the two models' forwards summed, not apart). Per
           mode and batch N (roofline_steps.decode_seconds): seconds per request = the prefills of N
           rows (two for draft-and-verify: drafter and verifier) + R x forwards per token x step
           time; tokens/s per replica = N R / seconds per request; speed-up = AR's seconds per
           request / the mode's at the same N. Resident memory: the mode's compiled forwards'
           totals summed (draft-and-verify: both models and caches).
           With --table3_columns, --table3's table3.{md,json} (beside it) are re-rendered with
           pred_h100_b1_speedup and pred_h100_b1_speedup_<f>: each row's predicted speed-up over
           AR GR2 at batch 1 on the H100 at peak and at f (its own forwards per token: a diffusion
           row of any commit order its own; a lossless row's drafter / verifier forwards from
           --grid_json at its K and tau_d); every other field of table3.json is kept.
cpu        The same modes on this CPU: experiments/emulate.py timed_replay (bench_speedup.py's)
           of the recorded schedules (--schedules; every row of a batch replays the
           representative user's schedule, so the rows step together) on random weights of each
           --runs shape, at each batch of --cpu_batches, timed with the prefill excluded; AR and
           the other modes interleaved in each of --repeats rounds (fastest kept), so every
           ratio comes from one process.
           Each run's curve is kept with its command: a later command adds or replaces runs.

--nocompile uses compiled.json's records only: a forward it does not hold is an error naming it.
The crossover of a mode is the first batch at which it stops beating AR (speed-up < 1), with the
batch interpolated on log2 N between the last batch that wins and that one. Outputs (--out_dir):
batch_curve.json (both sections, each with its command), batch_curve.md, batch_curve.png
(predicted tokens/s and speed-up vs batch per target), cpu_curve.png.
"""

import json
import math
import os
import sys

from absl import app, flags, logging

from experiments import emulate, plan, roofline_steps, targets
from gr2jax import cli, files
from gr2jax.apps import tables

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("predicted", "cpu")


def define_flags() -> None:
  """The command-line flags (with the replay flags: experiments/emulate.py define_replay_flags),
  each value checked when absl parses it, before anything is compiled or measured."""
  emulate.define_replay_flags()
  flags.adopt_module_key_flags(emulate)
  cli.define_list("sections", list(SECTIONS), "Which parts to run.", cli.choice(SECTIONS))
  cli.define_list("targets", ["h100", "tpu_v5p"], "Compile targets of the prediction "
                  "(experiments/targets.py keys).", cli.choice(sorted(targets.TARGETS)))
  cli.define_list("batches", [1, 4, 8, 16, 32, 64, 128], "Batch sizes of the prediction.",
                  cli.integer(1))
  cli.define_list("cpu_batches", [1, 4, 16, 64], "Batch sizes measured on this CPU.",
                  cli.integer(1))
  flags.DEFINE_string("table3", os.path.join(REPO, "results", "table3.json"),
                      "The chosen model's Table 3: AR's and the diffusion model's forwards per "
                      "token at every tau under its commit_order (all of them unless --taus "
                      "names some).")
  flags.DEFINE_bool("table3_columns", True, "Re-render --table3's table3.{md,json} with the "
                    "predicted H100 batch-1 speed-up columns (needs h100 in --targets and batch "
                    "1 in --batches).")
  flags.DEFINE_bool("compile", True, "Compile a forward compiled.json does not hold (False: "
                    "refuse, naming it).")
  flags.DEFINE_string("grid_json", os.path.join(REPO, "docs", "results", "lossless",
                                                "bench_speculative.json"),
                      "bench_speculative.py's report: draft-and-verify forwards per token.")
  flags.DEFINE_string("out_dir", None, "Where the outputs go (required).")
  # The modes: --taus 0.9 for the cpu section (the predicted one takes every tau of --table3
  # unless --taus is given), K 4 / 8 / 16 with one-step drafts.
  FLAGS.set_default("taus", [0.9])
  FLAGS.set_default("spec_ks", [4, 8, 16])
  FLAGS.set_default("spec_taus", [0.0])
  FLAGS.set_default("block_sizes", [32])


def read_json(path: str, note: str):
  """The JSON of the file `path`; one that is not JSON is a ValueError naming it, where it
  breaks, and `note` (what the file is, what to do)."""
  try:
    with open(path) as f:
      return json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{path}: not valid JSON ({e.msg} at line {e.lineno} column {e.colno}); "
                     f"{note}") from None
  except UnicodeDecodeError as e:
    raise ValueError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); {note}") from None


# ---- modes and the curve (pure) -------------------------------------------------------------


def mode_name(method: str, tau: float | None = None, k: int | None = None,
              block: int | None = None) -> str:
  """A mode's label: 'AR', 'diffusion tau 0.9 B 32', 'draft-and-verify K 8' (+ ' tau_d T' for
  multi-step drafts)."""
  if method == "AR":
    return "AR"
  if method == "diffusion":
    return f"diffusion tau {tau:g} B {block}"
  return f"draft-and-verify K {k}" + ("" if not tau else f" tau_d {tau:g}")


def predicted_modes(fpt: dict, spec_fpt: dict, taus: list[float], ks: list[int],
                    spec_taus: list[float], block: int) -> dict:
  """{mode name: {'forwards': {step name: forwards per output token}, 'prefills': n}}.

  Args:
    fpt: roofline_steps.forwards_per_token of Table 3 ({None: AR, tau: diffusion under the
      recipe's commit order}).
    spec_fpt: roofline_steps.speculative_forwards_per_token of the grid ({(K, tau_d): ...}).
    taus, ks, spec_taus: the modes asked for.
    block: the block size B (the label).

  Raises:
    ValueError: a tau or (K, tau_d) the inputs do not hold, named.
  """
  missing = [f"tau {t:g}" for t in taus if t not in fpt]
  missing += [f"K {k} tau_d {t:g}" for k in ks for t in spec_taus if (k, t) not in spec_fpt]
  if missing or None not in fpt:
    raise ValueError(f"--taus / --spec_ks / --spec_taus: no forwards per token for "
                     f"{', '.join(missing) or 'AR'} (--table3 / --grid_json)")
  modes = {"AR": {"forwards": {"ar": fpt[None]}, "prefills": 1}}
  for tau in taus:
    modes[mode_name("diffusion", tau, block=block)] = {"forwards": {"block": fpt[tau]},
                                                       "prefills": 1}
  for k in ks:
    for tau in spec_taus:
      f = spec_fpt[(k, tau)]
      modes[mode_name("draft_verify", tau, k)] = {
        "forwards": {f"draft_k{k}": f["draft"], f"verify_k{k}": f["verify"]}, "prefills": 2}
  return modes


def step_list(ks: list[int]) -> list[tuple[str, str, int | None]]:
  """(name, roofline_steps.compile_step kind, K) of every forward the modes run."""
  return [("ar", "ar", None), ("block", "block", None)] + [
    (f"{kind}_k{k}", kind, k) for k in ks for kind in ("draft", "verify")]


def bound(step: dict, target: targets.Target, fraction: float = 1.0) -> str:
  """'memory' or 'compute': the larger term of roofline_steps.step_seconds at `fraction` of peak."""
  memory = step["bytes"] / target.hbm_bytes_s >= step["flops"] / (target.peak_flops * fraction)
  return "memory" if memory else "compute"


def curve(steps: dict, modes: dict, s: plan.Shapes, target: targets.Target,
          fraction: float = 1.0) -> list[dict]:
  """The predicted rows of one target, every compute-bound forward (and prefill) at `fraction`
  of its peak FLOP/s.

  Args:
    steps: {batch: {step name: compiled record (bytes, flops, memory)}}.
    modes: predicted_modes.
    s: the shapes (prompt and response lengths, the model).
    target: bandwidth, peak FLOP/s and the card's memory.
    fraction: the fraction of peak FLOP/s reached (1: peak).

  Returns:
    One row per (batch, mode): step_ms {step: ms}, bound {step: 'memory' | 'compute'},
    per_token_ms, request_s, tok_s, steady_tok_s, speedup over AR, resident_gb, fits,
    peak_fraction.
  """
  card = min(target.cards.values())
  rows = []
  for batch in sorted(steps):
    t = {name: roofline_steps.step_seconds(x, target, fraction) for name, x in steps[batch].items()}
    prefill = roofline_steps.prefill_seconds(s, target, batch, fraction)
    ar_request = None
    for mode, m in modes.items():
      per_token, request = roofline_steps.decode_seconds(m["forwards"], t, m["prefills"], prefill,
                                                   s.response_len)
      ar_request = request if mode == "AR" else ar_request
      used = [steps[batch][name] for name in m["forwards"]]
      resident = sum(x["memory"]["total"] for x in used)
      rows.append({
        "mode": mode, "batch": batch, "step_ms": {n: 1e3 * t[n] for n in m["forwards"]},
        "bound": {n: bound(steps[batch][n], target, fraction) for n in m["forwards"]},
        "forwards_per_token": m["forwards"], "prefill_s": m["prefills"] * prefill,
        "per_token_ms": 1e3 * per_token, "request_s": request,
        "tok_s": batch * s.response_len / request, "steady_tok_s": batch / per_token,
        "speedup": ar_request / request, "resident_gb": resident / 1e9,
        "fits": resident <= card, "peak_fraction": fraction})
  return rows


# ---- Table 3's predicted columns (pure) -----------------------------------------------------


def table3_column(target: targets.Target, fraction: float) -> str:
  """'pred_h100_b1_speedup' (at peak), 'pred_h100_b1_speedup_0.7' (at a fraction of it)."""
  return f"pred_{target.name}_b1_speedup" + ("" if fraction == 1 else f"_{fraction:g}")


def table3_speedups(rows: list[dict], steps: dict, spec_fpt: dict, s: plan.Shapes,
                    target: targets.Target, fraction: float = 1.0) -> list[float | None]:
  """Each Table 3 row's predicted batch-1 speed-up over AR GR2 on `target`.

  Args:
    rows: Table 3's rows (gr2jax/apps/tables.py: AR GR2, Diffusion-GR2 at each tau and commit
      order, the lossless rows 'Draft + verify (lossless), K=k tau_d=t').
    steps: {step name: compiled record} at batch 1 ('ar', 'block', 'draft_kK', 'verify_kK').
    spec_fpt: roofline_steps.speculative_forwards_per_token of the grid (the lossless rows'
      drafter / verifier split, which Table 3 does not record).
    s, target, fraction: the shapes, the target and the fraction of its peak FLOP/s.

  Returns:
    One speed-up per row: AR 1.0; a diffusion row (of any commit order) its own forwards per
    token (roofline_steps.row_forwards_per_token) x the block step; a lossless row the grid's
    draft and verify forwards at its (K, tau_d) and two prefills; None for a lossless row whose
    (K, tau_d) the grid or `steps` lack, and any other row.
  """
  t = {name: roofline_steps.step_seconds(x, target, fraction) for name, x in steps.items()}
  prefill = roofline_steps.prefill_seconds(s, target, 1, fraction)

  def request(forwards, prefills):
    return roofline_steps.decode_seconds(forwards, t, prefills, prefill, s.response_len)[1]

  ar_row = next(r for r in rows if r["row"] == roofline_steps.AR_ROW)
  ar = request({"ar": roofline_steps.row_forwards_per_token(ar_row)}, 1)
  out = []
  for row in rows:
    draft = roofline_steps.lossless_draft(row)
    if row["row"] == roofline_steps.AR_ROW:
      out.append(1.0)
    elif row["row"] == roofline_steps.DIFFUSION_ROW:
      out.append(ar / request({"block": roofline_steps.row_forwards_per_token(row)}, 1))
    elif draft in spec_fpt and {f"draft_k{draft[0]}", f"verify_k{draft[0]}"} <= set(t):
      f, k = spec_fpt[draft], draft[0]
      out.append(ar / request({f"draft_k{k}": f["draft"], f"verify_k{k}": f["verify"]}, 2))
    else:
      out.append(None)
  return out


def table3_with_predictions(rows: list[dict], steps: dict, spec_fpt: dict, s: plan.Shapes,
                            target: targets.Target) -> tuple[list[dict], tuple[str, str]]:
  """Table 3's rows with the two predicted columns (table3_column at peak and at the target's
  peak_fraction, table3_speedups) and the columns' names."""
  columns = tuple(table3_column(target, f) for f in (1.0, target.peak_fraction))
  cells = [table3_speedups(rows, steps, spec_fpt, s, target, f)
           for f in (1.0, target.peak_fraction)]
  return ([{**row, **dict(zip(columns, values, strict=True))}
           for row, *values in zip(rows, *cells, strict=True)], columns)


def rerender_table3(path: str, saved: dict, rows: list[dict], columns: tuple[str, ...],
                    note: str) -> str:
  """Re-renders the Table 3 whose table3.json is `path` (its directory's table3.{md,json} and
  frontier PNG, gr2jax/apps/tables.py's write_table3) with `rows` and the `columns` added, its
  header and every other top-level field of `saved` (the file as read) kept.

  Raises:
    ValueError: a field of `saved` the written table3.json does not keep.
  """
  md = tables.write_table3({**saved, "rows": rows}, os.path.dirname(os.path.abspath(path)),
                           note=note, extra_columns=columns)
  written = read_json(path, "the Table 3 just written")
  lost = [k for k in saved if k != "rows" and written.get(k) != saved[k]]
  if lost:
    raise ValueError(f"{path}: re-rendering Table 3 did not keep {', '.join(lost)}")
  return md


def crossover(points: list[tuple[int, float]]) -> dict:
  """Where a mode stops beating AR.

  Args:
    points: (batch, speed-up over AR), any order.

  Returns:
    {'last_win': the largest batch before the first loss with speed-up >= 1 (None: it loses
    from the smallest batch), 'first_loss': the first batch with speed-up < 1 (None: it wins at
    every batch), 'batch': the crossover interpolated linearly on log2 batch between the two
    (None unless both exist)}.
  """
  last_win = first_loss = None
  for batch, speedup in sorted(points):
    if speedup < 1:
      first_loss = (batch, speedup)
      break
    last_win = (batch, speedup)
  out = {"last_win": last_win and last_win[0], "first_loss": first_loss and first_loss[0],
         "batch": None}
  if last_win and first_loss:
    (b0, s0), (b1, s1) = last_win, first_loss
    frac = (s0 - 1) / (s0 - s1)
    out["batch"] = 2 ** (math.log2(b0) + frac * (math.log2(b1) - math.log2(b0)))
  return out


def crossovers(rows: list[dict]) -> dict:
  """{mode: crossover} of every mode but AR of one curve (rows of one target or CPU run)."""
  modes = list(dict.fromkeys(r["mode"] for r in rows if r["mode"] != "AR"))
  return {m: crossover([(r["batch"], r["speedup"]) for r in rows if r["mode"] == m])
          for m in modes}


def crossover_text(c: dict) -> str:
  """'batch ~23 (wins at 16, loses at 32)' / 'wins at every batch' / 'loses from batch 1'."""
  if c["first_loss"] is None:
    return "wins at every batch measured"
  if c["last_win"] is None:
    return f"loses from batch {c['first_loss']}"
  return f"batch ~{c['batch']:.0f} (wins at {c['last_win']}, loses at {c['first_loss']})"


def markdown_table(rows: list[dict], seconds: str, crossover_line: bool = True) -> list[str]:
  """One curve as a table: a line per batch, per mode tokens/s, speed-up over AR and seconds
  (the `seconds` header), rows that do not fit the card marked.

  Args:
    rows: one curve's rows (mode, batch, tok_s, speedup, request_s, optional fits).
    seconds: what request_s is ('s / request' or 's / batch decode').
    crossover_line: end with a line naming each mode's crossover.
  """
  modes = list(dict.fromkeys(r["mode"] for r in rows))
  by = {(r["mode"], r["batch"]): r for r in rows}
  lines = ["| batch | " + " | ".join(f"{m}: tok/s, x AR, {seconds}" for m in modes) + " |",
           "|---|" + "---|" * len(modes)]
  for batch in sorted({r["batch"] for r in rows}):
    cells = []
    for m in modes:
      r = by.get((m, batch))
      if r is None:
        cells.append("-")
        continue
      mark = "" if r.get("fits", True) else " (does not fit)"
      cells.append(f"{r['tok_s']:,.0f}, {r['speedup']:.2f}x, {r['request_s']:.2f}{mark}")
    lines.append(f"| {batch} | " + " | ".join(cells) + " |")
  if not crossover_line:
    return lines
  lines += ["", "Crossover (first batch where the mode stops beating AR): " + "; ".join(
    f"{m}: {crossover_text(c)}" for m, c in crossovers(rows).items()) + "."]
  return lines


# ---- predicted ------------------------------------------------------------------------------


def compiled_steps(names: list[str], batches: list[int], ks: list[int], cache_path: str,
                   compile_missing: bool = True) -> dict:
  """{target: {batch: {step name: record}}}, compiled where --out_dir/compiled.json does not
  hold the record yet (saved after every compile, so an interrupted run keeps its compiles).

  Raises:
    ValueError: not `compile_missing` and a record is missing (named, with the reason when the
      cache was made by other compilers or shapes).
  """
  s = plan.PRESETS["qwen3_8b"]
  header = {"versions": plan.versions(), "prompt_len": s.prompt_len,
            "response_len": s.response_len, "block_size": s.block_size}
  cache = (read_json(cache_path, "the compiles of earlier runs: delete it to compile again")
           if os.path.exists(cache_path) else {})
  stale = cache and cache.get("header") != header
  if cache.get("header") != header:  # other compilers or shapes: nothing reusable
    old, cache = cache.get("header"), {"header": header, "steps": {}}
  out = {}
  for name in names:
    for batch in batches:
      for step, kind, k in step_list(ks):
        key = f"{name}/{step}/{batch}"
        if key not in cache["steps"] and not compile_missing:
          why = (f" (its header {old} is not this run's {header}: other compilers or shapes)"
                 if stale else "")
          raise ValueError(f"--nocompile: {cache_path} holds no compiled {key}{why}")
        if key not in cache["steps"]:
          _, record = roofline_steps.compile_step(kind, s, name, batch, k)
          cache["steps"][key] = {k2: v for k2, v in record.items() if k2 != "options"}
          files.atomic_write(cache_path, json.dumps(cache, indent=1, default=float))
          print(f"[compile] {key}: {record['bytes'] / 1e9:.2f} GB, "
                f"{record['compile_s']:.0f} s", flush=True)
        out.setdefault(name, {}).setdefault(batch, {})[step] = cache["steps"][key]
  return out


def table3_lossless(rows: list[dict], spec_fpt: dict) -> list[dict]:
  """Table 3's lossless rows: their (K, tau_d), their own draft + verify forwards per token
  (both prefills removed; Table 3 records the sum only) and the grid's split at that (K, tau_d)
  (None where the grid has none)."""
  out = []
  for row in rows:
    draft = roofline_steps.lossless_draft(row)
    if draft:
      out.append({"row": row["row"], "k": draft[0], "tau_d": draft[1],
                  "forwards_per_token": (row["mean_nfe"] - 2) / row["mean_response_len"],
                  "grid": spec_fpt.get(draft)})
  return out


def run_predicted(batches: list[int], ks: list[int]) -> dict:
  """The predicted section (module doc), and Table 3's columns (--table3_columns)."""
  saved = read_json(FLAGS.table3, "the file of --table3")
  fpt = roofline_steps.forwards_per_token(saved)
  spec_fpt = roofline_steps.speculative_forwards_per_token(
    read_json(FLAGS.grid_json, "the file of --grid_json")["grid"]["rows"])
  taus = ([float(t) for t in FLAGS.taus] if FLAGS["taus"].present
          else sorted((t for t in fpt if t is not None), reverse=True))
  s = plan.PRESETS["qwen3_8b"]
  modes = predicted_modes(fpt, spec_fpt, taus, ks, [float(t) for t in FLAGS.spec_taus],
                          s.block_size)
  steps = compiled_steps(FLAGS.targets, batches, ks, os.path.join(FLAGS.out_dir,
                                                                  "compiled.json"),
                         FLAGS.compile)
  out = {"command": command_line(), "model": "qwen3_8b bf16", "prompt_len": s.prompt_len,
         "response_len": s.response_len, "block_size": s.block_size,
         "versions": plan.versions(), "table3": shown_path(FLAGS.table3),
         "grid_json": shown_path(FLAGS.grid_json), "modes": modes,
         "table3_lossless": table3_lossless(saved["rows"], spec_fpt), "targets": {}}
  for name in FLAGS.targets:
    target = targets.get_target(name)
    curves = []
    for fraction in (1.0, target.peak_fraction):
      rows = curve(steps[name], modes, s, target, fraction)
      curves.append({"peak_fraction": fraction, "rows": rows, "crossovers": crossovers(rows)})
    out["targets"][name] = {"hbm_bytes_s": target.hbm_bytes_s, "peak_flops": target.peak_flops,
                            "peak_fraction": target.peak_fraction,
                            "card_gb": min(target.cards.values()) / 1e9, "curves": curves}
  if FLAGS.table3_columns:
    target = targets.get_target("h100")
    rows, columns = table3_with_predictions(saved["rows"], steps["h100"][1], spec_fpt, s,
                                            target)
    note = (f"; {columns[0]} / {columns[1]} = predicted batch-1 speed-up over AR GR2 of "
            f"Qwen3-8B bf16 on one H100 with this row's forwards per token (lossless rows: the "
            f"drafter / verifier forwards of {out['grid_json']} at its K and tau_d), each "
            f"forward max(compiled bytes / bandwidth, FLOPs / peak) at 100% / "
            f"{target.peak_fraction:.0%} of bf16 peak (an assumed fraction: "
            f"experiments/targets.py): `{out['command']}`")
    print(rerender_table3(FLAGS.table3, saved, rows, columns, note), flush=True)
    out["table3_columns"] = {"columns": list(columns), "rows": {
      r["row"] + ("" if r["tau"] is None else f" tau {r['tau']:g} {r.get('order') or ''}".rstrip()):
        [r[c] for c in columns]
      for r in rows}}
  return out


# ---- measured on this CPU -------------------------------------------------------------------


def cpu_rows(replayed: list[dict]) -> list[dict]:
  """emulate.timed_replay's rows as curve rows (mode, batch, tok_s, speedup, request_s = the
  batch's decode, prefill excluded); AR's speed-up is 1."""
  return [dict(r, mode=mode_name(r["method"], r["tau"], r.get("k"), r["block"]),
               tok_s=r["tokens_per_s"],
               request_s=r["seconds"], speedup=r.get("speedup") or 1.0) for r in replayed]


def run_cpu(batches: list[int], runs: dict, save) -> None:
  """The cpu section (module doc): each --runs entry's curve into `runs` ({'SHAPE/DTYPE P=N':
  {'command', 'device', 'schedules', 'repeats', 'rows', 'crossovers'}}: the curves of earlier
  commands are kept), `save()` after every batch."""
  import jax

  schedules = read_json(FLAGS.schedules, "the file of --schedules")
  chosen = [emulate.run_entries(schedules, run) for run in FLAGS.runs]  # all checked first
  head = {"command": command_line(), "device": str(jax.devices()[0].device_kind),
          "schedules": shown_path(FLAGS.schedules), "repeats": FLAGS.repeats}
  for run, prompt_lens, entries, spec_entries in chosen:
    config, params = emulate.random_model(*run.split("/"))
    for p in prompt_lens:
      rows = []
      for batch in batches:
        rows += cpu_rows(emulate.timed_replay(config, params, run, entries, spec_entries, p,
                                             batch))
        runs[f"{run} P={p}"] = dict(head, rows=rows, crossovers=crossovers(rows))
        save()
    del params


# ---- report ---------------------------------------------------------------------------------


def fraction_text(fraction: float) -> str:
  """'peak' / '0.7 of peak'."""
  return "peak" if fraction == 1 else f"{fraction:g} of peak"


def predicted_markdown(pred: dict) -> list[str]:
  """The predicted section: per target a table per fraction of peak, the crossovers at each and
  the step times at each."""
  lines = [f"Predicted, {pred['model']}, prompt {pred['prompt_len']:,} + "
           f"{pred['response_len']} new tokens per row, one chip; forwards per token from the "
           f"trained tiny models (AR and block diffusion: {pred['table3']}; draft-and-verify's "
           f"drafter and verifier: {pred['grid_json']}). Command: `{pred['command']}`", ""]
  for r in pred.get("table3_lossless", []):
    grid = r["grid"]
    split = (f"the grid's {grid['draft']:.3f} + {grid['verify']:.3f}" if grid
             else "not in the grid")
    lines.append(f"- Table 3's {r['row']}: draft + verify forwards per token "
                 f"{r['forwards_per_token']:.3f} (their sum only), {split}.")
  lines += [""] if pred.get("table3_lossless") else []
  for name, t in pred["targets"].items():
    lines += [f"## {name} ({t['hbm_bytes_s'] / 1e12:.2f} TB/s, {t['peak_flops'] / 1e12:.0f} "
              f"TFLOP/s bf16, {t['card_gb']:.0f} GB)", ""]
    for c in t["curves"]:
      lines += [f"### Compute-bound forwards at {fraction_text(c['peak_fraction'])} "
                f"({c['peak_fraction'] * t['peak_flops'] / 1e12:.0f} TFLOP/s)", ""]
      lines += markdown_table(c["rows"], "s / request", crossover_line=False) + [""]
    fractions = [fraction_text(c["peak_fraction"]) for c in t["curves"]]
    lines += [f"Crossover batch at {' / '.join(fractions)}: " + "; ".join(
      f"{mode}: " + " / ".join(crossover_text(c["crossovers"][mode]) for c in t["curves"])
      for mode in t["curves"][0]["crossovers"]) + ".", ""]
    steps = list(dict.fromkeys(n for r in t["curves"][0]["rows"] for n in r["step_ms"]))
    lines += [f"Step times, ms at {' / '.join(fractions)}:", "",
              "| batch | " + " | ".join(f"{n} ms" for n in steps) + " |",
              "|---|" + "---|" * len(steps)]
    for batch in sorted({r["batch"] for r in t["curves"][0]["rows"]}):
      cells = {n: [] for n in steps}
      for c in t["curves"]:
        ms, bound = {}, {}
        for r in c["rows"]:
          if r["batch"] == batch:
            ms.update(r["step_ms"])
            bound.update(r["bound"])
        for n in steps:
          cells[n].append(f"{ms[n]:.2f} ({bound[n][0]})")
      lines.append(f"| {batch} | " + " | ".join(" / ".join(cells[n]) for n in steps) + " |")
    lines += ["", "(m) memory-bound, (c) compute-bound.", ""]
  return lines


def markdown(result: dict) -> str:
  lines = ["# Speed under load: tokens/s against the batch size", ""]
  if result.get("predicted"):
    lines += predicted_markdown(result["predicted"])
  for run, r in result.get("cpu", {}).items():
    lines += [f"## {run}, measured on {r['device']}", "",
              f"Random weights, schedules {r['schedules']}, fastest of {r['repeats']} "
              f"interleaved rounds. Command: `{r['command']}`", ""]
    lines += markdown_table(r["rows"], "s / batch decode") + [""]
  return "\n".join(lines) + "\n"


def plot(result: dict, out_dir: str) -> None:
  """batch_curve.png (predicted: tokens/s and speed-up vs batch, a row per target; solid at
  peak, dashed at the target's fraction of it) and cpu_curve.png (the same per CPU run)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  predicted = result.get("predicted", {}).get("targets", {})
  panels = {"batch_curve.png": {name: t["curves"] for name, t in predicted.items()},
            "cpu_curve.png": {run: [c] for run, c in result.get("cpu", {}).items()}}
  for filename, curves in panels.items():
    if not curves:
      continue
    fig, axes = plt.subplots(len(curves), 2, figsize=(10, 3.4 * len(curves)), squeeze=False)
    for (title, pricings), (left, right) in zip(curves.items(), axes, strict=True):
      for c, style in zip(pricings, ("o-", "x--"), strict=False):
        at = "" if c.get("peak_fraction", 1) == 1 else f", {c['peak_fraction']:g} of peak"
        for i, mode in enumerate(dict.fromkeys(r["mode"] for r in c["rows"])):
          rows = sorted((r for r in c["rows"] if r["mode"] == mode), key=lambda r: r["batch"])
          batch = [r["batch"] for r in rows]
          color = f"C{i}"
          left.plot(batch, [r["tok_s"] for r in rows], style, color=color, label=mode + at)
          right.plot(batch, [r["speedup"] for r in rows], style, color=color, label=mode + at)
      left.set(xscale="log", yscale="log", xlabel="batch", ylabel="tokens/s per replica",
               title=title)
      right.set(xscale="log", xlabel="batch", ylabel="speed-up over AR", title=title)
      right.axhline(1.0, color="gray", lw=0.5)
      for ax in (left, right):
        ax.legend(fontsize=5, ncol=2)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, filename), dpi=120)
    plt.close(fig)


def shown_path(path: str) -> str:
  """`path` relative to the checkout when inside it, else as given."""
  rel = os.path.relpath(os.path.abspath(path), REPO)
  return path if rel.startswith("..") else rel


def command_line() -> str:
  return " ".join(["python", "experiments/studies/batch_curve.py"] + sys.argv[1:])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  if not FLAGS.out_dir:
    raise app.UsageError("--out_dir is required")
  batches, cpu_batches, ks = (sorted(set(FLAGS[name].value))
                              for name in ("batches", "cpu_batches", "spec_ks"))
  for name in FLAGS.targets if "predicted" in FLAGS.sections else ():
    if targets.get_target(name).peak_fraction is None:
      raise app.UsageError(f"--targets: {name} states no peak_fraction (experiments/targets.py)")
  if ("predicted" in FLAGS.sections and FLAGS.table3_columns
      and ("h100" not in FLAGS.targets or 1 not in batches)):
    raise app.UsageError("--table3_columns needs h100 in --targets and 1 in --batches (or "
                         "--notable3_columns)")
  for path in (FLAGS.table3, FLAGS.grid_json) if "predicted" in FLAGS.sections else ():
    if not os.path.isfile(path):
      raise app.UsageError(f"{path} does not exist (--table3 / --grid_json)")
  if "cpu" in FLAGS.sections and not os.path.isfile(FLAGS.schedules):
    raise app.UsageError(f"--schedules={FLAGS.schedules} does not exist")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  path = os.path.join(FLAGS.out_dir, "batch_curve.json")
  result = (read_json(path, "it keeps the sections of earlier commands: repair it, or move it "
                     "aside to start afresh") if os.path.exists(path) else {})

  def save(section=None, name=None):
    if section is not None:
      result[name] = section
    files.atomic_write(path, json.dumps(result, indent=1, default=float))
    files.atomic_write(os.path.join(FLAGS.out_dir, "batch_curve.md"), markdown(result))

  if "predicted" in FLAGS.sections:
    plan.use_host_devices(1)
    save(run_predicted(batches, ks), "predicted")
  if "cpu" in FLAGS.sections:
    run_cpu(cpu_batches, result.setdefault("cpu", {}), save)
  plot(result, FLAGS.out_dir)
  print(markdown(result))
  print(f"[batch_curve] wrote {FLAGS.out_dir}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
