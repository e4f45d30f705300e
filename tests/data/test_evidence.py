"""Tests for gr2jax/data/evidence.py on a hand-made catalogue."""

import numpy as np
import pytest

from gr2jax.data import evidence
from gr2jax.data.records import Catalog
from gr2jax.data.split import PAD

# item: brand, category path
_ITEMS = [("A", ("Beauty", "Makeup", "Nails", "Polish")),      # 0
          ("A", ("Beauty", "Makeup", "Nails", "Remover")),     # 1
          ("B", ("Beauty", "Makeup", "Nails", "Polish")),      # 2
          (None, ("Beauty", "Makeup", "Face")),                # 3
          ("Unknown", ("Beauty", "Hair Care", "Shampoos")),    # 4
          ("Unknown", ("Beauty", "Makeup", "Face")),           # 5
          ("A", ("Beauty", "Skin Care"))]                      # 6


def _catalog():
  n = len(_ITEMS)
  return Catalog(asins=tuple(f"I{i}" for i in range(n)), titles=("t",) * n,
                 brands=tuple(b for b, _ in _ITEMS), categories=tuple(c for _, c in _ITEMS),
                 prices=np.zeros(n, np.float32))


def test_levels_by_hand():
  feats = evidence.item_features(_catalog())
  hist = np.array([[PAD, 1, 3, 4]], np.int32)  # newest: 4 (w 1), 3 (w .5), 1 (w .25)
  cands = np.array([[0, 2, 5, 4, 6]], np.int32)
  ev = evidence.compute(feats, hist, cands, decay=0.5)
  total = 1.75
  expected = np.array([
      [0.25, 0, 0.25 * 2 / 3 + 0.5 * 1 / 3],           # 0: brand A = item 1; path shares 2 / 1
      [0, 0, 0.25 * 2 / 3 + 0.5 * 1 / 3],              # 2: brand B nowhere
      [0, 0.5, 0.25 * 1 / 3 + 0.5 * 2 / 3],            # 5: 'Unknown' brand never matches
      [0, 1.0, 1.0 * 2 / 3],                           # 4: itself (same leaf, depth 2)
      [0.25, 0, 0]]) / total                           # 6: brand A = item 1
  np.testing.assert_allclose(ev.values[0], expected)
  assert ev.path_depth[0, 0].tolist() == [0, 2, 1, 0]
  # history [1, 3, 4] (h = 3) in a width-4 array: item 1 is history index 0
  assert evidence.matching_positions(ev, 0, 0, "brand", 4, 3) == (0,)
  assert evidence.matching_positions(ev, 0, 0, "path", 4, 3) == (1, 0)
  assert evidence.matching_positions(ev, 0, 0, "path", 4, 3, min_depth=2) == (0,)
  assert evidence.matching_positions(ev, 0, 2, "leaf", 4, 3) == (1,)


def test_window_and_empty_history():
  feats = evidence.item_features(_catalog())
  hist = np.array([[0, 3, 3, 3], [PAD, PAD, PAD, PAD]], np.int32)
  ev = evidence.compute(feats, hist, np.array([[1], [1]], np.int32), window=3)
  assert ev.window_start == 1 and ev.values[0, 0, 0] == 0  # item 0 (brand A) is outside
  np.testing.assert_array_equal(ev.values[1], 0)


def test_buckets():
  values = np.array([[0.0, 0.1, 0.2], [0.3, 0.4, 0.0], [0.05, 0.9, 1.0]])
  thresholds = np.array([[0.1, 0.2, 0.3]] * 3)
  np.testing.assert_array_equal(evidence.bucketize(values, thresholds),
                                [[0, 1, 2], [3, 4, 0], [1, 4, 4]])
  fitted = evidence.fit_thresholds(np.array([[0.0, 0, 0.1], [1.0, 0, 0.2], [2.0, 0, 0.3]]))
  np.testing.assert_allclose(fitted[0], [1.25, 1.5, 1.75])
  np.testing.assert_allclose(fitted[1], [1, 1, 1])
  with pytest.raises(ValueError, match="kind must be"):
    evidence.matching_positions(evidence.compute(evidence.item_features(_catalog()),
                                                 np.zeros((1, 1), np.int32),
                                                 np.zeros((1, 1), np.int32)), 0, 0, "x", 1, 1)
