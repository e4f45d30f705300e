"""The machine's limits, measured in the benchmark's own process: a copy rate and matmul rates.

Benchmarks divide what a step achieves by these, timed right after it, so a figure is a ratio to
this machine's limit at that moment (bench_memory.py, bench_decode.py).
"""

import time

import jax
import jax.numpy as jnp
import numpy as np


def _seconds(fn) -> float:
  start = time.perf_counter()
  fn()
  return time.perf_counter() - start


def copy_rate_gbs(mib: int = 1024) -> float:
  """A numpy copy of `mib` MiB: (bytes read + written) / seconds / 1e9, best of 3."""
  src = np.ones(mib << 18, np.float32)
  dst = np.empty_like(src)
  best = min(_seconds(lambda: np.copyto(dst, src)) for _ in range(3))
  return 2 * src.nbytes / best / 1e9


def best_seconds(fn, *args, repeats: int = 3) -> float:
  """The best of `repeats` timed calls of the jitted fn(*args) after a warm-up (blocking)."""
  fn(*args).block_until_ready()
  return min(_seconds(lambda: fn(*args).block_until_ready()) for _ in range(repeats))


def gemm_rate_gflops(rows: int, depth: int, width: int, dtype: str) -> float:
  """A jitted [rows, depth] x [depth, width] matmul in `dtype` (e.g. a decode step's GEMM at its
  own row count over the LM head's shape): GFLOP/s, best of 3 after a warm-up."""
  a, b = (jnp.ones(shape, dtype) for shape in ((rows, depth), (depth, width)))
  return 2 * rows * depth * width / best_seconds(jax.jit(lambda a, b: a @ b), a, b) / 1e9


def matmul_rate_gflops(dtype: str) -> float:
  """A jitted [512, 4096] x [4096, 4096] matmul in `dtype`: GFLOP/s, best of 3 after a warm-up."""
  return gemm_rate_gflops(512, 4096, 4096, dtype)
