"""Tests for gr2jax/metrics.py on hand-made rankings."""

import math

import numpy as np
import pytest

from gr2jax import metrics


def test_target_ranks():
  rankings = np.array([[7, 3, 5], [3, 5, 7], [5, 7, 3], [1, 2, 4]])
  ranks = metrics.target_ranks(rankings, np.array([7, 7, 7, 7]))
  np.testing.assert_array_equal(ranks, [1, 3, 2, metrics.ABSENT])


def test_recall_and_ndcg_by_hand():
  ranks = np.array([1, 2, 3, 4, metrics.ABSENT])
  np.testing.assert_array_equal(metrics.recall_at_k(ranks, 1), [1, 0, 0, 0, 0])
  np.testing.assert_array_equal(metrics.recall_at_k(ranks, 3), [1, 1, 1, 0, 0])
  np.testing.assert_allclose(metrics.ndcg_at_k(ranks, 3), [1, 1 / math.log2(3), 0.5, 0, 0])
  got = metrics.ranking_metrics(ranks, ks=(1, 3))
  assert got == pytest.approx({"R@1": 0.2, "R@3": 0.6, "N@3": (1 + 1 / math.log2(3) + 0.5) / 5})


def test_position_histogram_and_best_fixed_position():
  positions = np.array([0, 0, 1, 9, 9, 9])
  hist = metrics.position_histogram(positions, 10)
  np.testing.assert_allclose(hist, [2 / 6, 1 / 6, 0, 0, 0, 0, 0, 0, 0, 3 / 6])
  assert metrics.best_fixed_position_recall1(positions, 10) == (9, 0.5)
  with pytest.raises(ValueError, match=r"positions must lie in \[0, 5\)"):
    metrics.position_histogram(positions, 5)


def test_shape_errors():
  with pytest.raises(ValueError, match="rankings must be"):
    metrics.target_ranks(np.zeros(3), np.zeros(3))


def test_paired_bootstrap_of_identical_arrays_is_zero():
  a = np.random.default_rng(1).integers(0, 2, 50).astype(float)
  assert metrics.paired_bootstrap(a, a) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_covers_a_known_shift_and_narrows_with_n():
  rng = np.random.default_rng(2)
  widths = []
  for n in (200, 20_000):  # values on a 0.1 grid: few distinct differences, as ranks give
    b = np.round(rng.normal(size=n), 1)
    a = np.round(b + 0.3 + rng.normal(scale=0.5, size=n), 1)  # paired: the same users, shifted
    diff, lo, hi = metrics.paired_bootstrap(a, b)
    assert lo < 0.3 < hi and lo <= diff <= hi
    widths.append(hi - lo)
  assert widths[1] < widths[0] / 5  # ~ 1 / sqrt(n)
  assert metrics.paired_bootstrap(a, b) == metrics.paired_bootstrap(a, b)  # the seed is fixed


def test_paired_bootstrap_counts_are_the_resampling_of_users():
  """The multinomial draws over distinct differences give the interval of drawing user indices."""
  rng = np.random.default_rng(3)
  a, b = rng.integers(0, 2, 300).astype(float), rng.integers(0, 2, 300).astype(float)
  means = (a - b)[rng.integers(0, 300, size=(10_000, 300))].mean(axis=1)
  _, lo, hi = metrics.paired_bootstrap(a, b)
  assert np.percentile(means, [2.5, 97.5]) == pytest.approx([lo, hi], abs=0.01)
  with pytest.raises(ValueError, match="two \\[n\\] arrays"):
    metrics.paired_bootstrap(a, b[:10])
