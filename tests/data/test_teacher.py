"""Tests for gr2jax/data/teacher.py: the score, tuning, citations, rejection and JSONL traces."""

import json

import numpy as np
import pytest

from gr2jax.data import evidence, teacher
from gr2jax.data.records import Catalog, Citation, RerankExample
from gr2jax.data.split import PAD


def test_scores_and_rankings_by_hand():
  values = np.zeros((1, 4, 3))
  values[0, 3] = [0.5, 0.0, 0.0]  # brand match on the last slot
  w = teacher.TeacherWeights(rank=0.5, brand=2.0, leaf=0.5, path=0.5)
  np.testing.assert_allclose(teacher.scores(values, w)[0], [0.5, 1 / 3, 1 / 6, 1.0])
  np.testing.assert_array_equal(teacher.rankings(values, w), [[3, 0, 1, 2]])
  # no evidence: D's order is kept, ties included
  np.testing.assert_array_equal(teacher.rankings(np.zeros((1, 4, 3)), teacher.TeacherWeights(
      rank=0.0)), [[0, 1, 2, 3]])
  assert teacher.accepted(np.array([[3, 0, 1, 2], [0, 1, 2, 3]]), np.array([3, 1])).tolist() == [
      True, False]


def test_tune_finds_the_informative_weight():
  rng = np.random.default_rng(0)
  e, n = 400, 10
  targets = rng.integers(0, n, e)
  values = rng.random((e, n, 3)) * 0.2
  values[np.arange(e), targets, 1] += 0.5  # only the leaf level points at the target
  weights, n3 = teacher.tune(values, targets, {"rank": (0.0, 1.0), "brand": (0.0, 1.0),
                                               "leaf": (0.0, 1.0), "path": (0.0,)})
  assert weights == teacher.TeacherWeights(rank=0.0, brand=0.0, leaf=1.0, path=0.0)
  assert n3 == 1.0


def _catalog():
  items = [("A", ("Beauty", "Makeup", "Nails", "Polish")), ("A", ("Beauty", "Makeup", "Face")),
           ("B", ("Beauty", "Makeup", "Nails", "Polish")), ("C", ("Beauty", "Makeup", "Eyes")),
           ("D", ("Beauty", "Hair Care")), ("E", ("Beauty", "Makeup", "Nails", "Polish"))]
  n = len(items)
  return Catalog(asins=tuple(map(str, range(n))), titles=("t",) * n,
                 brands=tuple(b for b, _ in items), categories=tuple(c for _, c in items),
                 prices=np.zeros(n, np.float32))


def test_citations_for_promoted_candidates():
  catalog = _catalog()
  hist = np.array([[PAD, 0, 3]], np.int32)  # history [0, 3]: brand A nails polish, then eyes
  cands = np.array([[4, 2, 1, 5]], np.int32)
  ev = evidence.compute(evidence.item_features(catalog), hist, cands)
  ranking = teacher.rankings(ev.values, teacher.TeacherWeights())[0]
  # scores: slot 0 .5; slot 1 (leaf + path) .87; slot 2 (brand A) 1.22; slot 3 (leaf) .54
  np.testing.assert_array_equal(ranking, [2, 1, 3, 0])
  cites = teacher.citations(ranking, ev, 0, cands[0], catalog, history_width=3, history_len=2)
  assert cites == (  # slot 1 stays in place: not promoted, not cited
      Citation(2, "brand", "A", (0,)),
      Citation(2, "path", "Makeup", (1, 0)),
      Citation(3, "leaf", "Polish", (0,)),
  )
  assert teacher.citations(ranking, ev, 0, cands[0], catalog, 3, 2, max_category=1) == cites[:2]
  assert teacher.citations(ranking, ev, 0, cands[0], catalog, 3, 2, max_brand=0) == cites[1:]


def _examples():
  return [RerankExample(user=u, split="train", history=np.array([1], np.int32),
                        candidates=np.arange(4, dtype=np.int32), target_position=u % 4,
                        retriever_scores=np.zeros(4, np.float32),
                        evidence=np.zeros((4, 3), np.int32)) for u in range(4)]


def _write(path, rows):
  path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
  return path


def test_load_traces_filter_and_bad_rows(tmp_path):
  path = _write(tmp_path / "traces.jsonl", [
      {"user": 0, "reasoning": "brand", "ranking": [0, 1, 2, 3]},  # top-1 = target 0
      {"user": 1, "reasoning": "x", "ranking": [0, 1, 2, 3]},  # target 1 is not first
      "",
      {"user": 2, "reasoning": "x", "ranking": [2, 2, 1, 0]},  # not a permutation
      {"user": 9, "reasoning": "x", "ranking": [0, 1, 2, 3]},  # unknown user
      "{broken",
      {"user": 0, "reasoning": "again", "ranking": [0, 1, 2, 3]},  # duplicate
      {"user": 3, "reasoning": "ok", "ranking": [3, 0, 1, 2], "teacher": "abc", "attempts": 2},
  ])
  kept, stats = teacher.load_traces(path, _examples())
  assert [t.example.user for t in kept] == [0, 3] and kept[1].reasoning == "ok"
  np.testing.assert_array_equal(kept[1].example.teacher_ranking, [3, 0, 1, 2])
  assert stats == {"rows": 7, "bad": 4, "bad_reasons": {"ranking": 1, "user": 2, "json": 1},
                   "skipped": [f"{path}:4: ranking: must be a permutation of the slots 0..3, "
                               "got [2, 2, 1, 0]",
                               f"{path}:5: user: 9 is not a user of these examples",
                               f"{path}:6: json: corrupt JSON: Expecting property name enclosed "
                               "in double quotes: line 1 column 2 (char 1)",
                               f"{path}:7: user: duplicate trace for user 0"],
                   "accepted": 2, "kept": 2, "acceptance": 2 / 3, "teachers": ["abc"]}
  assert kept[1].teacher == "abc" and kept[0].teacher is None  # extra fields are fine
  kept_all, _ = teacher.load_traces(path, _examples(), rejection=False)
  assert [t.example.user for t in kept_all] == [0, 1, 3]
  with pytest.raises(teacher.TraceError, match=r"traces.jsonl:4: ranking: must be a permutation"):
    teacher.load_traces(path, _examples(), strict=True)
