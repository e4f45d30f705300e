"""experiments/roofline.py's prediction (pure arithmetic; the 8B compiles are the script's run)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "experiments"))
import plan  # noqa: E402
import roofline  # noqa: E402
import targets  # noqa: E402


def test_forwards_per_token_drop_the_prefill():
  rows = [{"tau": None, "mean_nfe": 11.0, "mean_response_len": 10.0},
          {"tau": 0.9, "mean_nfe": 5.0, "mean_response_len": 10.0}]
  assert roofline.forwards_per_token(rows) == {None: 1.0, 0.9: 0.4}


def test_prediction_is_the_roofline_of_the_compiled_bytes():
  s, h100 = plan.PRESETS["qwen3_8b"], targets.TARGETS["h100"]
  steps = {"ar": {"bytes": 3.35e10, "flops": 1e9}, "block": {"bytes": 3.35e10, "flops": 1e15}}
  out = roofline.predict(steps, {None: 1.0, 0.9: 0.5}, s, h100)
  ar, diff = out["rows"]
  assert ar["step_s"] == pytest.approx(0.01)  # memory-bound: 33.5 GB at 3.35 TB/s
  assert diff["step_s"] == pytest.approx(1e15 / 989e12)  # compute-bound
  total = lambda fpt, t: out["prefill_s"] + s.response_len * fpt * t
  assert ar["tok_s"] == pytest.approx(s.response_len / total(1.0, 0.01))
  assert diff["speedup"] == pytest.approx(total(1.0, 0.01) / total(0.5, diff["step_s"]))
  assert diff["paper_speedup"] == 2.4 and ar["paper_tok_s"] == 71
  assert out["paper_ar_fraction_of_roofline"] == pytest.approx(71 / ar["tok_s"])
