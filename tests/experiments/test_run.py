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
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert "--config.data.max_histroy: data has no field 'max_histroy'; its fields: " in (
    result.stderr) and "max_history" in result.stderr


def test_unknown_stage_is_an_error(tmp_path):
  config = tmp_path / "bad.py"
  config.write_text(
      "import ml_collections\n\n"
      "def get_config():\n  return ml_collections.ConfigDict({'stage': 'nope'})\n")
  result = _run(f"--config={config}", f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert "nope" in result.stderr


def test_merge_xla_flags_appends_the_recipes_and_refuses_a_conflict(run_module):
  merge = run_module.merge_xla_flags
  flag = "--xla_gpu_enable_triton_gemm=false"
  assert merge("", [flag]) == flag
  assert merge("--xla_force_host_platform_device_count=8", [flag]) == (
    f"--xla_force_host_platform_device_count=8 {flag}")
  assert merge(f" {flag} ", [flag]) == flag and merge("--xla_a=1", []) == "--xla_a=1"
  with pytest.raises(ValueError, match="XLA_FLAGS sets --xla_gpu_enable_triton_gemm=true, the "
                                       "recipe's xla_flags --xla_gpu_enable_triton_gemm=false"):
    merge("--xla_gpu_enable_triton_gemm", [flag])


def test_xla_flags_after_the_backend_started_are_an_error(run_module, monkeypatch):
  import jax

  jax.devices()  # the backend has started (with conftest's XLA_FLAGS)
  current = os.environ.get("XLA_FLAGS", "")
  monkeypatch.setenv("XLA_FLAGS", current)
  run_module.apply_xla_flags([])  # nothing new: fine
  with pytest.raises(RuntimeError, match="backend has already started"):
    run_module.apply_xla_flags(["--xla_gpu_enable_triton_gemm=false"])
  assert os.environ["XLA_FLAGS"] == current


def test_the_gpu_flag_is_set_before_the_cpu_backend_starts_and_accepted():
  # XLA parses every platform's flags (it aborts on an unknown one): a qwen3_* recipe's GPU
  # flag is harmless on a CPU-only run.
  code = ("from experiments import run; import os, jax; "
          "run.apply_xla_flags(['--xla_gpu_enable_triton_gemm=false']); "
          "print(os.environ['XLA_FLAGS']); print(float(jax.numpy.ones(3).sum()))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split("\n")[:2] == ["--xla_gpu_enable_triton_gemm=false", "3.0"]


def test_a_workdir_that_is_a_file_is_one_line(run_module, tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  with pytest.raises(SystemExit, match=f"--workdir={path}: exists and is not a directory"):
    run_module.check_workdir(str(path))
  run_module.check_workdir(str(tmp_path / "new" / "W"))
  assert (tmp_path / "new" / "W").is_dir()


def test_an_unknown_override_names_the_flag_and_the_fields(run_module):
  argv = run_module.resolve_config_arg(["run.py", "--config=teacher.py", "--config.data.seed=3",
                                        "--config.teacher.out_dir=x"])
  message = run_module.unknown_override(argv)
  assert message.startswith("--config.teacher.out_dir: teacher has no field 'out_dir'; its "
                            "fields: attempts, batch_size, hf_dir,")
  argv[-1] = "--config.tacher.hf_dir=x"
  assert run_module.unknown_override(argv).startswith(
    "--config.tacher: the config has no field 'tacher'; its fields: data, decode,")
