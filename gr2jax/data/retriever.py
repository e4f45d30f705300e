"""Co-occurrence + recency retriever (docs/choices.md, "Retriever").

Fit on the training sequences only (`split.training_sequences`):
  C[i, j] = sum over users and positions a < b <= a + window of   1/(b-a)        for i=s_a, j=s_b
                                                              + reverse/(b-a)  for i=s_b, j=s_a
  M[i]    = C[i] / sqrt(freq_i)              (freq_i: how many training sequences hold item i)
  score(u, j) = sum_k decay^k * M[h_k, j]    over the last `history` items h_0 (newest), h_1, ...
Leave-own-user-out (for lists whose target lies inside the user's own training sequence): C and
freq lose the user's own contributions before scoring, so a training target is never scored by
transitions that contain it. Scores of items the user holds in the history are NOT masked here:
the callers exclude what they need (full ranking: the history; candidate lists: all interactions).
"""

import dataclasses
from collections.abc import Iterator

import numpy as np
import scipy.sparse as sp

from gr2jax import metrics
from gr2jax.data.build_settings import RetrieverSettings
from gr2jax.data.split import PAD

_ZERO = 1e-9  # |score| below this is exactly 0 (float64 leave-own-out residue; real scores >~1e-6)


@dataclasses.dataclass(frozen=True)
class CoocRetriever:
  """A fitted retriever.

  Attributes:
    config: its RetrieverSettings.
    counts: [I, I] CSR float64 transition weights C.
    freq: [I] float64 training-sequence frequency of each item.
    own_keys: [P] int64 sorted keys user * I + src of each user's own contributions to C.
    own_dst: [P] int32 destination item of each own contribution.
    own_val: [P] float64 its weight.
    user_item_keys: [T] int64 sorted keys user * I + item of the training interactions.
  """

  config: RetrieverSettings
  counts: sp.csr_matrix
  freq: np.ndarray
  own_keys: np.ndarray
  own_dst: np.ndarray
  own_val: np.ndarray
  user_item_keys: np.ndarray

  @property
  def num_items(self) -> int:
    return self.counts.shape[0]


def fit(train_sequences: list[np.ndarray], num_items: int,
        config: RetrieverSettings | None = None) -> CoocRetriever:
  """Counts the transitions of the training sequences (one per user, user index = list index).

  Args:
    train_sequences: per user int32 items, oldest first (training part only).
    num_items: I.
    config: the hyperparameters (RetrieverSettings() when None).

  Returns:
    The fitted CoocRetriever.
  """
  config = RetrieverSettings() if config is None else config
  lengths = np.array([len(s) for s in train_sequences])
  flat = np.concatenate(train_sequences).astype(np.int64)
  if flat.size and (flat.min() < 0 or flat.max() >= num_items):
    raise ValueError(f"item ids must lie in [0, {num_items}), got [{flat.min()}, {flat.max()}]")
  owner = np.repeat(np.arange(len(train_sequences)), lengths)
  users, src, dst, val = [], [], [], []
  for gap in range(1, config.window + 1):
    same = np.nonzero(owner[:-gap] == owner[gap:])[0]  # pairs (a, a + gap) of one user
    a, b = flat[same], flat[same + gap]
    users += [owner[same]] * 2
    src += [a, b]
    dst += [b, a]
    val += [np.full(same.size, 1.0 / gap), np.full(same.size, config.reverse / gap)]
  users, src, dst, val = (np.concatenate(x) for x in (users, src, dst, val))
  counts = sp.csr_matrix((val, (src, dst)), shape=(num_items, num_items))
  counts.sum_duplicates()
  keys = users * num_items + src
  order = np.argsort(keys, kind="stable")
  return CoocRetriever(
      config=config, counts=counts,
      freq=np.bincount(flat, minlength=num_items).astype(np.float64),
      own_keys=keys[order], own_dst=dst[order].astype(np.int32), own_val=val[order],
      user_item_keys=np.sort(owner * num_items + flat))


def _ranges(sorted_keys: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """For each key, the [lo, hi) range of its occurrences in sorted_keys."""
  return (np.searchsorted(sorted_keys, keys, "left"), np.searchsorted(sorted_keys, keys, "right"))


def score(retriever: CoocRetriever, histories: np.ndarray,
          users: np.ndarray | None = None) -> np.ndarray:
  """Scores every item for each history.

  Args:
    retriever: the fitted retriever.
    histories: [E, H] int32 right-aligned histories (newest in column H-1), PAD-padded; only the
      last `config.history` columns are used.
    users: [E] user indices for leave-own-user-out scoring, or None for plain scoring.

  Returns:
    [E, I] float32 scores (exact zeros where there is no evidence).
  """
  cfg = retriever.config
  num_items = retriever.num_items
  hist = histories[:, -cfg.history:]  # [E, h]
  e_idx, col = np.nonzero(hist != PAD)
  items = hist[e_idx, col].astype(np.int64)
  age = hist.shape[1] - 1 - col  # 0 = newest
  freq = retriever.freq[items]
  if users is not None:
    keys = users[e_idx].astype(np.int64) * num_items + items
    lo, hi = _ranges(retriever.user_item_keys, keys)
    freq = freq - (hi - lo)
  weight = np.where(freq > 0, cfg.decay ** age / np.sqrt(np.maximum(freq, 1)), 0.0)
  w = sp.csr_matrix((weight, (e_idx, items)), shape=(hist.shape[0], num_items))
  scores = w @ retriever.counts  # [E, I] sparse float64
  if users is not None:
    lo, hi = _ranges(retriever.own_keys, keys)
    n = hi - lo
    rows = np.repeat(np.arange(lo.size), n)
    pos = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n) + lo[rows]
    own = sp.csr_matrix((weight[rows] * retriever.own_val[pos],
                         (e_idx[rows], retriever.own_dst[pos])), shape=scores.shape)
    scores = (scores - own).tocsr()
    scores.data[np.abs(scores.data) < _ZERO] = 0.0
  return scores.astype(np.float32).toarray()


def score_chunks(retriever: CoocRetriever, histories: np.ndarray, users: np.ndarray | None = None,
                 chunk_size: int = 2048) -> Iterator[tuple[slice, np.ndarray]]:
  """`score` in chunks of examples: yields (slice of examples, [c, I] scores)."""
  for start in range(0, histories.shape[0], chunk_size):
    sl = slice(start, start + chunk_size)
    yield sl, score(retriever, histories[sl], None if users is None else users[sl])


def full_ranking_ranks(scores: np.ndarray, targets: np.ndarray, exclude: list[np.ndarray],
                       rng: np.random.Generator) -> np.ndarray:
  """1-based rank of each target among all items but the excluded ones, ties broken at random.

  Args:
    scores: [E, I] item scores.
    targets: [E] target items.
    exclude: per example the items removed from the ranking (the user's history).
    rng: draws the target's place among the items tied with it.

  Returns:
    [E] int64 ranks.
  """
  scores = scores.copy()
  rows = np.repeat(np.arange(len(exclude)), [len(x) for x in exclude])
  scores[rows, np.concatenate(exclude)] = -np.inf
  target_scores = scores[np.arange(len(targets)), targets][:, None]
  greater = (scores > target_scores).sum(axis=1)
  others_tied = (scores == target_scores).sum(axis=1) - 1
  return 1 + greater + rng.integers(0, others_tied + 1)


def evaluate(retriever: CoocRetriever, histories: np.ndarray, targets: np.ndarray,
             exclude: list[np.ndarray], users: np.ndarray | None = None, seed: int = 0,
             ks: tuple[int, ...] = (10,)) -> dict[str, float]:
  """Full-ranking Recall@K / NDCG@K of the retriever (history items excluded, random ties).

  Args:
    retriever: the fitted retriever.
    histories: [E, H] right-aligned histories.
    targets: [E] target items.
    exclude: per example the items not ranked (the user's full history before the target).
    users: [E] for leave-own-user-out scoring (training targets), else None.
    seed: seeds the tie-breaking.
    ks: cut-offs.

  Returns:
    {'R@K': ..., 'N@K': ...} means over the examples.
  """
  rng = np.random.default_rng(seed)
  ranks = np.concatenate([
      full_ranking_ranks(s, targets[sl], exclude[sl], rng)
      for sl, s in score_chunks(retriever, histories, users)])
  return metrics.ranking_metrics(ranks, ks)
