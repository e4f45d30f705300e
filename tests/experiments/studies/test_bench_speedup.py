"""experiments/studies/bench_speedup.py --merge: several runs' reports as one table, best-block
lines and plot, run as a script (no replay; the replay itself is timed on big models, a
benchmark)."""

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCRIPT = os.path.join(REPO, "experiments", "studies", "bench_speedup.py")


def _row(shape, params, method, block, tau, speedup, prompt_len=256):
  return dict(shape=shape, dtype="float32", params=params, prompt_len=prompt_len, length=35,
              method=method, block=block, tau=tau, forwards=14, tokens_per_s=1.0,
              ms_per_forward=1.0, cost_ratio=2.0, speedup=speedup, compile_s=0.1)


def _report(path, rows):
  os.makedirs(path)
  json.dump(dict(device="cpu", schedules="s.json", rows=rows),
            open(os.path.join(path, "bench_speedup.json"), "w"))
  return str(path)


def _merge(out, *dirs):
  return subprocess.run([sys.executable, SCRIPT, f"--merge={','.join(dirs)}",
                         f"--report_dir={out}"], capture_output=True, text=True, cwd=REPO,
                        timeout=300, env={**os.environ, "JAX_PLATFORMS": "cpu"})


def test_merge_writes_one_report_over_the_runs_and_refuses_a_configuration_twice(tmp_path):
  """Two runs with an AR baseline each (AR rows may repeat; a diffusion configuration may not)."""
  small = _report(tmp_path / "small", [_row("small", 5e6, "AR", 1, None, None),
                                       _row("small", 5e6, "diffusion", 16, 0.9, 1.2),
                                       _row("small", 5e6, "diffusion", 32, 0.9, 0.9)])
  big = _report(tmp_path / "big", [_row("big", 6e8, "AR", 1, None, None),
                                   _row("small", 5e6, "AR", 1, None, None),  # its own baseline
                                   _row("big", 6e8, "diffusion", 32, 0.9, 1.1, prompt_len=2200)])
  out = tmp_path / "all"
  result = _merge(out, small, big)
  assert result.returncode == 0, result.stderr[-2000:]
  merged = json.load(open(out / "bench_speedup.json"))
  assert [r["source"] for r in merged["rows"]] == [small] * 3 + [big] * 3
  md = open(out / "bench_speedup.md").read()
  assert f"| {small} |" in md  # the source column
  assert "prompt 256, float32: small (5.0M) 1.20x (B=16)" in md  # the best block per shape
  assert "prompt 2200, float32: big (600.0M) 1.10x (B=32)" in md
  assert os.path.getsize(out / "speedup_vs_size.png") > 0  # a (prompt, tau) with no row: a panel
  result = _merge(tmp_path / "again", small, small)
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert "--merge: ('small', 'float32', 256, 16, 0.9) is in both" in result.stderr


def test_flags_without_a_recorded_schedule_are_one_line_errors(tmp_path):
  """A block size or tau with no recorded schedule and --repeats < 1 name the flag and what it
  allows, before any model is built; nothing is written (no fresh report directory)."""
  schedules = "docs/results/benchmarks/speedup/schedules.json"
  cases = {"--block_sizes=64": f"--block_sizes=64: no recorded schedule in {schedules} "
                               "(recorded: 4, 8, 16, 32)",
           "--taus=0.95": f"--taus=0.95: no recorded schedule in {schedules} "
                          "(recorded: 0.4, 0.6, 0.9)",
           "--repeats=0": "--repeats=0: 0 is not a positive integer"}  # absl's lower_bound
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "TMPDIR": str(tmp_path)}
  procs = {flag: subprocess.Popen([sys.executable, SCRIPT, flag, "--hf_check=false"], cwd=REPO,
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for flag in cases}
  for flag, proc in procs.items():
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "Traceback" not in err, err[-2000:]
    assert cases[flag] in err
  assert not os.listdir(tmp_path)
