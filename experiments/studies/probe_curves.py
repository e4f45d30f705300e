r"""Each on-policy stage's own objective on held-out users across its steps: curves, JSON + PNG.

A stage run with the held-out probe on (`--config.stages.<stage>.train.probe_prompts=N
--config.stages.<stage>.train.probe_every=K`, gr2jax/train/probe.py) writes its `probe/*`
metrics to `<stage dir>/logs/metrics.jsonl` at step 0, every K steps and at the end. This reads
them for several runs (e.g. the variants of one stage_sweep.py) and draws one panel per metric,
one line per run:

  python experiments/studies/probe_curves.py \
      --runs=lr1e-4=runs/ar_rl_sweep/lr1e-4/ar_rl,lr1e-5=runs/ar_rl_sweep/lr1e-5/ar_rl \
      --out_dir=docs/results/probe_curves/ar_rl

Writes curves.json ({run: {metric: [[step, value], ...]}}, the command) and curves.png, and
prints the table of each run's first and last value per metric (what the stage moved).
"""

import json
import math
import os
import sys

from absl import flags

from gr2jax import cli, files

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command-line flags (defined only when run as a script: tests import this module beside
  other studies that define a --runs of their own)."""
  f = {"flag_values": flag_values}
  flags.DEFINE_list("runs", None, "NAME=STAGE_DIR entries: a stage's directory (its "
                    "logs/metrics.jsonl holds probe/* rows).", **f)
  flags.DEFINE_string("out_dir", None, "Where curves.json and curves.png go.", **f)
  flags.DEFINE_list("metrics", [], "The probe metrics drawn (default: every one the runs "
                    "share).", **f)
  flags.mark_flags_as_required(["runs", "out_dir"], flag_values=flag_values)

PREFIX = "probe/"


def parse_runs(entries: list[str]) -> dict[str, str]:
  """['a=DIR', ...] -> {'a': DIR}; ValueError naming --runs for a bad or repeated entry."""
  runs = {}
  for entry in entries:
    name, sep, path = entry.partition("=")
    if not sep or not name or not path:
      raise ValueError(f"--runs: {entry!r} is not NAME=STAGE_DIR")
    if name in runs:
      raise ValueError(f"--runs: {name!r} is named twice")
    runs[name] = path
  if not runs:
    raise ValueError("--runs: give at least one NAME=STAGE_DIR")
  return runs


def read_curves(stage_dir: str) -> dict[str, list[list[float]]]:
  """{metric: [[step, value], ...]} of the probe rows of a stage's metrics.jsonl (the last row
  of a step wins: a resumed run may probe a step twice).

  Raises:
    OSError: no metrics file; ValueError: a file without probe rows (naming the flag to set).
  """
  path = os.path.join(stage_dir, "logs", "metrics.jsonl")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: no metrics file (is {stage_dir} a stage's directory?)")
  by_step: dict[int, dict] = {}
  with open(path) as f:
    for line_no, line in enumerate(f, 1):
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{line_no}: not JSON ({e.msg})") from None
      probe = {k[len(PREFIX):]: v for k, v in row.items() if k.startswith(PREFIX)}
      if probe:
        by_step.setdefault(int(row["step"]), {}).update(probe)
  if not by_step:
    raise ValueError(f"{path}: no probe/* rows; run the stage with "
                     "--config.stages.<stage>.train.probe_prompts=N (train/probe.py)")
  metrics = sorted({m for values in by_step.values() for m in values})
  return {m: [[step, float(by_step[step][m])] for step in sorted(by_step) if m in by_step[step]]
          for m in metrics}


def summary_table(curves: dict[str, dict]) -> str:
  """Markdown: per run and metric, the first and last probed value and their difference."""
  lines = ["| run | metric | first (step) | last (step) | change |", "|---|---|---|---|---|"]
  for run, metrics in curves.items():
    for metric, points in metrics.items():
      (s0, v0), (s1, v1) = points[0], points[-1]
      lines.append(f"| {run} | {metric} | {v0:.4f} ({s0}) | {v1:.4f} ({s1}) | {v1 - v0:+.4f} |")
  return "\n".join(lines)


def run_colours(curves: dict[str, dict]) -> dict[str, str]:
  """{run: matplotlib colour}: the default cycle in the runs' order, whatever metrics each has."""
  return {run: f"C{i % 10}" for i, run in enumerate(curves)}


def plot(curves: dict[str, dict], metrics: list[str], path: str) -> None:
  """One panel per metric, one line per run (PNG), each run in one colour in every panel (a
  panel leaves out the runs without its metric)."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  cols = min(3, len(metrics))
  rows = math.ceil(len(metrics) / cols)
  fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
  colours = run_colours(curves)
  for ax, metric in zip(axes.flat, metrics, strict=False):
    for run, values in curves.items():
      if metric in values:
        steps, ys = zip(*values[metric], strict=True)
        ax.plot(steps, ys, marker="o", markersize=3, label=run, color=colours[run])
    ax.set_title(metric)
    ax.set_xlabel("step")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(metrics):]:
    ax.axis("off")
  handles = [plt.Line2D([], [], color=colours[run], marker="o", markersize=3, label=run)
             for run in curves]
  axes.flat[0].legend(handles=handles, fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  runs = parse_runs(FLAGS.runs or [])
  if not FLAGS.out_dir:
    raise ValueError("--out_dir: give the directory for curves.json and curves.png")
  curves = {name: read_curves(path) for name, path in runs.items()}
  shared = sorted(set.intersection(*(set(c) for c in curves.values())))
  metrics = FLAGS.metrics or shared
  unknown = sorted(set(metrics) - {m for c in curves.values() for m in c})
  if unknown:
    raise ValueError(f"--metrics: {unknown} not probed by any run; probed: {shared}")
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  files.atomic_write(os.path.join(FLAGS.out_dir, "curves.json"), json.dumps(
    {"command": " ".join(["python", "experiments/studies/probe_curves.py"] + sys.argv[1:]),
     "curves": curves}, indent=1))
  plot(curves, metrics, os.path.join(FLAGS.out_dir, "curves.png"))
  print(summary_table({r: {m: v for m, v in c.items() if m in metrics}
                       for r, c in curves.items()}))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
