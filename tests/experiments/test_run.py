"""Tests for experiments/run.py: config resolution, locked configs, unknown stages."""

import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(REPO, "experiments", "run.py")


@pytest.fixture(scope="module")
def run_module():
  """experiments/run.py as one module object (its absl flags may be defined only once per
  process, and tests/experiments/test_configs.py imports it as `experiments.run`)."""
  from experiments import run
  return run


def test_bare_config_name_resolves_to_configs_dir(run_module):
  argv = run_module.resolve_config_arg(["run.py", "--config=data.py", "--workdir=w"])
  assert argv[1] == "--config=" + os.path.join(REPO, "experiments", "configs", "data.py")
  assert argv[2] == "--workdir=w"


def test_existing_path_and_other_args_unchanged(run_module, tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("")
  argv = ["run.py", f"--config={path}", "--config.data.seed=3"]
  assert run_module.resolve_config_arg(argv) == argv


def _run(*args):
  return subprocess.run(
      [sys.executable, RUN, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_config_typo_is_an_error(tmp_path):
  result = _run("--config=data.py", "--config.data.max_histroy=3", f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert "max_histroy" in result.stderr


def test_unknown_stage_is_an_error(tmp_path):
  config = tmp_path / "bad.py"
  config.write_text(
      "import ml_collections\n\n"
      "def get_config():\n  return ml_collections.ConfigDict({'stage': 'nope'})\n")
  result = _run(f"--config={config}", f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert "nope" in result.stderr
