"""Tests for gr2jax/data/examples.py: record invariants on 3,000 users, the full build (slow)."""

import dataclasses

import numpy as np
import pytest

from gr2jax import recipes
from gr2jax.data import examples, pipeline, raw, teacher
from gr2jax.data.records import SPLITS

_USERS = 3000


@pytest.fixture(scope="module")
def beauty():
  catalog = raw.load_catalog()
  return catalog, raw.load_sequences(catalog=catalog)


def _spec(**fields) -> examples.ExampleSpec:
  """The tiny recipe's example settings with `fields` changed."""
  return dataclasses.replace(pipeline.example_spec(recipes.config().data), **fields)


@pytest.fixture(scope="module")
def built(beauty):
  catalog, seqs = beauty
  return examples.build_examples(catalog, seqs[:_USERS], _spec(max_history=8, subset_size=300))


def test_records_are_consistent(beauty, built):
  catalog, seqs = beauty
  out, stats = built
  assert stats["sizes"]["validation"] == stats["sizes"]["test"] == _USERS
  assert stats["sizes"]["train_lists"] == _USERS and stats["sizes"]["test_subset"] == 300
  offset = {"train": 3, "validation": 2, "test": 1}
  for name in SPLITS:
    for ex in out[name][::37]:
      seq = seqs[ex.user]
      end = len(seq) - offset[name]
      np.testing.assert_array_equal(ex.history, seq[max(end - 8, 0):end])
      assert ex.candidates[ex.target_position] == seq[end]
      assert (ex.candidates == seq[end]).sum() == 1 and len(set(ex.candidates.tolist())) == 10
      assert not np.isin(ex.candidates, seq[:end]).any()
      assert not np.isin(np.delete(ex.candidates, ex.target_position), seq).any()
      assert (np.diff(ex.retriever_scores) <= 0).all()
      assert ex.evidence.shape == (10, 3) and 0 <= ex.evidence.min() and ex.evidence.max() <= 4
      assert (ex.teacher_ranking is None) == (name != "train")


def test_training_traces(beauty, built):
  catalog, _ = beauty
  out, stats = built
  train = out["train"]
  assert len(train) == round(stats["acceptance"] * _USERS)
  for ex in train:
    assert sorted(ex.teacher_ranking.tolist()) == list(range(10))
    assert ex.teacher_ranking[0] == ex.target_position  # rejection sampling
    assert sum(c.kind == "brand" for c in ex.citations) <= 2
    assert sum(c.kind != "brand" for c in ex.citations) <= 2
    place = {int(s): p for p, s in enumerate(ex.teacher_ranking)}
    for c in ex.citations:
      assert place[c.slot] < c.slot and c.history_positions  # promoted, with evidence
      item = ex.candidates[c.slot]
      for p in c.history_positions:
        h = ex.history[p]
        if c.kind == "brand":
          assert catalog.brands[h] == catalog.brands[item] == c.value
        elif c.kind == "leaf":
          assert catalog.categories[h] == catalog.categories[item]
        else:
          assert " > ".join(catalog.categories[h][1:]).startswith(c.value)
  assert any(ex.citations for ex in train)


def test_stats_report_teacher_above_floor(built):
  _, stats = built
  for name in ("validation", "test", "test_subset"):
    assert stats["teacher"][name]["R@1"] > stats["floor"][name]["R@1"]
  assert stats["floor"]["test"]["best_fixed_position"] == 0
  assert set(stats["retriever"]["test"]) == {"R@10", "N@10"}


def test_options_keep_all_and_all_targets(beauty):
  catalog, seqs = beauty
  seqs = seqs[:400]
  weights = teacher.TeacherWeights()
  spec = _spec(rejection=False, all_training_targets=True, subset_size=50)
  out, stats = examples.build_examples(catalog, seqs, spec, teacher_weights=weights)
  assert len(out["train"]) == stats["sizes"]["train_lists"] == sum(len(s) - 3 for s in seqs)
  assert stats["teacher_weights"] == dataclasses.asdict(weights)
  again, _ = examples.build_examples(catalog, seqs, spec, teacher_weights=weights)
  for a, b in zip(out["test"], again["test"], strict=True):
    np.testing.assert_array_equal(a.candidates, b.candidates)


@pytest.mark.slow
def test_full_build_matches_measurements(beauty):
  catalog, seqs = beauty
  out, stats = examples.build_examples(catalog, seqs, _spec())
  assert stats["retriever"]["test"]["R@10"] == pytest.approx(0.084, abs=0.003)
  assert stats["retriever"]["test"]["N@10"] == pytest.approx(0.052, abs=0.003)
  floor = stats["floor"]["test"]
  assert (floor["R@1"], floor["R@3"], floor["N@3"]) == pytest.approx((0.366, 0.539, 0.466),
                                                                     abs=0.01)
  assert stats["teacher"]["test"]["R@1"] - floor["R@1"] > 0.03
  assert stats["teacher"]["test"]["R@3"] - floor["R@3"] > 0.05
  assert 0.35 < stats["acceptance"] < 0.5
  assert len(out["test"]) == 22_363 and stats["sizes"]["test_subset"] == 1615
