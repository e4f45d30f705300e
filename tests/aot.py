"""The compile-only GPU / TPU packages (requirements-aot.txt) a test compiles with: a machine
without them (after the README's first command alone) skips such a test, naming the install
that enables it; under CI=true (scripts/test.sh installs them) it fails instead."""

import importlib.util
import os

import pytest

PACKAGES = {"cuda": ("jax_plugins.xla_cuda12", "nvidia.cuda_nvcc", "nvidia.cudnn"),
            "tpu": ("libtpu",)}
INSTALL = "SETUP_AOT=1 bash scripts/setup.sh (pip install -r requirements-aot.txt)"


def installed(module: str) -> bool:
  try:
    return importlib.util.find_spec(module) is not None
  except ModuleNotFoundError:  # its parent package is missing
    return False


def require(platform: str) -> None:
  """Skips (or, under CI=true, fails) when the platform's ('cuda' | 'tpu') compile-only packages
  are missing."""
  missing = [m for m in PACKAGES[platform] if not installed(m)]
  if missing:
    message = f"compile-only {platform} packages missing ({', '.join(missing)}): {INSTALL}"
    if os.environ.get("CI", "").lower() == "true":
      pytest.fail(message)
    pytest.skip(message)
