"""Tests for gr2jax/data/split.py on the shipped data and on a toy sequence."""

import numpy as np
import pytest

from gr2jax.data import raw, split


@pytest.fixture(scope="module")
def sequences():
  return raw.load_sequences()


def test_stats(sequences):
  stats = split.dataset_stats(sequences, raw.load_catalog().num_items)
  assert (stats["users"], stats["items"], stats["interactions"]) == (22_363, 12_101, 198_502)
  assert stats["train_targets"] == 198_502 - 3 * 22_363


def test_toy_sequence_layout():
  seqs = [np.arange(10, 16, dtype=np.int32), np.arange(20, 24, dtype=np.int32)]
  test = split.make_split(seqs, "test", max_history=3)
  np.testing.assert_array_equal(test.targets, [15, 23])
  np.testing.assert_array_equal(test.histories, [[12, 13, 14], [20, 21, 22]])
  val = split.make_split(seqs, "validation", max_history=4)
  np.testing.assert_array_equal(val.targets, [14, 22])
  np.testing.assert_array_equal(val.histories, [[10, 11, 12, 13], [split.PAD, split.PAD, 20, 21]])
  np.testing.assert_array_equal(val.history(1), [20, 21])
  trainex = split.make_split(seqs, "train", max_history=2)
  np.testing.assert_array_equal(trainex.targets, [13, 21])
  every = split.make_split(seqs, "train", max_history=2, all_training_targets=True)
  np.testing.assert_array_equal(every.users, [0, 0, 0, 1])
  np.testing.assert_array_equal(every.targets, [11, 12, 13, 21])
  np.testing.assert_array_equal(every.histories,
                                [[split.PAD, 10], [10, 11], [11, 12], [split.PAD, 20]])
  assert [s.tolist() for s in split.training_sequences(seqs)] == [[10, 11, 12, 13], [20, 21]]


def test_no_test_or_validation_target_in_training(sequences):
  every = split.make_split(sequences, "train", all_training_targets=True)
  assert len(every) == 198_502 - 3 * 22_363
  val = split.make_split(sequences, "validation")
  test = split.make_split(sequences, "test")
  held_out = np.stack([val.targets, test.targets], axis=1)[every.users]  # [E, 2]
  assert not (every.targets[:, None] == held_out).any()
  assert not (every.histories[:, :, None] == held_out[:, None, :]).any()
  assert not (val.histories == test.targets[:, None]).any()
  train_items = split.training_sequences(sequences)
  assert all(v not in t and x not in t for v, x, t in
             zip(val.targets, test.targets, train_items, strict=True))


def test_short_sequence_error():
  with pytest.raises(ValueError, match=r"indices \[1\].*data\.drop_unusable_users"):
    split.make_split([np.arange(5), np.arange(3)], "test")


def test_eval_subset_deterministic():
  a = split.eval_subset(22_363)
  assert a.shape == (1615,) and len(np.unique(a)) == 1615 and (np.diff(a) > 0).all()
  np.testing.assert_array_equal(a, split.eval_subset(22_363, seed=0))
  assert not np.array_equal(a, split.eval_subset(22_363, seed=1))
  np.testing.assert_array_equal(a[:5], [12, 14, 22, 24, 54])
