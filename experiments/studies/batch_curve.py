r"""Speed under load: AR, block diffusion and draft-and-verify against the batch size, predicted
for Qwen3-8B on the real compilers and measured on this CPU.

  # predicted: every forward compiled for one H100 and one TPU v5p chip (~112 compiles, 30 min;
  # the compiles are cached in --out_dir/compiled.json, so a rerun only redoes the arithmetic)
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
           --batches (experiments/studies/roofline.py's compile_step; the cache of every row
           donated).
           A forward takes max(bytes / bandwidth, FLOPs / peak): bytes from the compiled
           program's memory_analysis (arguments + outputs not aliased: the weights and every
           row's cache read once), FLOPs analytic (the GPU compiler has no cost analysis).
           Forwards per output token are the trained tiny models': AR and block diffusion at each
           tau of --taus from --table3 (results/table3.json), draft-and-verify (draft and verify
           forwards at tau_d of --spec_taus) from --grid_json (bench_speculative.py's grid over the
           1,615 test users). Per mode and batch N (roofline.decode_seconds): seconds per request
           = the prefills of N rows (two for draft-and-verify: drafter and verifier) + R x
           forwards per token x step time; tokens/s per replica = N R / seconds per request;
           speed-up = AR's seconds per request / the mode's at the same N. Resident memory: the
           mode's compiled forwards' totals summed (draft-and-verify: both models and caches).
cpu        The same modes on this CPU: bench_speedup.replay of the recorded schedules
           (--schedules; every row of a batch replays the representative user's schedule, so the
           rows step together) on random weights of each --runs shape, at each batch of
           --cpu_batches, timed with the prefill excluded; AR and the other modes interleaved in
           each of --repeats rounds (fastest kept), so every ratio comes from one process.
           Each run's curve is kept with its command: a later command adds or replaces runs.

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

from experiments import plan, targets

# its flags: --runs, --schedules, --taus, --spec_ks, ...
from experiments.studies import bench_speedup, roofline
from gr2jax import cli, files

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECTIONS = ("predicted", "cpu")


def define_flags() -> None:
  flags.DEFINE_list("sections", list(SECTIONS), f"Which parts to run, of {SECTIONS}.")
  flags.DEFINE_list("targets", ["h100", "tpu_v5p"], "Compile targets of the prediction "
                    "(experiments/targets.py keys).")
  flags.DEFINE_list("batches", ["1", "4", "8", "16", "32", "64", "128"],
                    "Batch sizes of the prediction.")
  flags.DEFINE_list("cpu_batches", ["1", "4", "16", "64"], "Batch sizes measured on this CPU.")
  flags.DEFINE_string("table3", os.path.join(REPO, "results", "table3.json"),
                      "The tiny Table 3: AR and block-diffusion forwards per token.")
  flags.DEFINE_string("grid_json", os.path.join(REPO, "docs", "results", "lossless",
                                                "bench_speculative.json"),
                      "bench_speculative.py's report: draft-and-verify forwards per token.")
  flags.DEFINE_string("out_dir", None, "Where the outputs go (required).")
  # The prediction's modes by default: tau 0.9, K 4 / 8 / 16 with one-step drafts.
  FLAGS.set_default("taus", ["0.9"])
  FLAGS.set_default("spec_ks", ["4", "8", "16"])
  FLAGS.set_default("spec_taus", ["0"])
  FLAGS.set_default("block_sizes", ["32"])
  FLAGS.set_default("hf_check", False)


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
    fpt: roofline.forwards_per_token of Table 3 ({None: AR, tau: diffusion}).
    spec_fpt: roofline.speculative_forwards_per_token of the grid ({(K, tau_d): ...}).
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
  """(name, roofline.compile_step kind, K) of every forward the modes run."""
  return [("ar", "ar", None), ("block", "block", None)] + [
    (f"{kind}_k{k}", kind, k) for k in ks for kind in ("draft", "verify")]


def bound(step: dict, target: targets.Target) -> str:
  """'memory' or 'compute': the larger term of roofline.step_seconds."""
  memory = step["bytes"] / target.hbm_bytes_s >= step["flops"] / target.peak_flops
  return "memory" if memory else "compute"


def curve(steps: dict, modes: dict, s: plan.Shapes, target: targets.Target) -> list[dict]:
  """The predicted rows of one target.

  Args:
    steps: {batch: {step name: compiled record (bytes, flops, memory)}}.
    modes: predicted_modes.
    s: the shapes (prompt and response lengths, the model).
    target: bandwidth, peak FLOP/s and the card's memory.

  Returns:
    One row per (batch, mode): step_ms {step: ms}, bound {step: 'memory' | 'compute'},
    per_token_ms, request_s, tok_s, steady_tok_s, speedup over AR, resident_gb, fits.
  """
  card = min(target.cards.values())
  rows = []
  for batch in sorted(steps):
    t = {name: roofline.step_seconds(x, target) for name, x in steps[batch].items()}
    prefill = roofline.prefill_seconds(s, target, batch)
    ar_request = None
    for mode, m in modes.items():
      per_token, request = roofline.decode_seconds(m["forwards"], t, m["prefills"], prefill,
                                                   s.response_len)
      ar_request = request if mode == "AR" else ar_request
      used = [steps[batch][name] for name in m["forwards"]]
      resident = sum(x["memory"]["total"] for x in used)
      rows.append({
        "mode": mode, "batch": batch, "step_ms": {n: 1e3 * t[n] for n in m["forwards"]},
        "bound": {n: bound(steps[batch][n], target) for n in m["forwards"]},
        "forwards_per_token": m["forwards"], "prefill_s": m["prefills"] * prefill,
        "per_token_ms": 1e3 * per_token, "request_s": request,
        "tok_s": batch * s.response_len / request, "steady_tok_s": batch / per_token,
        "speedup": ar_request / request, "resident_gb": resident / 1e9,
        "fits": resident <= card})
  return rows


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


def markdown_table(rows: list[dict], seconds: str) -> list[str]:
  """One curve as a table: a line per batch, per mode tokens/s, speed-up over AR and seconds
  (the `seconds` header), rows that do not fit the card marked.

  Args:
    rows: one curve's rows (mode, batch, tok_s, speedup, request_s, optional fits).
    seconds: what request_s is ('s / request' or 's / batch decode').
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
  lines += ["", "Crossover (first batch where the mode stops beating AR): " + "; ".join(
    f"{m}: {crossover_text(c)}" for m, c in crossovers(rows).items()) + "."]
  return lines


# ---- predicted ------------------------------------------------------------------------------


def compiled_steps(names: list[str], batches: list[int], ks: list[int], cache_path: str) -> dict:
  """{target: {batch: {step name: record}}}, compiled where --out_dir/compiled.json does not
  hold the record yet (saved after every compile, so an interrupted run keeps its compiles)."""
  s = plan.PRESETS["qwen3_8b"]
  header = {"versions": plan.versions(), "prompt_len": s.prompt_len,
            "response_len": s.response_len, "block_size": s.block_size}
  cache = (read_json(cache_path, "the compiles of earlier runs: delete it to compile again")
           if os.path.exists(cache_path) else {})
  if cache.get("header") != header:  # other compilers or shapes: nothing reusable
    cache = {"header": header, "steps": {}}
  out = {}
  for name in names:
    for batch in batches:
      for step, kind, k in step_list(ks):
        key = f"{name}/{step}/{batch}"
        if key not in cache["steps"]:
          _, record = roofline.compile_step(kind, s, name, batch, k)
          cache["steps"][key] = {k2: v for k2, v in record.items() if k2 != "options"}
          files.atomic_write(cache_path, json.dumps(cache, indent=1, default=float))
          print(f"[compile] {key}: {record['bytes'] / 1e9:.2f} GB, "
                f"{record['compile_s']:.0f} s", flush=True)
        out.setdefault(name, {}).setdefault(batch, {})[step] = cache["steps"][key]
  return out


def run_predicted(batches: list[int], ks: list[int]) -> dict:
  """The predicted section (module doc)."""
  fpt = roofline.forwards_per_token(read_json(FLAGS.table3, "the file of --table3")["rows"])
  spec_fpt = roofline.speculative_forwards_per_token(
    read_json(FLAGS.grid_json, "the file of --grid_json")["grid"]["rows"])
  taus = [float(t) for t in FLAGS.taus]
  s = plan.PRESETS["qwen3_8b"]
  modes = predicted_modes(fpt, spec_fpt, taus, ks, [float(t) for t in FLAGS.spec_taus],
                          s.block_size)
  steps = compiled_steps(FLAGS.targets, batches, ks, os.path.join(FLAGS.out_dir,
                                                                  "compiled.json"))
  out = {"command": command_line(), "model": "qwen3_8b bf16", "prompt_len": s.prompt_len,
         "response_len": s.response_len, "block_size": s.block_size,
         "versions": plan.versions(), "table3": os.path.relpath(FLAGS.table3, REPO),
         "grid_json": os.path.relpath(FLAGS.grid_json, REPO), "modes": modes, "targets": {}}
  for name in FLAGS.targets:
    target = targets.get_target(name)
    rows = curve(steps[name], modes, s, target)
    out["targets"][name] = {"hbm_bytes_s": target.hbm_bytes_s, "peak_flops": target.peak_flops,
                            "card_gb": min(target.cards.values()) / 1e9, "rows": rows,
                            "crossovers": crossovers(rows)}
  return out


# ---- measured on this CPU -------------------------------------------------------------------


def cpu_rows(replayed: list[dict]) -> list[dict]:
  """bench_speedup.replay's rows as curve rows (mode, batch, tok_s, speedup, request_s = the
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
  chosen = [bench_speedup.run_entries(schedules, run) for run in FLAGS.runs]  # all checked first
  head = {"command": command_line(), "device": str(jax.devices()[0].device_kind),
          "schedules": os.path.relpath(FLAGS.schedules, REPO), "repeats": FLAGS.repeats}
  for run, prompt_lens, entries, spec_entries in chosen:
    config, params = bench_speedup.random_model(*run.split("/"))
    for p in prompt_lens:
      rows = []
      for batch in batches:
        rows += cpu_rows(bench_speedup.replay(config, params, run, entries, spec_entries, p,
                                              batch))
        runs[f"{run} P={p}"] = dict(head, rows=rows, crossovers=crossovers(rows))
        save()
    del params


# ---- report ---------------------------------------------------------------------------------


def markdown(result: dict) -> str:
  lines = ["# Speed under load: tokens/s against the batch size", ""]
  pred = result.get("predicted")
  if pred:
    lines += [f"Predicted, {pred['model']}, prompt {pred['prompt_len']:,} + "
              f"{pred['response_len']} new tokens per row, one chip; forwards per token from "
              f"the trained tiny models ({pred['table3']}, {pred['grid_json']}). Command: "
              f"`{pred['command']}`", ""]
    for name, t in pred["targets"].items():
      lines += [f"## {name} ({t['hbm_bytes_s'] / 1e12:.2f} TB/s, {t['peak_flops'] / 1e12:.0f} "
                f"TFLOP/s, {t['card_gb']:.0f} GB)", ""]
      lines += markdown_table(t["rows"], "s / request") + [""]
      steps = list(dict.fromkeys(n for r in t["rows"] for n in r["step_ms"]))
      lines += ["| batch | " + " | ".join(f"{n} ms" for n in steps) + " |",
                "|---|" + "---|" * len(steps)]
      for batch in sorted({r["batch"] for r in t["rows"]}):
        ms, bound = {}, {}
        for r in t["rows"]:
          if r["batch"] == batch:
            ms.update(r["step_ms"])
            bound.update(r["bound"])
        lines.append(f"| {batch} | " + " | ".join(
          f"{ms[n]:.2f} ({bound[n][0]})" for n in steps) + " |")
      lines += ["", "(m) memory-bound, (c) compute-bound.", ""]
  for run, r in result.get("cpu", {}).items():
    lines += [f"## {run}, measured on {r['device']}", "",
              f"Random weights, schedules {r['schedules']}, fastest of {r['repeats']} "
              f"interleaved rounds. Command: `{r['command']}`", ""]
    lines += markdown_table(r["rows"], "s / batch decode") + [""]
  return "\n".join(lines) + "\n"


def plot(result: dict, out_dir: str) -> None:
  """batch_curve.png (predicted: tokens/s and speed-up vs batch, a row per target) and
  cpu_curve.png (the same per CPU run)."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  panels = {"batch_curve.png": result.get("predicted", {}).get("targets", {}),
            "cpu_curve.png": result.get("cpu", {})}
  for filename, curves in panels.items():
    if not curves:
      continue
    fig, axes = plt.subplots(len(curves), 2, figsize=(10, 3.4 * len(curves)), squeeze=False)
    for (title, c), (left, right) in zip(curves.items(), axes, strict=True):
      for mode in dict.fromkeys(r["mode"] for r in c["rows"]):
        rows = sorted((r for r in c["rows"] if r["mode"] == mode), key=lambda r: r["batch"])
        batch = [r["batch"] for r in rows]
        left.plot(batch, [r["tok_s"] for r in rows], "o-", label=mode)
        right.plot(batch, [r["speedup"] for r in rows], "o-", label=mode)
      left.set(xscale="log", yscale="log", xlabel="batch", ylabel="tokens/s per replica",
               title=title)
      right.set(xscale="log", xlabel="batch", ylabel="speed-up over AR", title=title)
      right.axhline(1.0, color="gray", lw=0.5)
      for ax in (left, right):
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, filename), dpi=120)
    plt.close(fig)


def command_line() -> str:
  return " ".join(["python", "experiments/studies/batch_curve.py"] + sys.argv[1:])


def _ints(name: str) -> list[int]:
  values = getattr(FLAGS, name)
  if not values or not all(v.isdigit() and int(v) >= 1 for v in values):
    raise app.UsageError(f"--{name}={','.join(values)}: each must be an int >= 1")
  return sorted({int(v) for v in values})


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  unknown = sorted(set(FLAGS.sections) - set(SECTIONS))
  if unknown or not FLAGS.sections:
    raise app.UsageError(f"--sections: {unknown or 'empty'} not in {SECTIONS}")
  if not FLAGS.out_dir:
    raise app.UsageError("--out_dir is required")
  for name in FLAGS.targets:
    targets.get_target(name)
  batches, cpu_batches, ks = _ints("batches"), _ints("cpu_batches"), _ints("spec_ks")
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
  app.run(cli.one_line_refusals()(main))
