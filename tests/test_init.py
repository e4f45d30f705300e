"""gr2jax/__init__.py: the CPU default where no accelerator exists."""

import os
import subprocess
import sys

import gr2jax

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_no_accelerator_means_the_cpu_without_a_cuda_traceback():
  """This machine (and CI) has the compile-only CUDA plugin and no NVIDIA driver: a fresh process
  with no JAX_PLATFORMS gets the CPU backend and no CUDA load failure in its log, whether JAX
  was imported before gr2jax or after."""
  env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
  for order in ("import jax, gr2jax", "import gr2jax, jax"):
    out = subprocess.run(
        [sys.executable, "-c", f"{order}; print(jax.default_backend())"], cwd=REPO, env=env,
        capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "cpu"
    assert "Unable to load CUDA" not in out.stderr, order


def test_a_chosen_platform_or_an_accelerator_is_left_alone(monkeypatch, tmp_path):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu,tpu")
  assert not gr2jax.default_to_cpu_without_accelerator()
  assert os.environ["JAX_PLATFORMS"] == "cpu,tpu"
  monkeypatch.delenv("JAX_PLATFORMS")
  (tmp_path / "accel0").touch()
  monkeypatch.setattr(gr2jax, "ACCELERATOR_FILES", (str(tmp_path / "accel*"),))
  assert not gr2jax.default_to_cpu_without_accelerator()
  assert "JAX_PLATFORMS" not in os.environ


def test_every_export_is_the_named_object():
  """gr2jax.X is the function or class X (the two module exports are modules)."""
  import types

  import gr2jax

  for name in gr2jax.__all__:
    value = getattr(gr2jax, name)
    assert isinstance(value, types.ModuleType) == (name in gr2jax._MODULES), name
    assert callable(value) or name == "recipes", name
