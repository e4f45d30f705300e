"""Learned-model headroom: a pointwise GBDT on the teacher's features.

The rule teacher must beat D's floor; a learned model on the same per-candidate features shows how
much a re-ranker can win (docs/results/data_build.md: .481/.726/.623 against the floor
.393/.592/.508). A HistGradientBoostingClassifier (100 iterations -- 200 gave the same metrics at
1.3x the cost -- 31 leaves, no early stopping, seeded, one OpenMP thread: the same model, and
10-14x faster than two threads on a 2-core machine that is busy with anything else, where OpenMP's
threads wait on each other) is fit pointwise (label: the slot holds the target) on the VALIDATION
lists, the honest choice: training lists are leave-own-user-out scored and their evidence
thresholds come from them. Each list is ranked by the predicted probability (ties keep D's order)
and scored with `gr2jax.metrics` on the evaluation sets (test and the 1,615-user subset).

The features reuse what the examples step already computed (evidence.Evidence, the list scores,
the retriever's training frequencies and the teacher's scores); nothing is recomputed.
"""

import time

import numpy as np
from sklearn.ensemble import HistGradientBoostingClassifier
from threadpoolctl import threadpool_limits

from gr2jax import metrics
from gr2jax.data import evidence as evidence_lib

FEATURES = ("position", "score_z", "score_gap_next", "log_popularity",
            "brand", "leaf", "path",  # recency-weighted evidence levels (evidence.KINDS)
            "brand_any", "leaf_any", "brand_last", "leaf_last", "path_depth_last",
            "teacher_score")


def candidate_features(ev: evidence_lib.Evidence, scores: np.ndarray, popularity: np.ndarray,
                       teacher_scores: np.ndarray) -> np.ndarray:
  """Per-candidate features [E, N, F] (F = len(FEATURES), in FEATURES order) of candidate lists.

  position = p / (N-1); score_z = (s - mean) / std of the list's retriever scores (0 when the
  list's scores are constant); score_gap_next = s_p - s_{p+1} (0 for the last slot);
  log_popularity = log1p(training frequency); brand / leaf / path = `ev.values`; *_any = any match
  in the evidence window; *_last = the match with the newest history item (window column W-1; the
  histories are right-aligned), path_depth_last in [0, 1] (depth / PATH_DEPTH);
  teacher_score = teacher.scores.

  Args:
    ev: the split's Evidence ([E, N, ...]).
    scores: [E, N] retriever scores in D's order (non-increasing).
    popularity: [E, N] training-sequence frequency of each candidate (retriever.freq).
    teacher_scores: [E, N] the rule teacher's scores.

  Returns:
    [E, N, F] float32.
  """
  scores = np.asarray(scores, np.float64)
  e, n = scores.shape
  for name, a in (("popularity", popularity), ("teacher_scores", teacher_scores),
                  ("ev.values", ev.values[..., 0])):
    if np.shape(a) != (e, n):
      raise ValueError(f"candidate_features: {name} has shape {np.shape(a)}, expected {(e, n)} "
                       f"like scores")
  std = scores.std(axis=1, keepdims=True)
  z = np.where(std > 0, (scores - scores.mean(axis=1, keepdims=True)) / np.maximum(std, 1e-30), 0)
  gap = np.concatenate([scores[:, :-1] - scores[:, 1:], np.zeros((e, 1))], axis=1)
  position = np.broadcast_to(np.arange(n) / max(n - 1, 1), (e, n))
  columns = [position, z, gap, np.log1p(np.asarray(popularity, np.float64)),
             *np.moveaxis(ev.values, -1, 0),
             ev.brand_match.any(-1), ev.leaf_match.any(-1),
             ev.brand_match[..., -1], ev.leaf_match[..., -1],
             ev.path_depth[..., -1] / evidence_lib.PATH_DEPTH, teacher_scores]
  return np.stack(columns, axis=-1).astype(np.float32)


def _rankings(model: HistGradientBoostingClassifier, features: np.ndarray) -> np.ndarray:
  """[E, N] int32 slots by predicted target probability, best first (ties keep D's order)."""
  e, n, f = features.shape
  proba = model.predict_proba(features.reshape(e * n, f))[:, 1].reshape(e, n)
  return np.argsort(-proba, axis=1, kind="stable").astype(np.int32)


def learned_headroom(fit_features: np.ndarray, fit_targets: np.ndarray,
                     eval_sets: dict[str, tuple[np.ndarray, np.ndarray]], *, seed: int = 0,
                     max_iter: int = 100, max_leaf_nodes: int = 31) -> dict:
  """Fits the pointwise GBDT on one split's lists and reports its ranking metrics elsewhere.

  Args:
    fit_features: [E, N, F] features of the lists it is fit on (validation).
    fit_targets: [E] their target slots.
    eval_sets: {name: ([E', N, F] features, [E'] target slots)} to score (test, test_subset).
    seed: the classifier's random_state (the fit is deterministic; no early stopping).
    max_iter: boosting iterations.
    max_leaf_nodes: leaves per tree.

  Returns:
    {name: {"R@1", "R@3", "N@3"}} of the learned ranking per eval set, "floor": the same metrics
    of D's own order, "fit_s": seconds spent fitting and predicting.
  """
  t = time.perf_counter()
  e, n, f = fit_features.shape
  fit_targets = np.asarray(fit_targets)
  if fit_targets.shape != (e,) or fit_targets.min() < 0 or fit_targets.max() >= n:
    raise ValueError(f"learned_headroom: fit_targets must be [{e}] slots in [0, {n}), got shape "
                     f"{fit_targets.shape}")
  labels = (np.arange(n)[None, :] == fit_targets[:, None]).reshape(-1)
  model = HistGradientBoostingClassifier(max_iter=max_iter, max_leaf_nodes=max_leaf_nodes,
                                         early_stopping=False, random_state=seed)
  out = {"floor": {}}
  with threadpool_limits(limits=1, user_api="openmp"):
    model.fit(fit_features.reshape(e * n, f), labels)
    for name, (features, targets) in eval_sets.items():
      if features.shape[1:] != (n, f):
        raise ValueError(f"learned_headroom: eval set {name!r} features {features.shape}, "
                         f"expected [E, {n}, {f}]")
      ranks = metrics.target_ranks(_rankings(model, features), targets)
      out[name] = metrics.ranking_metrics(ranks, ks=(1, 3))
      out["floor"][name] = metrics.ranking_metrics(np.asarray(targets) + 1, ks=(1, 3))
  out["fit_s"] = time.perf_counter() - t
  return out
