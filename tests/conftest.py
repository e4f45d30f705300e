"""Test setup: 8 host devices for sharding tests, offline HF, fp32 matmuls, quick compiles.

The XLA flags must be set before the JAX backend initialises, so they live here at import time.
`--xla_backend_optimization_level=0` compiles without LLVM's optimisation passes: most of a
test's time is compiling small programs, and this cut it by about a quarter (the programs are
the same HLO; only the machine code is less optimised). Benchmarks and runs never set it.
"""

import os

os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0")
# The CPU backend even where the compile-only GPU / TPU plugins (requirements-aot.txt) are
# installed: tests/test_targets.py compiles for those targets through jax.experimental.topologies.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")


@pytest.fixture(scope="session")
def prepared():
  """The three on-policy prepares on the toy models (tests/train/toy_policy.py prepare_all),
  shared by the policy tests (tests/decoding/) and the stages' (tests/train/)."""
  from tests.train.toy_policy import prepare_all

  return prepare_all()
