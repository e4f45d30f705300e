"""experiments/studies/bench_memory.py end to end on the tiny preset: one row per (dtype, prompt,
step), the bytes of a step as its definition says (weights + the whole cache + f32 logits), ratios
to a copy and matmuls timed in the same run. The benchmark itself (0.6B shape) is a script."""

import json
import os
import subprocess
import sys

import pytest

from gr2jax.model.config import ModelConfig
from gr2jax.model.params import param_count

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def test_rows_bytes_and_ratios(tmp_path):
  out = tmp_path / "rows.json"
  subprocess.run([sys.executable, os.path.join(REPO, "experiments", "studies", "bench_memory.py"),
                  "--preset=tiny", "--prompt_lens=16", "--dtypes=float32", "--repeats=1",
                  "--copy_mib=16", "--generate_tokens=32", "--generate_repeats=2",
                  f"--json_out={out}"], check=True, capture_output=True,
                 env={**os.environ, "PYTHONPATH": REPO})
  rows = json.loads(out.read_text())
  assert [(r["step"], r["prompt"]) for r in rows] == [("ar", 16), ("block", 16),
                                                      ("generate", 16)]
  c = ModelConfig.tiny()
  for row, width, slots in zip(rows, (1, 32, 1), (16 + 64, 16 + 64, 16 + 1 + 32), strict=True):
    kv = 2 * c.num_layers * slots * c.num_kv_heads * c.head_dim * 4
    weights = (param_count(c) - c.vocab_size * c.hidden_size * (1 - width / c.vocab_size)) * 4
    assert row["bytes"] == int(weights + kv + width * c.vocab_size * 4)
    for name in ("copy_gbs", "matmul_gflops", "gemm_gflops", "frac_copy", "frac_matmul",
                 "frac_gemm"):
      assert row[name] > 0
    assert row["frac_copy"] == pytest.approx(row["gbs"] / row["copy_gbs"])
    assert row["frac_gemm"] == pytest.approx(row["gflops"] / row["gemm_gflops"])
