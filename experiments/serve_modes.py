"""bench_serve --modes: the order the modes run in and auto's ratios to the fixed modes.

Pure functions over the load levels' records, apart from the script (which defines flags), so
that tests import them alone.
"""

import collections

import numpy as np


def round_order(modes: list, r: int) -> list:
  """The modes in the order round r drives them (a Williams design): rounds 0 .. n-1 rotate
  them, so each mode takes each place once; rounds n .. 2n-1 run the same rotations reversed,
  so over 2n rounds each mode runs right after every other equally often."""
  k = r % len(modes)
  order = list(modes[k:]) + list(modes[:k])
  return order[::-1] if (r // len(modes)) % 2 else order


def auto_vs_fixed(runs: list) -> list:
  """Per concurrency: auto's throughput over the better fixed mode's (the higher) and its p50
  over the lower fixed p50, each paired within a round (the modes of one round run minutes
  apart; rounds drift more than that), then the median over the rounds, with the rounds' range.

  Args:
    runs: one load level per (round, mode, concurrency): {"round", "mode", "concurrency",
      "throughput_rps", "p50_ms"}.
  """
  out = []
  for c in sorted({lv["concurrency"] for lv in runs}):
    paired = []
    for r in sorted({lv["round"] for lv in runs}):
      at = {lv["mode"]: lv for lv in runs if lv["concurrency"] == c and lv["round"] == r}
      fixed = [lv for mode, lv in at.items() if mode != "auto"]
      if "auto" not in at or not fixed:
        continue
      best = max(fixed, key=lambda lv: lv["throughput_rps"] or 0.0)
      fastest = min(fixed, key=lambda lv: lv["p50_ms"] or float("inf"))
      paired.append({"throughput": at["auto"]["throughput_rps"] / best["throughput_rps"],
                     "p50": at["auto"]["p50_ms"] / fastest["p50_ms"],
                     "best_fixed": best["mode"], "lowest_p50_fixed": fastest["mode"]})
    if not paired:
      continue
    ratio = lambda key, paired=paired: [p[key] for p in paired]
    most = lambda key, paired=paired: collections.Counter(
      p[key] for p in paired).most_common(1)[0][0]
    out.append({"concurrency": c, "rounds": len(paired),
                "best_fixed": most("best_fixed"), "lowest_p50_fixed": most("lowest_p50_fixed"),
                **{f"{key}_ratio": float(np.median(ratio(key))) for key in ("throughput", "p50")},
                **{f"{key}_ratio_range": [min(ratio(key)), max(ratio(key))]
                   for key in ("throughput", "p50")}})
  return out
