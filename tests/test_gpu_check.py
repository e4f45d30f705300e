"""scripts/gpu_check.sh --preset=tiny runs end to end on CPU and writes its tables (~40 s).

The GPU session then spends its minutes measuring, not debugging: every section (the decode
kernel against the reference, AR decode MBU,
block diffusion vs AR with the forced schedule, SFT / CFT train-step MFU) runs through the same
code as on a GPU, only with the tiny model. An integration test (CI runs it after the default
tests): a decoder API change that a section's call missed broke the diffusion section once.
"""

import json
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    "decode_kernel": "ok", "ar_decode": "ok", "diffusion": "ok", "train": "ok"}

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

  table = (tmp_path / "gpu_check.md").read_text()
  for heading in ("## Decode kernel", "## AR decode", "## Block diffusion vs AR", "## Train step"):
    assert heading in table
  assert "| diffusion forced K=3 | 0.9 |" in table
