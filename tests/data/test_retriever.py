"""Tests for gr2jax/data/retriever.py: exact counts on a toy sequence, leave-own-user-out."""

import numpy as np
import pytest

from gr2jax.data import retriever, split


def _toy_sequences(num_users=30, num_items=25, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.permutation(num_items)[: rng.integers(4, 12)].astype(np.int32)
          for _ in range(num_users)]


def test_counts_by_hand():
  cfg = retriever.RetrieverSettings(window=2, reverse=0.5)
  r = retriever.fit([np.array([0, 1, 2], np.int32)], 4, cfg)
  expected = np.zeros((4, 4))
  expected[0, 1] = expected[1, 2] = 1.0
  expected[1, 0] = expected[2, 1] = 0.5
  expected[0, 2], expected[2, 0] = 0.5, 0.25
  np.testing.assert_allclose(r.counts.toarray(), expected)
  np.testing.assert_array_equal(r.freq, [1, 1, 1, 0])


def test_score_recency_and_normalisation():
  cfg = retriever.RetrieverSettings(window=1, reverse=0.0, decay=0.5)
  r = retriever.fit([np.array([0, 2], np.int32), np.array([0, 3], np.int32),
                     np.array([1, 3], np.int32)], 4, cfg)
  hist = np.array([[split.PAD, 0, 1]], np.int32)  # newest: item 1 (weight 1), then item 0 (0.5)
  got = retriever.score(r, hist)[0]
  np.testing.assert_allclose(got, [0, 0, 0.5 / np.sqrt(2), 1 + 0.5 / np.sqrt(2)])


def test_leave_own_user_out_equals_refit_without_user():
  seqs = _toy_sequences()
  full = retriever.fit(seqs, 25)
  train = split.make_split(seqs, "train", max_history=20, all_training_targets=True)
  loo = retriever.score(full, train.histories, train.users)
  for e in range(0, len(train), 7):
    u = train.users[e]
    others = retriever.fit([s if v != u else s[:0] for v, s in enumerate(seqs)], 25)
    np.testing.assert_allclose(loo[e], retriever.score(others, train.histories[e:e + 1])[0],
                               atol=1e-12)
  assert (loo >= 0).all()


def test_full_ranking_ranks():
  scores = np.array([[0.0, 3.0, 2.0, 5.0, 0.0]])
  rng = np.random.default_rng(0)
  # item 3 excluded: target 2 is behind item 1 only
  assert retriever.full_ranking_ranks(scores, np.array([2]), [np.array([3])], rng)[0] == 2
  ranks = [retriever.full_ranking_ranks(scores, np.array([0]), [np.array([3])], rng)[0]
           for _ in range(50)]
  assert set(ranks) == {3, 4}  # tied with item 4 after items 1, 2


def test_evaluate_perfect_retriever():
  seq = [np.array([0, 1, 2, 3], np.int32)] * 3
  r = retriever.fit(seq, 6)
  test = split.make_split(seq, "test")
  got = retriever.evaluate(r, test.histories, test.targets, [s[:-1] for s in seq], ks=(1, 10))
  assert got == pytest.approx({"R@1": 1.0, "R@10": 1.0, "N@10": 1.0})
