"""Ranking metrics: the one place Recall@K and NDCG@K are computed (GR2, arXiv 2602.07774).

Everything is a function of the target's 1-based rank r in a ranking (0 = target absent):
  Recall@K = [1 <= r <= K],   NDCG@K = [1 <= r <= K] / log2(r + 1)   (one relevant item, IDCG = 1).
All functions are vectorised over examples and run on numpy (host-side evaluation).
"""

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
