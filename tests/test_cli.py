"""Command-line refusals (gr2jax/cli.py): one line on stderr naming the flag, file or field, exit
status 1 and no traceback, unless --verbosity asks for one; through experiments/run.py, a
weights_conversion main and a benchmark script, each as a user runs it."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, os.path.join(REPO, script), *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def _refusal(result: subprocess.CompletedProcess) -> str:
  """The refusal's line: the last of stderr (JAX may log its platform notes before it)."""
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("args, line", [
  (["--batch_sizes=-1"], "--batch_sizes=-1: each must be an int >= 1"),
  (["--new_tokens=0"], "--new_tokens=0 must be >= 2"),
  (["--prompt_lens=8,x"], "--prompt_lens=8,x: each must be an int >= 1"),
  (["--presets=huge"], "--presets=huge: ['huge'] is not a ModelConfig preset"),
])
def test_bench_decode_flags_are_one_line_refusals(args, line):
  assert _refusal(_run("experiments/bench_decode.py", *args)).startswith(line)


def test_a_conversion_refusal_is_one_line_and_verbosity_shows_the_traceback(tmp_path):
  args = [f"--ar={tmp_path}", f"--out={tmp_path / 'out'}", "--block_size=0"]
  assert _refusal(_run("weights_conversion/ar_to_diffusion.py", *args)) == (
    "--block_size=0 must be >= 1")
  verbose = _run("weights_conversion/ar_to_diffusion.py", *args, "--verbosity=1")
  assert verbose.returncode == 1 and "Traceback" in verbose.stderr
  assert "ValueError: --block_size=0 must be >= 1" in verbose.stderr


def test_a_run_refusal_is_one_line(tmp_path):
  line = _refusal(_run("experiments/run.py", "--config=rerank.py", f"--workdir={tmp_path}"))
  assert line == "rerank.py needs --config.rerank.requests=<JSONL of requests>"


def test_every_command_line_main_refuses_in_one_line():
  """Every absl main of experiments/ (its studies/ too) and weights_conversion/ runs under
  cli.one_line_refusals."""
  import glob
  import os
  import re

  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  patterns = ("experiments/*.py", "experiments/studies/*.py", "weights_conversion/*.py")
  mains = [p for pattern in patterns
           for p in glob.glob(os.path.join(root, pattern)) if "app.run(" in open(p).read()]
  assert len(mains) >= 10
  bare = [os.path.relpath(p, root) for p in mains
          if re.search(r"app\.run\((?!cli\.one_line_refusals\(\)\()", open(p).read())]
  assert not bare, f"mains without cli.one_line_refusals: {bare}"
