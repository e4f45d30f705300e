"""Tests for gr2jax/data/answer.py: every failure kind by hand, and a fuzz run."""

import json
import random

import numpy as np
import pytest

from gr2jax.data import answer

SLOTS = tuple(f"<slot_{s}>" for s in range(10))
SIDS = tuple(f"<a_{s}><b_{2 * s}><c_{s % 3}><d_0>" for s in range(10))


def _response(ranked, reasoning="<think>\n<slot_2> brand X: H1\n</think>\n\n"):
  return reasoning + json.dumps({"ranking": list(ranked)}, separators=(",", ":")) + "<|im_end|>"


@pytest.mark.parametrize("labels", [SLOTS, SIDS], ids=["slot", "sid"])
def test_valid_permutation_gives_ranking(labels):
  order = [3, 0, 9, 1, 2, 4, 5, 6, 7, 8]
  result = answer.parse_answer(_response([labels[i] for i in order]), labels)
  assert result.kind == "valid" and result.valid
  np.testing.assert_array_equal(result.ranking, order)
  # Trailing text after end of turn is ignored; spaces inside the JSON are allowed.
  spaced = json.dumps({"ranking": [labels[i] for i in order]})
  assert answer.parse_answer(spaced + "<|im_end|>garbage", labels).kind == "valid"


@pytest.mark.parametrize("labels", [SLOTS, SIDS], ids=["slot", "sid"])
@pytest.mark.parametrize("text_fn,kind", [
  (lambda L: _response(L[:9] + (L[0],)), "duplicate"),
  (lambda L: _response(L[:9]), "omitted"),
  (lambda L: _response(L[:9] + ("<slot_10>",)), "out_of_set"),
  (lambda L: _response(L[:9] + (7,)), "out_of_set"),
  (lambda L: _response(L[1:] + ("<a_999><b_0><c_0><d_0>",)), "out_of_set"),
  (lambda L: _response(L)[:-30], "truncated"),
  (lambda L: "<think>\nslot brand", "truncated"),
  (lambda L: "<think>\n</think>\n\nno json here", "malformed_json"),
  (lambda L: "<think>\n</think>\n\n{\"ranking\": [\"a\",]}", "malformed_json"),
  (lambda L: "<think>\n</think>\n\n{\"order\": []}", "malformed_json"),
  (lambda L: "<think>\n</think>\n\n[1, 2]", "malformed_json"),
  (lambda L: _response(L).replace("<|im_end|>", "} extra"), "malformed_json"),
  (lambda L: "", "malformed_json"),
], ids=["duplicate", "omitted", "out_of_set", "non_string", "unknown_sid", "cut_json",
        "cut_think", "no_json", "bad_json", "no_key", "not_object", "trailing", "empty"])
def test_failure_kinds_fall_back_to_d_order(labels, text_fn, kind):
  result = answer.parse_answer(text_fn(labels), labels)
  assert result.kind == kind
  np.testing.assert_array_equal(result.ranking, np.arange(10))


def test_duplicate_candidate_labels_rejected():
  with pytest.raises(ValueError, match="not distinct"):
    answer.parse_answer("{}", ("a", "a"))


def test_summarize_counts_every_kind():
  results = [answer.parse_answer(t, SLOTS) for t in
             [_response(SLOTS), _response(SLOTS), _response(SLOTS[:3]), "{"]]
  summary = answer.summarize(results)
  assert summary["num"] == 4 and summary["valid_rate"] == 0.5
  assert summary["counts"] == {"valid": 2, "malformed_json": 0, "duplicate": 0, "omitted": 1,
                               "out_of_set": 0, "truncated": 1}
  assert answer.summarize([])["valid_rate"] == 0.0


def _mutate(text, labels, rng):
  """One random edit: delete / insert / replace a span, cut, or swap two labels."""
  op = rng.randrange(5)
  i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
  alphabet = '{}[]",:<>_ \\\nabc0123456789' + "".join(SLOTS[:2])
  if op == 0:
    return text[:i] + text[j:]
  if op == 1:
    return text[:i] + "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 6))) + text[i:]
  if op == 2:
    return text[:i] + rng.choice(alphabet) * (j - i) + text[j:]
  if op == 3:
    return text[:i]
  return text.replace(labels[rng.randrange(10)], labels[rng.randrange(10)], 1)


@pytest.mark.parametrize("labels", [SLOTS, SIDS], ids=["slot", "sid"])
def test_fuzz_never_raises(labels):
  rng = random.Random(0)
  base = _response(labels)
  kinds = set()
  for n in range(5000):
    text = base
    for _ in range(rng.randrange(1, 4)):
      text = _mutate(text, labels, rng)
    if n % 10 == 0:
      text = "".join(rng.choice('{["\\]}:,<>') for _ in range(rng.randrange(200)))
    result = answer.parse_answer(text, labels)
    assert result.kind in answer.KINDS
    assert sorted(result.ranking.tolist()) == list(range(10))
    kinds.add(result.kind)
  assert answer.parse_answer("[" * 100000, labels).kind == "malformed_json"
  assert answer.parse_answer("{" * 100000, labels).kind == "truncated"
  assert kinds == set(answer.KINDS)
