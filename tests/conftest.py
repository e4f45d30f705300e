"""Test setup: 8 host devices for sharding tests, offline HF, fp32 matmuls.

The XLA flag must be set before the JAX backend initialises, so it lives here at import time.
"""

import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
# The CPU backend even where the compile-only GPU / TPU plugins (requirements-aot.txt) are
# installed: tests/test_targets.py compiles for those targets through jax.experimental.topologies.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import jax  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
