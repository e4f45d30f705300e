"""Candidate lists D: the target plus N-1 negatives, ordered by the retriever (docs/choices.md,
"Candidate lists").

Negatives are drawn uniformly, without replacement, from the items the user never interacted with
(anywhere in the sequence): from the whole catalogue (default) or from the retriever's top-K of
those items. All N items are ordered by retriever score, ties broken AT RANDOM (seeded): breaking
them by popularity sends cold targets last (docs/choices.md, "Candidate lists"), and building D
as "target + the retriever's own top-9" puts the target last in ~92% of lists. Every build reports
the target-position histogram and the best fixed-position Recall@1, and raises on a late-position
spike (target more often last than first) unless `accept_position_leak=True`.
"""

import dataclasses

import numpy as np

from gr2jax import metrics
from gr2jax.data import retriever as retriever_lib
from gr2jax.data.records import SPLITS
from gr2jax.data.split import SplitExamples


class PositionLeakError(ValueError):
  """The target-position histogram has a late-position spike."""


@dataclasses.dataclass(frozen=True)
class CandidateConfig:
  """How D is built: the data build's settings of the same names (data.*; their bounds and the
  pool's rule are checked there, build_settings.DataSettings).

  Attributes:
    num_candidates: N, the list length (target + N-1 negatives).
    negative_pool: 'catalogue' (all unseen items) or 'topk' (the retriever's top `pool_size`
      unseen items).
    pool_size: K for the 'topk' pool (>= N-1).
    seed: seeds the negatives and the tie-breaking (combined with the split).
    accept_position_leak: build even when the histogram has a late-position spike.
  """

  num_candidates: int = 10
  negative_pool: str = "catalogue"
  pool_size: int = 3000
  seed: int = 0
  accept_position_leak: bool = False


@dataclasses.dataclass(frozen=True)
class CandidateLists:
  """D for every example of a split.

  Attributes:
    candidates: [E, N] int32 items in D's order (retriever score, descending).
    scores: [E, N] float32 their retriever scores (non-increasing along N).
    target_positions: [E] int32 0-based position of the target in D.
    report: position_report() of the lists.
  """

  candidates: np.ndarray
  scores: np.ndarray
  target_positions: np.ndarray
  report: dict


def position_report(target_positions: np.ndarray, num_candidates: int) -> dict:
  """The target-position histogram, the best fixed position and D's floor metrics.

  Returns:
    {'histogram': [N] shares, 'best_fixed_position': p (0-based), 'best_fixed_R@1': share,
     'R@1', 'R@3', 'N@3': metrics of D's own order}.
  """
  hist = metrics.position_histogram(target_positions, num_candidates)
  best, best_r1 = metrics.best_fixed_position_recall1(target_positions, num_candidates)
  floor = metrics.ranking_metrics(np.asarray(target_positions) + 1, ks=(1, 3))
  return {"histogram": [round(float(h), 4) for h in hist], "best_fixed_position": best,
          "best_fixed_R@1": best_r1, **floor}


def check_position_leak(report: dict, accept: bool, what: str) -> None:
  """Raises PositionLeakError when the target is more often last than first (unless accepted)."""
  hist = report["histogram"]
  if hist[-1] > hist[0] and not accept:
    raise PositionLeakError(
        f"{what}: the target is last in {hist[-1]:.3f} of lists but first in only {hist[0]:.3f} "
        f"(histogram {hist}); a model reading positions gets R@1 {report['best_fixed_R@1']:.3f}. "
        "Use negatives from the catalogue or a wider pool, or set accept_position_leak=True.")


def _interaction_keys(sequences: list[np.ndarray], num_items: int) -> np.ndarray:
  """Sorted keys user * I + item of every interaction."""
  lengths = [len(s) for s in sequences]
  owner = np.repeat(np.arange(len(sequences), dtype=np.int64), lengths)
  return np.sort(owner * num_items + np.concatenate(sequences))


def _contains(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
  pos = np.minimum(np.searchsorted(sorted_keys, keys), sorted_keys.size - 1)
  return sorted_keys[pos] == keys


class TooFewUnseenError(ValueError):
  """A user has fewer unseen items than D needs negatives (drawing them could never finish)."""


def check_unseen(users: np.ndarray, interaction_keys: np.ndarray, num_items: int,
                 num: int) -> None:
  """Raises TooFewUnseenError when a user of `users` never touched fewer than `num` items.

  Args:
    users: [E] user of each example.
    interaction_keys: `_interaction_keys` of the sequences.
    num_items: I.
    num: negatives per example.
  """
  users = np.unique(users).astype(np.int64)
  touched = (np.searchsorted(interaction_keys, (users + 1) * num_items)
             - np.searchsorted(interaction_keys, users * num_items))
  short = users[num_items - touched < num]
  if short.size:
    raise TooFewUnseenError(
      f"users at 0-based indices {short[:5].tolist()} (of {short.size}) never touched fewer "
      f"than the {num} items D needs as negatives in a catalogue of {num_items} (the data "
      "build names them by file, line and user id, and drops them with "
      "data.drop_unusable_users=True)")


def sample_catalogue_negatives(rng: np.random.Generator, users: np.ndarray,
                               interaction_keys: np.ndarray, num_items: int,
                               num: int) -> np.ndarray:
  """`num` distinct items per example drawn uniformly from the items its user never touched.

  Rejection sampling: draw with replacement, drop interacted items and repeats, keep the first
  `num`; rows short of `num` are redrawn with twice as many draws (`num` unseen items exist for
  every user, checked first, so it ends).

  Args:
    rng: the generator.
    users: [E] user of each example.
    interaction_keys: `_interaction_keys` of the sequences.
    num_items: I.
    num: negatives per example.

  Returns:
    [E, num] int32 items.

  Raises:
    TooFewUnseenError: a user never touched fewer than `num` items.
  """
  check_unseen(users, interaction_keys, num_items, num)
  out = np.full((users.size, num), -1, np.int32)
  todo = np.arange(users.size)
  draws = 2 * num + 8
  while todo.size:
    items = rng.integers(0, num_items, (todo.size, draws))  # [t, draws]
    bad = _contains(interaction_keys, users[todo, None].astype(np.int64) * num_items + items)
    order = np.argsort(items, axis=1, kind="stable")
    srt = np.take_along_axis(items, order, axis=1)
    dup_sorted = np.concatenate([np.zeros((todo.size, 1), bool), srt[:, 1:] == srt[:, :-1]], 1)
    np.put_along_axis(bad, order, np.take_along_axis(bad, order, axis=1) | dup_sorted, axis=1)
    good = ~bad
    done = good.sum(axis=1) >= num
    rows = todo[done]
    idx = np.argsort(~good[done], axis=1, kind="stable")[:, :num]  # first `num` good draws
    out[rows] = np.take_along_axis(items[done], idx, axis=1)
    todo = todo[~done]
    draws *= 2
  return out


def _topk_negatives(rng: np.random.Generator, scores: np.ndarray, interacted: np.ndarray,
                    pool_size: int, num: int) -> np.ndarray:
  """`num` distinct items per row drawn uniformly from its top-`pool_size` unseen items.

  Args:
    rng: the generator.
    scores: [c, I] retriever scores.
    interacted: [c, I] bool, True for the user's items (never drawn).
    pool_size: K.
    num: negatives per row.

  Returns:
    [c, num] int32 items.
  """
  masked = np.where(interacted, -np.inf, scores)
  # top-K by score; ties at the boundary broken at random (most items score exactly 0)
  keys = masked + rng.random(masked.shape) * 1e-12 * (masked == 0)
  pool = np.argpartition(-keys, pool_size - 1, axis=1)[:, :pool_size]  # [c, K]
  pick = np.argpartition(rng.random(pool.shape), num - 1, axis=1)[:, :num]
  return np.take_along_axis(pool, pick, axis=1).astype(np.int32)


def order_by_score(rng: np.random.Generator, items: np.ndarray,
                   scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Sorts each row by score, descending, ties in random order.

  Args:
    rng: draws the tie-breaking keys.
    items: [E, N] items.
    scores: [E, N] their scores.

  Returns:
    ([E, N] items, [E, N] scores) in D's order.
  """
  order = np.lexsort((rng.random(items.shape), -scores), axis=-1)
  return np.take_along_axis(items, order, axis=1), np.take_along_axis(scores, order, axis=1)


def build_lists(retriever: retriever_lib.CoocRetriever, examples: SplitExamples,
                sequences: list[np.ndarray], config: CandidateConfig,
                leave_own_out: bool) -> CandidateLists:
  """Builds D for every example of a split and checks its target-position histogram.

  Args:
    retriever: orders the lists (and supplies the 'topk' pool).
    examples: the split (its histories must cover the retriever's `history` items).
    sequences: all users' full sequences (negatives avoid every item a user interacted with).
    config: the CandidateConfig.
    leave_own_out: score with the user's own training transitions removed (training targets).

  Returns:
    The CandidateLists.

  Raises:
    PositionLeakError: a late-position spike, unless config.accept_position_leak.
    TooFewUnseenError: a user never touched fewer than N-1 items.
  """
  num_items, n = retriever.num_items, config.num_candidates
  rng = np.random.default_rng([config.seed, SPLITS.index(examples.split)])
  keys = _interaction_keys(sequences, num_items)
  if config.negative_pool == "catalogue":  # the sampler checks the unseen items itself
    negatives = sample_catalogue_negatives(rng, examples.users, keys, num_items, n - 1)
  else:
    check_unseen(examples.users, keys, num_items, n - 1)
  items = np.empty((len(examples), n), np.int32)
  scores = np.empty((len(examples), n), np.float64)
  users = examples.users if leave_own_out else None
  for sl, chunk in retriever_lib.score_chunks(retriever, examples.histories, users):
    if config.negative_pool == "topk":
      interacted = np.zeros(chunk.shape, bool)
      chunk_users = examples.users[sl]
      rows = np.repeat(np.arange(chunk_users.size), [len(sequences[u]) for u in chunk_users])
      interacted[rows, np.concatenate([sequences[u] for u in chunk_users])] = True
      negs = _topk_negatives(rng, chunk, interacted, config.pool_size, n - 1)
    else:
      negs = negatives[sl]
    items[sl] = np.concatenate([examples.targets[sl, None], negs], axis=1)
    scores[sl] = np.take_along_axis(chunk, items[sl].astype(np.int64), axis=1)
  items, scores = order_by_score(rng, items, scores)
  positions = (items == examples.targets[:, None]).argmax(axis=1).astype(np.int32)
  report = position_report(positions, n)
  check_position_leak(report, config.accept_position_leak,
                      f"{examples.split} lists ({config.negative_pool} pool)")
  return CandidateLists(candidates=items, scores=scores.astype(np.float32),
                        target_positions=positions, report=report)
