"""Every tool's and study's flags are checked when absl parses the command line, before main
starts (gr2jax/cli.py): a bad value is one line naming the flag, nothing is built, loaded or run.

In process: the tool's define_flags on a fresh FlagValues, parsed by cli.parse_flags as cli.run
parses a command line. The GPU check also as a user runs it (its imports are light): a bad
number flag is refused before any section runs on the rented machine.
"""

import os
import subprocess
import sys

import pytest
from absl import flags

from experiments import bench_gpu_check, plan
from experiments.studies import (
  bench_memory,
  bench_train,
  cft_validity,
  duplicate_commits,
  step_traffic,
)
from gr2jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUDY = ("--workdir=W", "--ckpt=W/cft/export", "--out=o.json")  # the studies' required flags
PRESETS = "tiny, tiny_deep, tiny_wide, small, qwen3_0_6b, qwen3_8b"
TAU_K = "TAU:K with TAU a number in (0, 1] and K an integer >= 1"


def _parse(define, *args: str) -> flags.FlagValues:
  flag_values = flags.FlagValues()
  define(flag_values)
  cli.parse_flags(["tool", *args], flag_values)
  return flag_values


def _refusal(define, *args: str) -> str:
  with pytest.raises(SystemExit) as e:
    _parse(define, *args)
  return str(e.value)


@pytest.mark.parametrize("define, args, line", [
  (plan.define_flags, ["--mfu=0"], "--mfu=0: '0' is not a number in (0, 1]"),
  (plan.define_flags, ["--mfu=-1"], "--mfu=-1: '-1' is not a number in (0, 1]"),
  (plan.define_flags, ["--reserve=1"], "--reserve=1: '1' is not a number in [0, 1)"),
  (plan.define_flags, ["--points=0"], "--points=0: 0 is not a positive integer"),
  (plan.define_flags, ["--stages=sft,cfft"],  # the registry's stages, then the decoders
   f"--stages=sft,cfft: 'cfft' is not one of {', '.join(plan.PROGRAMS)}"),
  (plan.define_flags, ["--xla_options=xla_cpu_enable_fast_math=yes"],
   "--xla_options=xla_cpu_enable_fast_math=yes: 'xla_cpu_enable_fast_math=yes' is not "
   "name=true|false"),
  (bench_gpu_check.define_flags, ["--forced_tokens_per_step=0.9:3,0.6:x"],
   f"--forced_tokens_per_step=0.9:3,0.6:x: '0.6:x' is not {TAU_K}"),
  (bench_gpu_check.define_flags, ["--forced_tokens_per_step=1.5:3"],
   f"--forced_tokens_per_step=1.5:3: '1.5:3' is not {TAU_K}"),
  (bench_train.define_flags, ["--micro_batches=0"],
   "--micro_batches=0: '0' is not an integer >= 1"),
  (bench_train.define_flags, ["--micro_batches=1,3"],
   "micro_batches=[1, 3], batch_size=16: each --micro_batches entry must divide --batch_size"),
  (bench_train.define_flags, ["--batch_size=0"], "--batch_size=0: 0 is not a positive integer"),
  (bench_train.define_flags, ["--presets=tiny,huge"],
   f"--presets=tiny,huge: 'huge' is not one of {PRESETS}"),
  (bench_train.define_flags, ["--stages=sft,cfd"],
   "--stages=sft,cfd: 'cfd' is not one of sft, cft, opd, rl"),
  (bench_train.define_flags, ["--replay_sweep=2,x"],
   "--replay_sweep=2,x: 'x' is not an integer >= 1"),
  (bench_memory.define_flags, ["--steps=ar,blok"],
   "--steps=ar,blok: 'blok' is not one of ar, block, generate"),
  (bench_memory.define_flags, ["--prompt_lens=256,x"],
   "--prompt_lens=256,x: 'x' is not an integer >= 1"),
  (bench_memory.define_flags, ["--preset=huge"],
   f"--preset=huge: value should be one of <{PRESETS.replace(', ', '|')}>"),
  (step_traffic.define_flags, ["--preset=huge"],
   "--preset=huge: value should be one of <qwen3_0_6b|qwen3_8b|tiny>"),
  (step_traffic.define_flags, ["--steps=ar,generate"],
   "--steps=ar,generate: 'generate' is not one of ar, block"),
  (cft_validity.define_flags, [*STUDY, "--limit=-1"],
   "--limit=-1: -1 is not a non-negative integer"),
  (duplicate_commits.define_flags, [*STUDY, "--limit=-1"],
   "--limit=-1: -1 is not a non-negative integer"),
  (duplicate_commits.define_flags, [*STUDY, "--batch_size=0"],
   "--batch_size=0: 0 is not a positive integer"),
  (duplicate_commits.define_flags, [*STUDY, "--tau=0"], "--tau=0: '0' is not a number in (0, 1]"),
  (duplicate_commits.define_flags, ["--workdir=W", "--out=o.json"],
   "--ckpt=None: Flag --ckpt must have a value other than None."),
])
def test_a_bad_flag_is_one_line_naming_it_before_main(define, args, line):
  assert _refusal(define, *args) == line


def test_defaults_and_good_values_parse_to_typed_values():
  for define, args in ((plan.define_flags, ()), (bench_gpu_check.define_flags, ()),
                       (bench_train.define_flags, ()), (bench_memory.define_flags, ()),
                       (step_traffic.define_flags, ()), (cft_validity.define_flags, STUDY),
                       (duplicate_commits.define_flags, STUDY)):
    _parse(define, *args)
  assert _parse(plan.define_flags, "--mfu=1", "--xla_options=a=true,b=false").xla_options == [
    ("a", True), ("b", False)]
  assert _parse(bench_gpu_check.define_flags).forced_tokens_per_step == [(0.9, 3), (0.6, 4),
                                                                         (0.4, 5)]
  values = _parse(bench_train.define_flags, "--micro_batches=1,2", "--replay_sweep=")
  assert (values.micro_batches, values.replay_sweep) == ([1, 2], [])
  assert _parse(duplicate_commits.define_flags, *STUDY, "--limit=0").limit == 0  # 0 = all


def test_the_gpu_check_refuses_a_bad_number_before_any_section_runs(tmp_path):
  out = tmp_path / "gpu_check"
  result = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", "bench_gpu_check.py"), "--preset=tiny",
     "--forced_tokens_per_step=0.9:3,0.6:0", f"--out_dir={out}"],
    cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == 1 and result.stdout == ""
  assert "Traceback" not in result.stderr  # the last line: JAX's plugins may log before it
  assert result.stderr.strip().splitlines()[-1] == (
    f"--forced_tokens_per_step=0.9:3,0.6:0: '0.6:0' is not {TAU_K}")
  assert not out.exists()  # no section ran: none made its directory or log
