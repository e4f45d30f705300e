"""experiments/serve_modes.py (bench_serve --modes): the mode order over the rounds and auto's
ratios to the fixed modes, paired within each round."""

import collections

import pytest

from experiments import serve_modes


def test_over_2n_rounds_each_mode_takes_each_place_and_follows_every_other_equally():
  modes = ["ar", "lossless", "auto"]
  orders = [serve_modes.round_order(modes, r) for r in range(6)]
  assert orders[:3] == [["ar", "lossless", "auto"], ["lossless", "auto", "ar"],
                        ["auto", "ar", "lossless"]]
  assert serve_modes.round_order(modes, 6) == orders[0]
  for place in range(3):
    assert sorted(o[place] for o in orders[:3]) == sorted(modes)
  follows = collections.Counter((o[i - 1], o[i]) for o in orders for i in range(1, 3))
  assert set(follows) == {(a, b) for a in modes for b in modes if a != b}
  assert set(follows.values()) == {2}


def _level(r, mode, c, rps, p50):
  return {"round": r, "mode": mode, "concurrency": c, "throughput_rps": rps, "p50_ms": p50}


def test_ratios_are_paired_within_a_round_then_the_median_is_kept():
  # Round 1 is slow for every mode (drift); paired within each round, auto / ar is 1.0, 0.9 and
  # 1.1, so the median is 1.0 and the range [0.9, 1.1].
  runs = [_level(0, "ar", 4, 200.0, 10.0), _level(0, "auto", 4, 200.0, 10.0),
          _level(0, "lossless", 4, 50.0, 40.0),
          _level(1, "ar", 4, 100.0, 20.0), _level(1, "auto", 4, 90.0, 22.0),
          _level(1, "lossless", 4, 40.0, 50.0),
          _level(2, "ar", 4, 300.0, 8.0), _level(2, "auto", 4, 330.0, 8.0),
          _level(2, "lossless", 4, 60.0, 30.0)]
  [row] = serve_modes.auto_vs_fixed(runs)
  assert row["concurrency"] == 4 and row["rounds"] == 3
  assert row["best_fixed"] == "ar" and row["lowest_p50_fixed"] == "ar"
  assert row["throughput_ratio"] == pytest.approx(1.0)
  assert row["throughput_ratio_range"] == pytest.approx([0.9, 1.1])
  assert row["p50_ratio"] == pytest.approx(1.0)
  assert row["p50_ratio_range"] == pytest.approx([1.0, 1.1])


def test_a_concurrency_without_auto_has_no_row():
  assert serve_modes.auto_vs_fixed([_level(0, "ar", 1, 10.0, 1.0)]) == []
