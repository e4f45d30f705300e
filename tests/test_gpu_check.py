"""scripts/gpu_check.sh --preset=tiny runs end to end on CPU and writes its tables (~3 min on 2
cores).

The GPU session then spends its minutes measuring, not debugging: every section (the decode
kernel against the reference, AR decode MBU,
block diffusion vs AR with the forced schedule, SFT / CFT train-step MFU, the teacher-forced
check of bf16 decodes) runs through the same code as on a GPU, only with the tiny model. An
integration test (CI runs it after the default tests): a decoder API change that a section's call
missed broke the diffusion section once. The exactness section's sweep also runs in the default
run, in process, on a smaller model: the definition of exactness held by AR and the lossless mode
in bf16 at batch 1, 8 and 16 on this CPU.
"""

import json
import os
import subprocess

import jax
import numpy as np
import pytest

from experiments import bench_gpu_check
from gr2jax.diffusion import speculative
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_ar_and_lossless_in_bf16_are_exact_at_batch_1_8_16():
  """Random bf16 weights (2 layers, vocab 256) and a 1-layer drafter of them decode 16 prompts at
  batch 1, 8 and 16: every committed token is the teacher-forced arg-max at its batch or a flip
  within exactness.TOLERANCE. The counts and margins are printed (`pytest -s`;
  docs/results/lossless/)."""
  config = ModelConfig.tiny(vocab_size=256, eos_token_ids=(), param_dtype="bfloat16",
                            compute_dtype="bfloat16")
  params = init_params(config, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, 255, (16, 12), dtype=np.int32)
  lengths = rng.integers(3, 13, 16).astype(np.int32)
  rows = bench_gpu_check.exactness_rows(
    params, config, speculative.DraftDecoding(max_new_tokens=32, k=4), prompts, lengths,
    drafter_layers=1)
  for row in rows:
    print({k: row[k] for k in ("batch", "decoder", "positions", "flips", "max_flip_margin",
                               "max_flip_relative", "beyond_tolerance")},
          "rows differing from batch 1:", row["vs_batch_1"]["rows_differing"],
          "from AR:", row.get("vs_ar", {}).get("rows_differing"))
  assert [(r["batch"], r["decoder"]) for r in rows] == [
    (b, d) for b in (1, 8, 16) for d in ("ar", "lossless")]
  for row in rows:
    assert row["positions"] == 16 * 32 and row["beyond_tolerance"] == 0


@pytest.mark.integration
def test_gpu_check_tiny_on_cpu(tmp_path):
  env = {**os.environ, "JAX_PLATFORMS": "cpu"}
  env.pop("XLA_FLAGS", None)  # one CPU device per section, as one GPU would be
  proc = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu_check.sh"), "--preset=tiny",
                         f"--out_dir={tmp_path}"], env=env, capture_output=True, text=True,
                        timeout=1500)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  result = json.loads((tmp_path / "gpu_check.json").read_text())
  assert {k: v["status"] for k, v in result["status"].items()} == {
    "decode_kernel": "ok", "ar_decode": "ok", "diffusion": "ok", "train": "ok",
    "exactness": "ok"}

  assert [r["step"] for r in result["decode_kernel"]] == ["ar", "block"]
  for r in result["decode_kernel"]:  # the Pallas interpreter on CPU; bf16 outputs
    assert r["max_abs_diff"] < 2e-2 and r["kernel_ms"] > 0 and r["reference_ms"] > 0

  (ar,) = result["ar_decode"]
  assert ar["batch"] == 1 and ar["gr2jax_decode_tok_s"] > 0 and ar["achieved_gbs"] > 0
  assert ar["mbu"] is None  # no known peak bandwidth for a CPU

  rows = result["diffusion"]
  assert rows[0]["method"] == "AR" and rows[0]["nfe_per_token"] == 1.0
  forced = {r["tau"]: r for r in rows[1:]}
  assert sorted(forced) == [0.4, 0.6, 0.9]
  for tau, k in ((0.9, 3), (0.6, 4), (0.4, 5)):
    r = forced[tau]
    assert r["forced_k"] == k and r["max_steps_per_block"] == -(-(r["block"] - 1) // k)
    # Random weights commit only the forced arg-max, so every block runs exactly to the cap.
    assert r["denoise_steps_per_token"] == pytest.approx(r["max_steps_per_block"] / r["block"])
    assert r["speedup"] > 0

  train = result["train"]
  assert [(r["stage"], r["rows_per_device"]) for r in train] == [
    ("sft", 1), ("sft", 2), ("cft", 1), ("cft", 2)]
  for r in train:
    assert r["fits"] and r["mode"] == "train_step" and r["step_s"] > 0 and r["mfu"] is None

  exact = result["exactness"]
  assert [(r["batch"], r["decoder"]) for r in exact] == [
    (b, d) for b in (1, 8, 16) for d in ("ar", "lossless")]
  for r in exact:
    assert r["positions"] == 16 * 32 and r["beyond_tolerance"] == 0 and r["device"] == "cpu"

  table = (tmp_path / "gpu_check.md").read_text()
  for heading in ("## Decode kernel", "## AR decode", "## Block diffusion vs AR", "## Train step",
                  "## Exactness in bf16"):
    assert heading in table
  assert "| diffusion forced K=3 | 0.9 |" in table
