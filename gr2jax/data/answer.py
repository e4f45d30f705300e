"""Answer extraction and validation, shared by evaluation, RL rewards and benchmarks.

The answer is the JSON object `{"ranking": [label, ...]}` after the `<think>` block (see
prompts.py), where labels are candidate SID strings or slot tokens; the validator only compares
strings, so both answer formats go through the same code. A valid permutation of D gives the
ranking; anything else falls back to D's own order (identity) and is counted by kind
(GR2, arXiv 2602.07774; Diffusion-GR2 (arXiv 2607.01170) "valid-JSON rate").
"""

import collections
import dataclasses
import json

import numpy as np

from gr2jax.data.prompts import END_OF_TEXT, IM_END, THINK_END, THINK_START

KINDS = ("valid", "malformed_json", "duplicate", "omitted", "out_of_set", "truncated")

_DECODER = json.JSONDecoder()


@dataclasses.dataclass(frozen=True)
class AnswerResult:
  """The validator's verdict on one generated response.

  Attributes:
    kind: one of KINDS.
    ranking: [N] int32 slots, best first; D's order (arange) unless kind == 'valid'.
  """

  kind: str
  ranking: np.ndarray

  @property
  def valid(self) -> bool:
    return self.kind == "valid"


def _answer_text(text: str) -> tuple[str, bool]:
  """The text after the reasoning, cut at end of turn; and whether the reasoning was left open."""
  for stop in (IM_END, END_OF_TEXT):
    text = text.split(stop, 1)[0]
  if THINK_END in text:
    return text.split(THINK_END, 1)[1], False
  return text, THINK_START in text


def _is_unclosed(text: str) -> bool:
  """Whether a JSON text ends inside a string, object or array (i.e. was cut off)."""
  depth, in_string, escaped = 0, False, False
  for char in text:
    if in_string:
      if escaped:
        escaped = False
      elif char == "\\":
        escaped = True
      elif char == '"':
        in_string = False
    elif char == '"':
      in_string = True
    elif char in "{[":
      depth += 1
    elif char in "}]":
      depth -= 1
  return in_string or depth > 0


def _classify(ranked: list, candidate_labels: tuple[str, ...]) -> tuple[str, np.ndarray | None]:
  """Kind and slot ranking of a parsed `ranking` list."""
  slot_of = {label: slot for slot, label in enumerate(candidate_labels)}
  if any(not isinstance(label, str) or label.strip() not in slot_of for label in ranked):
    return "out_of_set", None
  slots = [slot_of[label.strip()] for label in ranked]
  if len(set(slots)) < len(slots):
    return "duplicate", None
  if len(slots) < len(candidate_labels):
    return "omitted", None
  return "valid", np.asarray(slots, np.int32)


def parse_answer(text: str, candidate_labels) -> AnswerResult:
  """Extract and validate the JSON answer of one generated response.

  Kinds, checked in this order: 'truncated' (the reasoning or the JSON was cut off before it
  closed), 'malformed_json' (no JSON object, invalid JSON, text after it, or no list under
  "ranking"), 'out_of_set' (a label that is not a candidate's), 'duplicate', 'omitted', 'valid'.

  Args:
    text: the decoded response (special tokens kept); anything from the first end-of-turn on is
      ignored.
    candidate_labels: [N] distinct label strings of the candidates in D's order.

  Returns:
    The AnswerResult; its ranking is D's order unless the answer is a valid permutation.

  Raises:
    TypeError: text is not a str, or candidate_labels is not a sequence of str.
    ValueError: candidate_labels are not distinct.
  """
  if not isinstance(text, str):
    raise TypeError(f"parse_answer: text must be a str, got {type(text).__name__}")
  if isinstance(candidate_labels, (str, bytes)) or not hasattr(candidate_labels, "__iter__"):
    raise TypeError("parse_answer: candidate_labels must be a sequence of label strings, got "
                    f"{type(candidate_labels).__name__}")
  candidate_labels = tuple(candidate_labels)
  if not all(isinstance(label, str) for label in candidate_labels):
    raise TypeError(f"parse_answer: candidate_labels must all be str, got {candidate_labels}")
  if len(set(candidate_labels)) != len(candidate_labels):
    raise ValueError(f"candidate_labels are not distinct: {candidate_labels}")
  identity = np.arange(len(candidate_labels), dtype=np.int32)
  answer, open_reasoning = _answer_text(text)
  if open_reasoning:
    return AnswerResult("truncated", identity)
  start = answer.find("{")
  if start < 0:
    return AnswerResult("malformed_json", identity)
  try:
    obj, end = _DECODER.raw_decode(answer, start)
  except (ValueError, RecursionError):
    kind = "truncated" if _is_unclosed(answer[start:]) else "malformed_json"
    return AnswerResult(kind, identity)
  ranked = obj.get("ranking") if isinstance(obj, dict) else None
  if answer[end:].strip() or not isinstance(ranked, list):
    return AnswerResult("malformed_json", identity)
  kind, ranking = _classify(ranked, candidate_labels)
  return AnswerResult(kind, identity if ranking is None else ranking)


def summarize(results) -> dict:
  """Valid-JSON rate and per-kind counts of a sequence of AnswerResults.

  Args:
    results: AnswerResults.

  Returns:
    {'num': n, 'valid_rate': fraction valid (0.0 when n == 0), 'counts': {kind: count} over KINDS}.
  """
  counts = collections.Counter(r.kind for r in results)
  num = sum(counts.values())
  return {"num": num, "valid_rate": counts["valid"] / num if num else 0.0,
          "counts": {kind: counts[kind] for kind in KINDS}}


def reasoning_text(response: str) -> str:
  """The text of the `<think>` block of a response ('' when there is none; up to the end of
  the response when it was left open)."""
  start = response.find(THINK_START)
  if start < 0:
    return ""
  body = response[start + len(THINK_START):]
  end = body.find(THINK_END)
  return (body if end < 0 else body[:end]).strip()
