"""Command-line refusals (gr2jax/cli.py): one line on stderr naming the flag, file or field, exit
status 1 and no traceback, unless --verbosity asks for one; through experiments/run.py, a
weights_conversion main and a benchmark script, each as a user runs it. The flag types whose
values absl checks while parsing (cli.define, cli.define_list) and their one-line refusals
(cli.parse_flags); each tool's own probes: tests/experiments/test_flag_checks.py."""

import os
import subprocess
import sys

import pytest
from absl import flags

from gr2jax import cli

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(script: str, *args: str) -> subprocess.CompletedProcess:
  return subprocess.run([sys.executable, os.path.join(REPO, script), *args], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


def _refusal(result: subprocess.CompletedProcess) -> str:
  """The refusal's line: the last of stderr (JAX may log its platform notes before it)."""
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def test_bench_decode_flags_are_one_line_refusals():
  """Its flags are defined when the module loads: one run per probe (each imports JAX), so two
  probes; the others are the same cli types, tested in process below."""
  assert _refusal(_run("experiments/bench_decode.py", "--batch_sizes=-1")) == (
    "--batch_sizes=-1: '-1' is not an integer >= 1")
  assert _refusal(_run("experiments/bench_decode.py", "--new_tokens=0")) == (
    "--new_tokens=0: '0' is not an integer >= 2")


def _flag_values(**definitions) -> flags.FlagValues:
  """A fresh FlagValues with one cli.define (a scalar Item) or cli.define_list (a list default)
  per keyword: name=(default, item[, allow_empty])."""
  flag_values = flags.FlagValues()
  for name, (default, item, *allow_empty) in definitions.items():
    if isinstance(default, list):
      cli.define_list(name, default, name, item, allow_empty=bool(allow_empty),
                      flag_values=flag_values)
    else:
      cli.define(name, default, name, item, flag_values=flag_values)
  return flag_values


def _line(flag_values: flags.FlagValues, *args: str) -> str:
  flag_values.unparse_flags()
  with pytest.raises(SystemExit) as e:
    cli.parse_flags(["tool", *args], flag_values)
  return str(e.value)


def test_items_check_each_value_and_name_the_rule():
  assert cli.integer(1)("8") == 8 and cli.integer(0, 3)(3) == 3
  assert cli.number(0, 1, low_open=True)("1") == 1.0
  assert cli.choice(("ar", "block"))("block") == "block"
  pair = cli.fields(":", TAU=cli.number(0, 1, low_open=True), K=cli.integer(1))
  assert pair("0.9:3") == (0.9, 3) and pair.text((0.9, 3)) == "0.9:3"
  for item, text, rule in [
    (cli.integer(1), "0", "an integer >= 1"), (cli.integer(1), "1.5", "an integer >= 1"),
    (cli.integer(0, 3), "4", "an integer in [0, 3]"),
    (cli.number(0, 1, low_open=True), "0", "a number in (0, 1]"),
    (cli.number(0, 1, low_open=True), "nan", "a number in (0, 1]"),
    (cli.number(0, 1, high_open=True), "1", "a number in [0, 1)"),
    (cli.number(0, low_open=True), "-2", "a number > 0"),
    (cli.choice(("ar", "block")), "blok", "one of ar, block"),
    (pair, "0.9", "TAU:K with TAU a number in (0, 1] and K an integer >= 1"),
    (pair, "0.9:0", "TAU:K with TAU a number in (0, 1] and K an integer >= 1"),
  ]:
    with pytest.raises(ValueError) as e:
      item(text)
    assert str(e.value) == f"{text!r} is not {rule}"


def test_flags_of_items_are_typed_and_refused_in_one_line_while_parsing():
  flag_values = _flag_values(mfu=(0.4, cli.number(0, 1, low_open=True)),
                             sizes=([1, 8], cli.integer(1)), empty=([], cli.integer(1), True))
  cli.parse_flags(["tool"], flag_values)
  assert (flag_values.mfu, flag_values.sizes, flag_values.empty) == (0.4, [1, 8], [])
  flag_values.unparse_flags()
  cli.parse_flags(["tool", "--mfu=1", "--sizes=2, 4", "--empty=3"], flag_values)
  assert (flag_values.mfu, flag_values.sizes, flag_values.empty) == (1.0, [2, 4], [3])
  assert flag_values["sizes"].serialize() == "--sizes=2,4"
  assert _line(flag_values, "--mfu=0") == "--mfu=0: '0' is not a number in (0, 1]"
  assert _line(flag_values, "--sizes=1,0") == "--sizes=1,0: '0' is not an integer >= 1"
  assert _line(flag_values, "--sizes=") == "--sizes=: no entry; each must be an integer >= 1"
  assert _line(flag_values, "--sizs=2") == (
    "Unknown command line flag 'sizs'. Did you mean: sizes ?")


def test_a_flag_error_spanning_lines_is_the_flag_and_its_first_cause():
  """A config file whose get_config raised: ml_collections quotes the traceback in the error
  absl raises; the line is the flag and the first exception's message."""
  try:
    try:
      raise ValueError("unknown variant 'tinyy'; expected RECIPE[,smoke]")
    except ValueError:
      try:
        raise ValueError("Error whilst parsing config file:\n\nTraceback (most recent call "
                         "last):\n  ...")
      except ValueError as e:
        raise flags.IllegalFlagValueError(f"flag --config=cft.py:tinyy: {e}") from e
  except flags.Error as error:
    line = cli.flag_error_line(error)
  assert line == "--config=cft.py:tinyy: unknown variant 'tinyy'; expected RECIPE[,smoke]"


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
  """Every absl main of experiments/ (its studies/ too) and of weights_conversion/ runs under
  cli.run: its flags' refusals and its main's are one line."""
  import glob
  import re

  def mains(*patterns):
    return {os.path.relpath(p, REPO): open(p).read() for pattern in patterns
            for p in glob.glob(os.path.join(REPO, pattern))
            if re.search(r"\b(app|cli)\.run\(", open(p).read())}

  tools = mains("experiments/*.py", "experiments/studies/*.py", "weights_conversion/*.py")
  assert len(tools) >= 19
  assert not [p for p, text in tools.items() if "app.run(" in text], "use cli.run"
