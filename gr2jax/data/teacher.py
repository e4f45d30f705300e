"""Rule teacher: an offline stand-in for GR2's Qwen3-32B reasoning traces (GR2, arXiv 2602.07774).

It never sees the target. Candidate at slot p of D (N slots) scores
  rank * (N-1-p)/(N-1) + brand * brandW + leaf * leafW + path * pathW
with the recency-weighted evidence levels of `evidence.py`; its ranking sorts the slots by score
(ties keep D's order). Weights are tuned by a small grid on VALIDATION NDCG@3 (measured best in
docs/results/data_build.md: rank .5, brand 2, leaf .5, path .5 at decay .8). It cites the
evidence of the candidates it promotes above their place in D. GR2's rejection sampling keeps an
example only when the teacher's top-1 is the target (`accepted`); LLM-written traces go through
the same filter (`load_traces`).
"""

import collections
import dataclasses
import itertools
import json
import pathlib

import numpy as np

from gr2jax import metrics
from gr2jax.data import evidence as evidence_lib
from gr2jax.data.records import Catalog, Citation, RerankExample

DEFAULT_GRID = {"rank": (0.0, 0.25, 0.5, 1.0), "brand": (0.0, 0.5, 1.0, 2.0, 4.0),
                "leaf": (0.0, 0.5, 1.0), "path": (0.0, 0.5, 1.0)}


@dataclasses.dataclass(frozen=True)
class TeacherWeights:
  """Weights of the rule teacher's score (defaults: the measured best)."""

  rank: float = 0.5
  brand: float = 2.0
  leaf: float = 0.5
  path: float = 0.5


def scores(values: np.ndarray, weights: TeacherWeights) -> np.ndarray:
  """Teacher scores [E, N] from evidence levels [E, N, 3] (brand, leaf, path) of D's slots."""
  n = values.shape[1]
  rank = (n - 1 - np.arange(n)) / (n - 1)  # [N] 1 for slot 0 .. 0 for the last slot
  return (weights.rank * rank + weights.brand * values[..., 0] + weights.leaf * values[..., 1]
          + weights.path * values[..., 2])


def rankings(values: np.ndarray, weights: TeacherWeights) -> np.ndarray:
  """[E, N] int32 slots, best first (ties keep D's order)."""
  return np.argsort(-scores(values, weights), axis=1, kind="stable").astype(np.int32)


def ranking_metrics(ranking: np.ndarray, target_positions: np.ndarray) -> dict[str, float]:
  """R@1, R@3, N@3 of slot rankings [E, N] for targets at slots [E]."""
  return metrics.ranking_metrics(metrics.target_ranks(ranking, target_positions), ks=(1, 3))


def accepted(ranking: np.ndarray, target_positions: np.ndarray) -> np.ndarray:
  """[E] bool: the ranking's top-1 is the target (GR2's rejection-sampling criterion)."""
  return np.asarray(ranking)[:, 0] == np.asarray(target_positions)


def tune(values: np.ndarray, target_positions: np.ndarray,
         grid: dict[str, tuple[float, ...]] | None = None) -> tuple[TeacherWeights, float]:
  """Grid search of the weights on validation lists, maximising NDCG@3.

  Args:
    values: [E, N, 3] validation evidence levels.
    target_positions: [E] validation target slots.
    grid: candidate values per weight name (DEFAULT_GRID when None).

  Returns:
    (best weights, their NDCG@3); the first best in grid order wins ties.
  """
  grid = DEFAULT_GRID if grid is None else grid
  best, best_n3 = None, -1.0
  names = [f.name for f in dataclasses.fields(TeacherWeights)]
  for combo in itertools.product(*(grid[n] for n in names)):
    weights = TeacherWeights(**dict(zip(names, combo, strict=True)))
    n3 = ranking_metrics(rankings(values, weights), target_positions)["N@3"]
    if n3 > best_n3:
      best, best_n3 = weights, n3
  return best, best_n3


def citations(ranking: np.ndarray, ev: evidence_lib.Evidence, e: int, candidates: np.ndarray,
              catalog: Catalog, history_width: int, history_len: int, max_brand: int = 2,
              max_category: int = 2) -> tuple[Citation, ...]:
  """The evidence the teacher cites for the candidates it promotes above their slot in D.

  Walks the promoted candidates in the teacher's order; each can cite its brand (the brand string)
  and one category match: its leaf category when a history item has the same path, else the
  deepest category-path prefix it shares (levels below "Beauty" joined by " > ").

  Args:
    ranking: [N] the teacher's slot ranking of example e.
    ev: the Evidence of the split.
    e: example index into ev.
    candidates: [N] the example's candidate items.
    catalog: item metadata (the cited strings).
    history_width: H of the histories given to `evidence.compute`.
    history_len: the example's unpadded history length.
    max_brand: at most this many brand citations.
    max_category: at most this many leaf / path citations.

  Returns:
    The citations, in the teacher's order.
  """
  out, n_brand, n_cat = [], 0, 0
  values = ev.values[e]
  where = lambda slot, kind, depth=1: evidence_lib.matching_positions(
      ev, e, slot, kind, history_width, history_len, depth)
  for place, slot in enumerate(int(s) for s in ranking):
    if place >= slot:
      continue  # not promoted
    item = int(candidates[slot])
    if values[slot, 0] > 0 and n_brand < max_brand:
      out.append(Citation(slot, "brand", catalog.brands[item], where(slot, "brand")))
      n_brand += 1
    if n_cat >= max_category:
      continue
    if values[slot, 1] > 0:
      out.append(Citation(slot, "leaf", catalog.categories[item][-1], where(slot, "leaf")))
      n_cat += 1
    elif values[slot, 2] > 0:
      depth = int(ev.path_depth[e, slot].max())
      value = " > ".join(catalog.categories[item][1:1 + depth])
      out.append(Citation(slot, "path", value, where(slot, "path", depth)))
      n_cat += 1
  return tuple(out)


class TraceError(ValueError):
  """A malformed trace row; the message names the file and line."""


@dataclasses.dataclass(frozen=True)
class Trace:
  """An externally written reasoning trace attached to its example.

  Attributes:
    example: the user's example with `teacher_ranking` set to the trace's ranking.
    reasoning: the trace's reasoning text.
    teacher: the row's "teacher" digest (data/llm_teacher.py writes one), None when absent.
  """

  example: RerankExample
  reasoning: str
  teacher: str | None = None


class _BadRow(ValueError):
  """A bad trace row: `kind` names what is wrong ('json', 'object', 'user', 'reasoning', ...)."""

  def __init__(self, kind: str, detail: str):
    super().__init__(f"{kind}: {detail}")
    self.kind = kind


def _parse_trace(line: str, examples: dict[int, RerankExample], seen: set[int]) -> Trace:
  """One JSONL row -> Trace; raises _BadRow."""
  try:
    row = json.loads(line)
  except json.JSONDecodeError as err:
    raise _BadRow("json", f"corrupt JSON: {err}") from err
  if not isinstance(row, dict) or not {"user", "reasoning", "ranking"} <= set(row):
    raise _BadRow("object", "expected an object with 'user', 'reasoning' and 'ranking'")
  user, reasoning, ranking = row["user"], row["reasoning"], row["ranking"]
  if isinstance(user, bool) or not isinstance(user, int) or user not in examples:
    raise _BadRow("user", f"{user!r} is not a user of these examples")
  if user in seen:
    raise _BadRow("user", f"duplicate trace for user {user}")
  if not isinstance(reasoning, str):
    raise _BadRow("reasoning", "must be a string")
  n = len(examples[user].candidates)
  if (not isinstance(ranking, list) or any(isinstance(s, bool) or not isinstance(s, int)
                                           for s in ranking)
      or sorted(ranking) != list(range(n))):
    raise _BadRow("ranking", f"must be a permutation of the slots 0..{n - 1}, got {ranking!r}")
  seen.add(user)
  example = dataclasses.replace(examples[user], teacher_ranking=np.asarray(ranking, np.int32),
                                citations=())
  teacher = row.get("teacher")
  return Trace(example, reasoning, teacher if isinstance(teacher, str) else None)


SHOWN_SKIPPED = 5  # skipped rows named one by one in stats['skipped'] (the rest are counted)


def load_traces(path: str | pathlib.Path, examples: list[RerankExample], *, rejection: bool = True,
                strict: bool = False) -> tuple[list[Trace], dict]:
  """Reads LLM-written traces `{"user": int, "reasoning": str, "ranking": [slots, best first]}`.

  Args:
    path: the JSONL file, one trace per line (blank lines skipped).
    examples: the examples the traces are for (one per user), e.g. the training lists.
    rejection: keep only traces whose top-1 is the target (GR2's rejection sampling).
    strict: raise on the first bad row instead of counting and skipping it.

  Returns:
    (kept traces in file order, stats {'rows', 'bad', 'bad_reasons' (count per kind: 'json',
    'object', 'user', 'reasoning', 'ranking'), 'skipped' (the first SHOWN_SKIPPED bad rows as
    'file:line: why'), 'accepted', 'kept', 'acceptance' (of the valid rows), 'teachers' (the
    sorted distinct "teacher" digests of the valid rows that name one; data/llm_teacher.py
    writes them)}).

  Raises:
    TraceError: with strict=True, a bad row (file:line and the reason).
  """
  path = pathlib.Path(path)
  by_user = {ex.user: ex for ex in examples}
  if len(by_user) != len(examples):
    raise ValueError("load_traces needs one example per user")
  seen: set[int] = set()
  traces, bad, skipped = [], collections.Counter(), []
  rows = 0
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      rows += 1
      try:
        traces.append(_parse_trace(line, by_user, seen))
      except _BadRow as err:
        if strict:
          raise TraceError(f"{path}:{lineno}: {err} (data.strict_traces=False skips such "
                           "rows)") from err
        bad[err.kind] += 1
        if len(skipped) < SHOWN_SKIPPED:
          skipped.append(f"{path}:{lineno}: {err}")
  good = [t for t in traces
          if t.example.teacher_ranking[0] == t.example.target_position]
  kept = good if rejection else traces
  stats = {"rows": rows, "bad": sum(bad.values()), "bad_reasons": dict(bad), "skipped": skipped,
           "accepted": len(good), "kept": len(kept),
           "acceptance": len(good) / len(traces) if traces else 0.0,
           "teachers": sorted({t.teacher for t in traces if t.teacher is not None})}
  return kept, stats
