"""Per-candidate evidence: recency-weighted brand / leaf / category-path matches with the history.

For candidate c and the last `window` history items h_0 (newest), h_1, ... with weights
w_k = decay^k (docs/results/data_build.md):
  brand = sum_k w_k [brand(h_k) == brand(c), brand known] / sum_k w_k
  leaf  = sum_k w_k [category path(h_k) == category path(c)] / sum_k w_k   (same leaf node)
  path  = sum_k w_k min(shared path depth below "Beauty", 3) / 3 / sum_k w_k
Each level in [0, 1] is bucketed to 0 (no match) or 1..4 (quartile bins of the nonzero values of
the training lists; `fit_thresholds`). Null and the literal "Unknown" are not known brands.
"""

import dataclasses

import numpy as np

from gr2jax.data.records import Catalog
from gr2jax.data.split import PAD

KINDS = ("brand", "leaf", "path")  # the columns of RerankExample.evidence
UNKNOWN_BRANDS = (None, "", "Unknown")
PATH_DEPTH = 3  # levels below the root that count for the path overlap
NUM_BUCKETS = 5  # 0 = none, 1..4 = quartiles of the nonzero values


@dataclasses.dataclass(frozen=True)
class ItemFeatures:
  """Interned per-item ids that the matches compare.

  Attributes:
    brand: [I] int32 brand id, -1 when unknown.
    leaf: [I] int32 id of the full category path.
    prefix: [I, PATH_DEPTH] int32 id of the path prefix below the root down to depth d+1
      (-1 beyond the path's end).
  """

  brand: np.ndarray
  leaf: np.ndarray
  prefix: np.ndarray


@dataclasses.dataclass(frozen=True)
class Evidence:
  """Match levels and the history items behind them, for candidates [E, N] and histories [E, W].

  Attributes:
    values: [E, N, 3] float64 recency-weighted levels (brand, leaf, path) in [0, 1].
    brand_match: [E, N, W] bool history column w has the candidate's known brand.
    leaf_match: [E, N, W] bool history column w has the candidate's category path.
    path_depth: [E, N, W] int8 shared depth (0..PATH_DEPTH) of the category paths below the root.
    window_start: column of the histories array where the W evidence columns begin.
  """

  values: np.ndarray
  brand_match: np.ndarray
  leaf_match: np.ndarray
  path_depth: np.ndarray
  window_start: int


def _intern(keys: list) -> np.ndarray:
  ids: dict = {}
  return np.array([-1 if k is None else ids.setdefault(k, len(ids)) for k in keys], np.int32)


def item_features(catalog: Catalog) -> ItemFeatures:
  """Interns brands, category paths and path prefixes of the catalogue."""
  brands = [None if b in UNKNOWN_BRANDS else b for b in catalog.brands]
  prefix = np.stack([_intern([c[1:d + 2] if len(c) > d + 1 else None for c in catalog.categories])
                     for d in range(PATH_DEPTH)], axis=1)
  return ItemFeatures(brand=_intern(brands), leaf=_intern(list(catalog.categories)), prefix=prefix)


def compute(features: ItemFeatures, histories: np.ndarray, candidates: np.ndarray,
            decay: float = 0.8, window: int = 20) -> Evidence:
  """The evidence of every candidate against its example's history.

  Args:
    features: item_features of the catalogue.
    histories: [E, H] int32 right-aligned histories (newest in column H-1), PAD-padded.
    candidates: [E, N] int32 candidate items.
    decay: recency decay per history step (newest weight 1).
    window: how many of the most recent history items count (W = min(window, H)).

  Returns:
    The Evidence.
  """
  start = max(histories.shape[1] - window, 0)
  hist = histories[:, start:]  # [E, W]
  valid = hist != PAD
  w = np.where(valid, decay ** np.arange(hist.shape[1] - 1, -1, -1, dtype=np.float64), 0.0)
  total = np.maximum(w.sum(axis=1), 1e-30)[:, None]  # [E, 1]
  h = np.where(valid, hist, 0)
  hb, cb = features.brand[h][:, None, :], features.brand[candidates][:, :, None]
  brand = (hb == cb) & (cb >= 0) & valid[:, None, :]  # [E, N, W]
  leaf = (features.leaf[h][:, None, :] == features.leaf[candidates][:, :, None]) & valid[:, None]
  hp = features.prefix[h][:, None, :, :]  # [E, 1, W, D]
  cp = features.prefix[candidates][:, :, None, :]  # [E, N, 1, D]
  depth = (((hp == cp) & (cp >= 0)).sum(axis=-1) * valid[:, None, :]).astype(np.int8)
  values = np.stack([(brand * w[:, None]).sum(-1), (leaf * w[:, None]).sum(-1),
                     (depth * w[:, None]).sum(-1) / PATH_DEPTH], axis=-1) / total[:, :, None]
  return Evidence(values=values, brand_match=brand, leaf_match=leaf, path_depth=depth,
                  window_start=start)


def fit_thresholds(values: np.ndarray) -> np.ndarray:
  """Quartile thresholds of the nonzero levels of each kind (fit on training lists only).

  Args:
    values: [..., 3] evidence levels.

  Returns:
    [3, 3] float64: per kind the 25/50/75 % quantiles of its nonzero values (1.0 when none).
  """
  flat = values.reshape(-1, len(KINDS))
  out = np.ones((len(KINDS), 3))
  for k in range(len(KINDS)):
    nonzero = flat[flat[:, k] > 0, k]
    if nonzero.size:
      out[k] = np.quantile(nonzero, [0.25, 0.5, 0.75])
  return out


def bucketize(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
  """Levels -> buckets: 0 for no match, else 1 + the number of thresholds the value exceeds.

  Args:
    values: [..., 3] evidence levels.
    thresholds: [3, 3] from fit_thresholds.

  Returns:
    [..., 3] int32 buckets in 0..NUM_BUCKETS-1.
  """
  above = (values[..., None] > thresholds).sum(axis=-1)  # [..., 3]
  return np.where(values > 0, 1 + above, 0).astype(np.int32)


def matching_positions(evidence: Evidence, e: int, slot: int, kind: str, history_width: int,
                       history_len: int, min_depth: int = 1) -> tuple[int, ...]:
  """The history indices (newest first) of the items behind one candidate's match.

  Args:
    evidence: from `compute`.
    e: example index.
    slot: candidate slot.
    kind: 'brand', 'leaf' or 'path' (items sharing at least `min_depth` path levels).
    history_width: H, the width of the histories array given to `compute`.
    history_len: h, the example's unpadded history length (indices are into that history).
    min_depth: for 'path', the shared depth required.

  Returns:
    Indices into the example's history, newest first.
  """
  if kind == "brand":
    hit = evidence.brand_match[e, slot]
  elif kind == "leaf":
    hit = evidence.leaf_match[e, slot]
  elif kind == "path":
    hit = evidence.path_depth[e, slot] >= min_depth
  else:
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
  cols = np.nonzero(hit)[0] + evidence.window_start  # columns of the [E, H] histories
  return tuple(int(c) for c in (cols - (history_width - history_len))[::-1])
