"""Ranking metrics: the one place Recall@K and NDCG@K are computed (GR2, arXiv 2602.07774), and
the one paired comparison of two systems on the same users (`versus`, `paired_bootstrap`: Table
2's and Table 3's intervals).

Everything is a function of the target's 1-based rank r in a ranking (0 = target absent):
  Recall@K = [1 <= r <= K],   NDCG@K = [1 <= r <= K] / log2(r + 1)   (one relevant item, IDCG = 1).
All functions are vectorised over examples and run on numpy (host-side evaluation).
"""

from typing import NamedTuple

import numpy as np

ABSENT = 0  # the rank of a target that is not in the ranking (e.g. an invalid answer omitted it)


def target_ranks(rankings: np.ndarray, targets: np.ndarray) -> np.ndarray:
  """1-based rank of each example's target in its ranking.

  Args:
    rankings: [E, N] ranked ids (best first); any integer ids (slots, items).
    targets: [E] the target id of each example.

  Returns:
    [E] int32 rank in 1..N, or ABSENT (0) when the target is not in the row. When the target
    occurs more than once the first occurrence counts.
  """
  rankings = np.asarray(rankings)
  targets = np.asarray(targets)
  if rankings.ndim != 2 or targets.shape != rankings.shape[:1]:
    raise ValueError(f"rankings must be [E, N] and targets [E], got {rankings.shape} and "
                     f"{targets.shape}")
  hit = rankings == targets[:, None]  # [E, N]
  return np.where(hit.any(axis=1), hit.argmax(axis=1) + 1, ABSENT).astype(np.int32)


def recall_at_k(ranks: np.ndarray, k: int) -> np.ndarray:
  """Per-example Recall@K from 1-based ranks ([E] -> [E] float32)."""
  ranks = np.asarray(ranks)
  return ((ranks >= 1) & (ranks <= k)).astype(np.float32)


def ndcg_at_k(ranks: np.ndarray, k: int) -> np.ndarray:
  """Per-example NDCG@K with one relevant item (IDCG = 1): 1 / log2(r + 1) if 1 <= r <= K."""
  ranks = np.asarray(ranks)
  gain = 1.0 / np.log2(np.maximum(ranks, 1) + 1.0)
  return np.where((ranks >= 1) & (ranks <= k), gain, 0.0).astype(np.float32)


def ranking_metrics(ranks: np.ndarray, ks: tuple[int, ...] = (1, 3, 10)) -> dict[str, float]:
  """Mean Recall@K and NDCG@K over examples, keyed 'R@K' / 'N@K' (N@1 == R@1 is omitted)."""
  out = {}
  for k in ks:
    out[f"R@{k}"] = float(recall_at_k(ranks, k).mean())
    if k > 1:
      out[f"N@{k}"] = float(ndcg_at_k(ranks, k).mean())
  return out


def position_histogram(positions: np.ndarray, num_positions: int) -> np.ndarray:
  """Share of examples whose target sits at each 0-based position of the list.

  Args:
    positions: [E] 0-based target positions.
    num_positions: N, the list length.

  Returns:
    [N] float64 shares summing to 1.
  """
  positions = np.asarray(positions)
  if positions.size == 0:
    raise ValueError("position_histogram of zero examples")
  if positions.min() < 0 or positions.max() >= num_positions:
    raise ValueError(f"positions must lie in [0, {num_positions}), got range "
                     f"[{positions.min()}, {positions.max()}]")
  return np.bincount(positions, minlength=num_positions) / positions.size


def best_fixed_position_recall1(positions: np.ndarray, num_positions: int) -> tuple[int, float]:
  """Recall@1 of the best constant answer "the item at position p" (a positional-leak probe).

  Returns:
    (p, its Recall@1), p 0-based; p = 0 with R@1 = the floor means no position beats D's order.
  """
  hist = position_histogram(positions, num_positions)
  best = int(hist.argmax())
  return best, float(hist[best])


def percentiles(values, qs=(50, 90, 99, 100)) -> dict[str, float | None]:
  """{'p<q>': the q-th percentile of values} (None for every q when there are no values)."""
  values = np.asarray(values, np.float64)
  return {f"p{q}": float(np.percentile(values, q)) if values.size else None for q in qs}


# ---- paired comparisons ---------------------------------------------------------------------


class PerUser(NamedTuple):
  """A system's per-user outcome on a split, in the split's order.

  Attributes:
    users: [n] user ids.
    ranks: [n] 1-based rank of each user's target in the system's ranking (target_ranks).
  """
  users: np.ndarray
  ranks: np.ndarray


RESAMPLES, SEED = 10_000, 0
METHOD = f"paired bootstrap, {RESAMPLES} resamples of users, percentile"
PER_USER = {"R@1": lambda ranks: recall_at_k(ranks, 1),  # [n] ranks -> [n] values
            "N@3": lambda ranks: ndcg_at_k(ranks, 3)}


def paired_bootstrap(a: np.ndarray, b: np.ndarray, *, resamples: int = RESAMPLES,
                     seed: int = SEED, level: float = 0.95) -> tuple[float, float, float]:
  """The mean paired difference mean(a - b) and its paired-bootstrap percentile interval.

  Paired bootstrap over users (Efron & Tibshirani 1993, ch. 13, the percentile interval): each of
  `resamples` resamples draws n users with replacement, the same users for both systems, and
  takes the mean of their differences; the interval is the (1 - level) / 2 and (1 + level) / 2
  percentiles of those means. A resample's mean depends only on how often each distinct
  difference is drawn, so the draws are multinomial counts over the distinct values of a - b:
  the same distribution as drawing user indices, in O(resamples x distinct values) memory.

  Args:
    a, b: [n] per-user values of two systems (e.g. R@1 in {0, 1}), the same users in the same
      order, n >= 1.
    resamples: bootstrap resamples.
    seed: the generator's seed (fixed: the same arrays give the same interval).
    level: the interval's coverage.

  Returns:
    (mean(a - b), lo, hi).
  """
  a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
  if a.ndim != 1 or a.shape != b.shape or not a.size:
    raise ValueError(f"paired_bootstrap needs two [n] arrays, n >= 1; got {a.shape} and "
                     f"{b.shape}")
  diff = a - b  # [n]
  values, counts = np.unique(diff, return_counts=True)  # [K], [K]
  draws = np.random.default_rng(seed).multinomial(diff.size, counts / diff.size,
                                                  size=resamples)  # [resamples, K]
  means = draws @ values / diff.size  # [resamples]
  lo, hi = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
  return float(diff.mean()), float(lo), float(hi)


def versus(row: PerUser, base: PerUser) -> dict:
  """{'R@1' | 'N@3': [row - base, lo, hi] (paired_bootstrap), 'method': METHOD}.

  Raises:
    ValueError: the two rows are not on the same users in the same order.
  """
  if not np.array_equal(row.users, base.users):
    raise ValueError(f"paired rows must be on the same users: {len(row.users)} and "
                     f"{len(base.users)} users, not in the same order")
  out = {name: list(paired_bootstrap(f(row.ranks), f(base.ranks)))
         for name, f in PER_USER.items()}
  return {**out, "method": METHOD}
