"""Tests for gr2jax/data/headroom.py: features by hand, a deterministic fit, a revealing feature."""

import numpy as np
import pytest

from gr2jax.data import evidence, headroom
from gr2jax.data.records import Catalog
from gr2jax.data.split import PAD


def _catalog() -> Catalog:
  items = [("A", ("Beauty", "Makeup", "Nails", "Polish")), ("A", ("Beauty", "Makeup", "Face")),
           ("B", ("Beauty", "Makeup", "Nails", "Polish")), ("C", ("Beauty", "Makeup", "Eyes")),
           (None, ("Beauty", "Hair"))]
  return Catalog(asins=tuple(f"B{i}" for i in range(len(items))),
                 titles=tuple(f"t{i}" for i in range(len(items))),
                 brands=tuple(b for b, _ in items), categories=tuple(c for _, c in items),
                 prices=np.ones(len(items), np.float32))


def test_candidate_features_by_hand():
  # history: item 0 (weight .5), then item 3 (newest, weight 1); candidates 1, 2, 4
  ev = evidence.compute(evidence.item_features(_catalog()), np.array([[PAD, 0, 3]]),
                        np.array([[1, 2, 4]]), decay=0.5, window=3)
  f = headroom.candidate_features(ev, np.array([[3.0, 1.0, 1.0]]), np.array([[0, 3, 10]]),
                                  np.array([[0.1, 0.2, 0.3]]))
  assert f.shape == (1, 3, len(headroom.FEATURES)) and f.dtype == np.float32
  s = np.sqrt(2)
  expected = {  # per candidate slot 0, 1, 2
      "position": [0, 0.5, 1], "score_z": [s, -s / 2, -s / 2], "score_gap_next": [2, 0, 0],
      "log_popularity": np.log1p([0, 3, 10]),
      "brand": [1 / 3, 0, 0], "leaf": [0, 1 / 3, 0], "path": [1 / 3, 5 / 9, 0],
      "brand_any": [1, 0, 0], "leaf_any": [0, 1, 0], "brand_last": [0, 0, 0],
      "leaf_last": [0, 0, 0], "path_depth_last": [1 / 3, 1 / 3, 0],
      "teacher_score": [0.1, 0.2, 0.3]}
  assert set(expected) == set(headroom.FEATURES)
  for i, name in enumerate(headroom.FEATURES):
    np.testing.assert_allclose(f[0, :, i], expected[name], rtol=1e-6, atol=1e-7, err_msg=name)


def test_constant_scores_and_bad_shapes():
  ev = evidence.compute(evidence.item_features(_catalog()), np.array([[0, 3]]),
                        np.array([[1, 2]]))
  f = headroom.candidate_features(ev, np.ones((1, 2)), np.zeros((1, 2)), np.zeros((1, 2)))
  assert np.isfinite(f).all() and (f[..., headroom.FEATURES.index("score_z")] == 0).all()
  with pytest.raises(ValueError, match="popularity"):
    headroom.candidate_features(ev, np.ones((1, 2)), np.zeros((1, 3)), np.zeros((1, 2)))


def _synthetic(seed: int, e: int = 300, n: int = 6, f: int = 4, reveal: bool = False):
  """Noise features with a weak (or, with `reveal`, exact) target signal in column 0."""
  rng = np.random.default_rng(seed)
  targets = rng.integers(0, n, e)
  x = rng.normal(size=(e, n, f)).astype(np.float32)
  x[np.arange(e), targets, 0] += 5.0 if reveal else 0.7
  if reveal:
    x[..., 1] = np.arange(n) == targets[:, None]  # column 1 is the label itself
  return x, targets


def test_learned_headroom_is_deterministic():
  x, t = _synthetic(0)
  xe, te = _synthetic(1)
  runs = [headroom.learned_headroom(x, t, {"test": (xe, te), "sub": (xe[:50], te[:50])},
                                    seed=3, max_iter=20) for _ in range(2)]
  for r in runs:
    r.pop("fit_s")
  assert runs[0] == runs[1]
  assert set(runs[0]) == {"test", "sub", "floor"} and set(runs[0]["test"]) == {"R@1", "R@3", "N@3"}
  # the floor is D's own order: rank = slot + 1
  assert runs[0]["floor"]["test"]["R@1"] == pytest.approx(np.mean(te == 0))
  assert runs[0]["test"]["R@1"] > runs[0]["floor"]["test"]["R@1"]  # the weak signal is learned


def test_a_revealing_feature_gives_recall1_one():
  x, t = _synthetic(0, reveal=True)
  xe, te = _synthetic(1, reveal=True)
  out = headroom.learned_headroom(x, t, {"test": (xe, te)}, max_iter=20)
  assert out["test"] == {"R@1": 1.0, "R@3": 1.0, "N@3": 1.0}


def test_bad_targets_are_named():
  x, t = _synthetic(0, e=10)
  with pytest.raises(ValueError, match="fit_targets"):
    headroom.learned_headroom(x, t + 6, {})
  with pytest.raises(ValueError, match="'test'"):
    headroom.learned_headroom(x, t, {"test": (x[:, :3], t)}, max_iter=2)
