"""Tests for gr2jax/data/candidates.py: list invariants, random ties, the position-leak check."""

import numpy as np
import pytest

from gr2jax.data import build_settings, candidates, raw, retriever, split


@pytest.fixture(scope="module")
def beauty():
  catalog = raw.load_catalog()
  seqs = raw.load_sequences(catalog=catalog)
  return seqs, retriever.fit(split.training_sequences(seqs), catalog.num_items)


@pytest.fixture(scope="module")
def test_lists(beauty):
  seqs, ret = beauty
  test = split.make_split(seqs, "test")
  return test, candidates.build_lists(ret, test, seqs, candidates.CandidateConfig(), False)


def test_every_list_is_valid(beauty, test_lists):
  seqs, _ = beauty
  test, lists = test_lists
  d = lists.candidates
  assert d.shape == (22_363, 10) and d.dtype == np.int32
  srt = np.sort(d, axis=1)
  assert (srt[:, 1:] != srt[:, :-1]).all()  # 10 distinct items
  assert ((d == test.targets[:, None]).sum(axis=1) == 1).all()  # the target exactly once
  np.testing.assert_array_equal(d[np.arange(len(test)), lists.target_positions], test.targets)
  for e in range(0, len(test), 97):  # negatives are items the user never touched
    negatives = np.delete(d[e], lists.target_positions[e])
    assert not np.isin(negatives, seqs[test.users[e]]).any()
  assert (np.diff(lists.scores, axis=1) <= 0).all()


def test_default_histogram_has_no_late_spike(test_lists):
  _, lists = test_lists
  hist = np.array(lists.report["histogram"])
  assert hist[0] == hist.max() and hist[0] > 3 * hist[-1]
  assert (np.diff(hist[:3]) < 0).all() and hist[3:].max() < hist[2] + 0.01  # flat tail
  assert lists.report["best_fixed_position"] == 0
  assert lists.report["R@1"] == pytest.approx(0.366, abs=0.015)
  assert lists.report["R@3"] == pytest.approx(0.539, abs=0.015)
  assert lists.report["N@3"] == pytest.approx(0.466, abs=0.015)


def test_target_plus_retriever_top9_trips_the_check(beauty):
  seqs, ret = beauty
  test = split.make_split(seqs, "test").select(np.arange(3000))
  top9 = candidates.CandidateConfig(negative_pool="topk", pool_size=9)
  with pytest.raises(candidates.PositionLeakError, match="the target is last in 0.9"):
    candidates.build_lists(ret, test, seqs, top9, False)
  accepted = candidates.build_lists(
      ret, test, seqs, candidates.CandidateConfig(negative_pool="topk", pool_size=9,
                                                  accept_position_leak=True), False)
  assert accepted.report["best_fixed_position"] == 9


def test_order_by_score_breaks_ties_at_random():
  rng = np.random.default_rng(0)
  items = np.tile(np.arange(4), (2000, 1))
  scores = np.tile([1.0, 0.0, 0.0, 0.0], (2000, 1))
  ordered, ordered_scores = candidates.order_by_score(rng, items, scores)
  assert (ordered[:, 0] == 0).all() and (ordered_scores[:, 0] == 1).all()
  last = np.bincount(ordered[:, -1], minlength=4) / 2000
  np.testing.assert_allclose(last, [0, 1 / 3, 1 / 3, 1 / 3], atol=0.05)


def test_catalogue_negatives_deterministic_and_unseen():
  seqs = [np.array([0, 1, 2], np.int32), np.array([3, 4], np.int32)]
  keys = candidates._interaction_keys(seqs, 8)
  draw = lambda: candidates.sample_catalogue_negatives(
      np.random.default_rng(5), np.array([0, 1, 0]), keys, 8, 5)
  neg = draw()
  np.testing.assert_array_equal(neg, draw())
  assert sorted(neg[0]) == [3, 4, 5, 6, 7] == sorted(neg[2])
  assert len(set(neg[1])) == 5 and set(neg[1]) <= {0, 1, 2, 5, 6, 7}


def test_too_few_unseen_items_stop_at_once_naming_the_user():
  """A user who touched 45 of 50 items leaves 5 unseen for 9 negatives: refused up front (the
  redraw loop would never end, doubling its draws)."""
  seqs = [np.arange(5, dtype=np.int32), np.arange(45, dtype=np.int32)]
  keys = candidates._interaction_keys(seqs, 50)
  with pytest.raises(candidates.TooFewUnseenError, match=r"indices \[1\] \(of 1\)"):
    candidates.sample_catalogue_negatives(np.random.default_rng(0), np.array([0, 1]), keys,
                                          50, 9)
  neg = candidates.sample_catalogue_negatives(np.random.default_rng(0), np.array([1]), keys,
                                              50, 5)
  assert sorted(neg[0]) == list(range(45, 50))  # exactly enough unseen items is fine


def test_config_errors():
  """The lists' settings are the data build's, checked there (build_settings.DataSettings)."""
  with pytest.raises(ValueError, match="data.negative_pool='popular' not in"):
    build_settings.DataSettings(negative_pool="popular")
  with pytest.raises(ValueError, match="pool_size"):
    build_settings.DataSettings(negative_pool="topk", pool_size=5)
