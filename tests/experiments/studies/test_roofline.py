"""experiments/studies/roofline.py's prediction (pure arithmetic; the 8B compiles are the script's
run)."""


import pytest

from experiments import plan, targets
from experiments.studies import roofline


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
