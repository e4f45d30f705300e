"""One training stage run under several settings from the same upstream exports (an ablation).

Each variant copies the finished upstream steps of `--base` (a workdir: the data build and the
stages before `--stage`) into `<out_dir>/<variant>/`, runs `experiments/run.py --config=<stage>.py`
there with the variant's overrides plus `--common` (e.g. the evaluation split), and reads the
stage's final evaluation and its step times. A variant whose run finished is reused (the chain's
own reuse rule), so an interrupted sweep resumes where it stopped. Settings are chosen on the
validation users (`--common=--config.eval.split=validation`); the test users are read once per
chosen setting.

  python experiments/stage_sweep.py --base=W --stage=opd --out_dir=runs/opd_sweep \
    --variants='commit_lr5e-6=;left_lr5e-6=--config.stages.opd.opd.context=left_clean' \
    --common='--config.eval.split=validation --config.eval.limit=2000'

Prints one JSON line per variant and writes `sweep.json` + `sweep.md` (the table, each row's
command) to --out_dir.
"""

import json
import os
import shlex
import shutil
import subprocess
import sys

from absl import app, flags

from gr2jax import cli, stage_registry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags (defined only when run as a script: tests import the module
  beside other absl mains)."""
  flags.DEFINE_string("base", None, "A workdir whose upstream steps of --stage are done.")
  flags.DEFINE_enum("stage", None, list(stage_registry.names()), "The stage to run.")
  flags.DEFINE_string("out_dir", None, "One workdir per variant is made under it.")
  flags.DEFINE_string("variants", None,
                      "'name=overrides;name=overrides' (overrides: run.py flags, may be empty).")
  flags.DEFINE_string("common", "", "run.py flags added to every variant.")
  flags.DEFINE_string("config", "", "The stage's config file (default '<stage>.py'), e.g. "
                      "'rl.py:smoke'.")


COLUMNS = ("R@1", "R@1_se", "valid_rate", "duplicate", "malformed_json", "omitted",
           "out_of_set", "truncated", "num", "train_s_per_step")


def parse_variants(text: str) -> list[tuple[str, list[str]]]:
  """'a=--x=1 --y=2;b=' -> [('a', ['--x=1', '--y=2']), ('b', [])]; names unique and plain."""
  variants = []
  for part in filter(None, (p.strip() for p in text.split(";"))):
    name, sep, overrides = part.partition("=")
    name = name.strip()
    if not sep or not name or not name.replace("_", "").replace("-", "").replace(".", "").isalnum():
      raise ValueError(f"--variants: {part!r} is not 'name=overrides' with a plain name")
    if name in dict(variants):
      raise ValueError(f"--variants: {name!r} appears twice")
    variants.append((name, shlex.split(overrides)))
  if not variants:
    raise ValueError("--variants: no variant given")
  return variants


def upstream_entries(base: str, stage: str) -> list[str]:
  """What a variant copies of `base`: everything but the stage and the stages after it (and
  their moved-aside runs, `<stage>.<digest>`)."""
  stages = stage_registry.names()
  later = stages[stages.index(stage):]
  skip = lambda name: any(name == s or name.startswith(f"{s}.") for s in later)  # noqa: E731
  return sorted(name for name in os.listdir(base) if not skip(name) and not name.startswith("."))


def copy_upstream(base: str, stage: str, workdir: str) -> None:
  """Copies the upstream entries into a new `workdir` (nothing if it exists: a resumed sweep)."""
  if os.path.isdir(workdir):
    return
  tmp = f"{workdir}.tmp-{os.getpid()}"
  os.makedirs(tmp)
  for name in upstream_entries(base, stage):
    src, dst = os.path.join(base, name), os.path.join(tmp, name)
    (shutil.copytree if os.path.isdir(src) else shutil.copy2)(src, dst)
  os.rename(tmp, workdir)


def stage_result(workdir: str, stage: str) -> dict:
  """The stage's final evaluation (COLUMNS) and its mean seconds per training step."""
  with open(os.path.join(workdir, stage, "eval_final.json")) as f:
    ev = json.load(f)
  times = []
  with open(os.path.join(workdir, stage, "logs", "metrics.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      if any(k.startswith("train/") for k in row):
        times.append(row["time"])
  per_step = (times[-1] - times[0]) / (len(times) - 1) if len(times) > 1 else float("nan")
  return {**{k: ev[k] for k in ("R@1", "R@1_se", "valid_rate", "num")}, **ev["counts"],
          "train_s_per_step": per_step}


def table(rows: list[dict]) -> str:
  """The sweep's markdown table: one row per variant with its command."""
  head = "| variant | " + " | ".join(COLUMNS) + " | command |"
  lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
  for r in rows:
    cells = [f"{r[c]:.4f}" if isinstance(r[c], float) else str(r[c]) for c in COLUMNS]
    lines.append(f"| {r['variant']} | " + " | ".join(cells) + f" | `{r['command']}` |")
  return "\n".join(lines)


def main(argv):
  del argv
  for name in ("base", "stage", "out_dir", "variants"):
    if FLAGS[name].value is None:
      raise app.UsageError(f"--{name} is required")
  if not os.path.isdir(FLAGS.base):
    raise ValueError(f"--base={FLAGS.base}: not a directory")
  variants = parse_variants(FLAGS.variants)
  config = FLAGS.config or f"{FLAGS.stage}.py"
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  rows = []
  for name, overrides in variants:
    workdir = os.path.join(FLAGS.out_dir, name)
    copy_upstream(FLAGS.base, FLAGS.stage, workdir)
    args = [f"--config={config}", f"--workdir={workdir}", *overrides,
            *shlex.split(FLAGS.common)]
    command = "python experiments/run.py " + " ".join(args)
    print(f"[sweep] {name}: {command}", flush=True)
    rc = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "experiments", "run.py"),
                         *args]).returncode
    if rc:
      raise SystemExit(f"[sweep] {name}: run.py exited with status {rc} (its output above)")
    row = {"variant": name, **stage_result(workdir, FLAGS.stage), "command": command}
    print(json.dumps(row), flush=True)
    rows.append(row)
  with open(os.path.join(FLAGS.out_dir, "sweep.json"), "w") as f:
    json.dump(rows, f, indent=1)
  with open(os.path.join(FLAGS.out_dir, "sweep.md"), "w") as f:
    f.write(table(rows) + "\n")
  print(table(rows))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
