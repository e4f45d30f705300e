"""experiments/roofline_steps.py: the decoders' forwards at the roofline (the arithmetic; a tiny
compile on the H100 compiler where its compile-only package is installed)."""

import pytest

from experiments import plan, roofline_steps, targets
from tests import aot


def test_forwards_per_token_drop_the_prefill_and_read_the_recipes_order():
  rows = [{"row": "AR GR2", "order": None, "tau": None, "mean_nfe": 11.0,
           "mean_response_len": 10.0},
          {"row": "Diffusion-GR2", "order": "confidence", "tau": 0.9, "mean_nfe": 7.0,
           "mean_response_len": 10.0},
          {"row": "Diffusion-GR2", "order": "distinct", "tau": 0.9, "mean_nfe": 5.0,
           "mean_response_len": 10.0},
          # a lossless row has tau None too: not AR's
          {"row": "Draft + verify (lossless), K=8 tau_d=0", "order": None, "tau": None,
           "mean_nfe": 8.0, "mean_response_len": 10.0}]
  for order, want in (("distinct", 0.4), ("confidence", 0.6)):
    got = roofline_steps.forwards_per_token({"commit_order": order, "rows": rows})
    assert got == pytest.approx({None: 1.0, 0.9: want})
  assert roofline_steps.row_forwards_per_token(rows[1]) == pytest.approx(0.6)
  before = [{k: v for k, v in r.items() if k != "order"} for r in rows[:2]]
  assert roofline_steps.forwards_per_token({"rows": before}) == pytest.approx(  # before orders
    {None: 1.0, 0.9: 0.6})
  with pytest.raises(ValueError, match="no Diffusion-GR2 row under its commit_order "
                     "'left_to_right'"):
    roofline_steps.forwards_per_token({"commit_order": "left_to_right", "rows": rows})


@pytest.mark.parametrize("label, expected", [
  ("Draft + verify (lossless), K=16 tau_d=0", (16, 0.0)),
  ("Draft + verify (lossless), K=8 tau_d=0.9", (8, 0.9)),
  ("AR GR2", None), ("Diffusion-GR2", None)])
def test_lossless_draft_reads_k_and_tau_d_from_the_label(label, expected):
  assert roofline_steps.lossless_draft({"row": label}) == expected


def test_a_fraction_of_peak_slows_compute_bound_steps_only():
  h100 = targets.TARGETS["h100"]
  memory = {"bytes": 3.35e10, "flops": 1e9}
  compute = {"bytes": 3.35e10, "flops": 1e15}
  assert roofline_steps.step_seconds(memory, h100, 0.7) == roofline_steps.step_seconds(memory, h100)
  assert roofline_steps.step_seconds(compute, h100, 0.7) == pytest.approx(1e15 / (989e12 * 0.7))
  s = plan.PRESETS["qwen3_8b"]
  assert roofline_steps.prefill_seconds(s, h100, 1, 0.7) == pytest.approx(
    roofline_steps.prefill_seconds(s, h100) / 0.7)


def test_speculative_forwards_per_token_of_a_grid():
  grid = [{"k": 8, "tau": 0.0, "parts": {"all": {"tokens": 10, "draft_forwards": 3.0,
                                                 "verify_forwards": 2.0}}}]
  assert roofline_steps.speculative_forwards_per_token(grid) == {(8, 0.0): {"draft": 0.3,
                                                                      "verify": 0.2}}


def test_decode_seconds_sums_the_forwards_of_a_token_and_the_prefills():
  per_token, total = roofline_steps.decode_seconds({"draft_k8": 0.5, "verify_k8": 0.25},
                                             {"draft_k8": 0.02, "verify_k8": 0.04, "ar": 9.0},
                                             2, 0.1, 100)
  assert per_token == pytest.approx(0.02) and total == pytest.approx(0.2 + 100 * 0.02)


def test_prefill_is_compute_bound_and_linear_in_the_batch():
  s, h100 = plan.PRESETS["qwen3_8b"], targets.TARGETS["h100"]
  one = roofline_steps.prefill_seconds(s, h100)
  assert one == pytest.approx(roofline_steps.prefill_flops(s) / h100.peak_flops)
  assert roofline_steps.prefill_seconds(s, h100, 8) == pytest.approx(8 * one)


@pytest.mark.parametrize("kind, k", [("draft", None), ("ar", 4), ("prefill", None)])
def test_compile_step_names_a_wrong_step(kind, k):
  with pytest.raises(ValueError, match=f"step '{kind}'"):
    roofline_steps.compile_step(kind, plan.PRESETS["tiny"], "h100", k=k)


def test_a_tiny_verify_forward_at_batch_2_on_the_h100_compiler():
  """Every row's cache is an argument (bytes grow with the batch), FLOPs are per row x rows."""
  aot.require("cuda")
  s = plan.PRESETS["tiny"]
  one = roofline_steps.compile_step("verify", s, "h100", 1, k=3)[1]
  two = roofline_steps.compile_step("verify", s, "h100", 2, k=3)[1]
  assert one["tokens"] == two["tokens"] == 4 and two["batch"] == 2
  assert two["flops"] == 2 * one["flops"] and two["bytes"] > one["bytes"]
