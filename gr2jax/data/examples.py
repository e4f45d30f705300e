"""Re-ranking examples: split -> retriever -> candidate lists -> evidence -> rule teacher.

`build_examples` wires split.py, retriever.py, candidates.py, evidence.py and teacher.py into
`RerankExample`s per split plus a stats dict for the pipeline's summary. Only training data fit
anything: the retriever (training sequences), the evidence thresholds (training lists); the
teacher's weights are tuned on validation. Training lists are scored leave-own-user-out. The
teacher ranking and citations are attached to training examples only (GR2's SFT targets).
"""

import dataclasses
import time

import numpy as np

from gr2jax.data import candidates as candidates_lib
from gr2jax.data import evidence as evidence_lib
from gr2jax.data import headroom as headroom_lib
from gr2jax.data import retriever as retriever_lib
from gr2jax.data import split as split_lib
from gr2jax.data import teacher as teacher_lib
from gr2jax.data.build_settings import RetrieverSettings
from gr2jax.data.records import SPLITS, Catalog, RerankExample


def _full_history(sequences: list[np.ndarray], ex: split_lib.SplitExamples) -> list[np.ndarray]:
  return [sequences[u][:e] for u, e in zip(ex.users, ex.ends, strict=True)]


def _records(ex: split_lib.SplitExamples, lists: candidates_lib.CandidateLists,
             buckets: np.ndarray, histories: np.ndarray, ranking: np.ndarray | None,
             ev: evidence_lib.Evidence | None, catalog: Catalog,
             keep: np.ndarray) -> list[RerankExample]:
  """RerankExamples of the kept rows (teacher ranking + citations when `ranking` is given)."""
  out = []
  width = histories.shape[1]
  for e in np.nonzero(keep)[0]:
    row = histories[e]
    history = row[row != split_lib.PAD]
    cites = ()
    if ranking is not None:
      cites = teacher_lib.citations(ranking[e], ev, e, lists.candidates[e], catalog, width,
                                    len(history))
    out.append(RerankExample(
        user=int(ex.users[e]), split=ex.split, history=history, candidates=lists.candidates[e],
        target_position=int(lists.target_positions[e]), retriever_scores=lists.scores[e],
        evidence=buckets[e], teacher_ranking=None if ranking is None else ranking[e],
        citations=cites))
  return out


@dataclasses.dataclass(frozen=True)
class ExampleSpec:
  """How the examples are built (data/pipeline.py `example_spec` reads them from the data
  config, where every default and comment lives).

  Attributes:
    max_history: history items kept in each example (evidence uses the last `evidence_window`
      of these; the retriever always sees its own `history` items).
    num_candidates: N.
    negative_pool: 'catalogue' or 'topk' (candidates.CandidateConfig).
    pool_size: K of the 'topk' pool.
    seed: seeds negatives and tie-breaking.
    rejection: keep only training examples whose teacher top-1 is the target.
    all_training_targets: one training example per training target instead of per user.
    accept_position_leak: build lists even with a late-position spike.
    evidence_decay: recency decay of the evidence levels.
    evidence_window: history items the evidence looks at.
    retriever: the retriever's hyperparameters.
    subset_size: size of the seeded evaluation subset of test users (seed 0).
    learned_headroom: also fit headroom.learned_headroom's GBDT on the validation lists and
      report it on test and the test subset (stats["learned"]).
  """

  max_history: int
  num_candidates: int
  negative_pool: str
  pool_size: int
  seed: int
  rejection: bool
  all_training_targets: bool
  accept_position_leak: bool
  evidence_decay: float
  evidence_window: int
  retriever: RetrieverSettings
  subset_size: int
  learned_headroom: bool


def unusable_users(sequences: list[np.ndarray], num_items: int,
                   num_candidates: int) -> dict[int, str]:
  """The users no example can be built for, and why.

  Args:
    sequences: per user int32 items, oldest first (distinct within a user).
    num_items: I.
    num_candidates: N, the length of D (the target + N-1 negatives the user never touched).

  Returns:
    {0-based user index: why}: fewer than split.MIN_ITEMS items, or fewer than N-1 unseen items.
  """
  lengths = np.array([len(s) for s in sequences], np.int64)
  out = {int(u): f"has {lengths[u]} items; the split needs >= {split_lib.MIN_ITEMS}"
         for u in split_lib.short_users(sequences)}
  for u in np.flatnonzero(num_items - lengths < num_candidates - 1):
    out.setdefault(int(u), f"touched {lengths[u]} of the {num_items} items, leaving "
                           f"{num_items - lengths[u]} unseen; D needs {num_candidates - 1} "
                           "negatives")
  return out


def build_examples(catalog: Catalog, sequences: list[np.ndarray], spec: ExampleSpec,
                   teacher_weights: teacher_lib.TeacherWeights | None = None,
                   ) -> tuple[dict[str, list[RerankExample]], dict]:
  """Builds the re-ranking examples of every split.

  Args:
    catalog: item metadata.
    sequences: per user int32 items, oldest first.
    spec: how (ExampleSpec).
    teacher_weights: fixed teacher weights, or None to tune them on validation NDCG@3.

  Returns:
    ({split: examples}, stats) where stats holds split sizes, the retriever's full-ranking
    R@10 / N@10, D's floor and target-position histogram per split and on the test subset,
    the teacher's weights, metrics and acceptance, the learned headroom (when asked), the
    evidence thresholds and timings.
  """
  t0 = time.perf_counter()
  timings = {}
  ret = retriever_lib.fit(split_lib.training_sequences(sequences), catalog.num_items,
                          spec.retriever)
  timings["retriever_fit_s"] = time.perf_counter() - t0
  cand_cfg = candidates_lib.CandidateConfig(
      num_candidates=spec.num_candidates, negative_pool=spec.negative_pool,
      pool_size=spec.pool_size, seed=spec.seed, accept_position_leak=spec.accept_position_leak)
  features = evidence_lib.item_features(catalog)
  width = max(spec.max_history, ret.config.history)
  subset = split_lib.eval_subset(len(sequences), spec.subset_size)
  stats = {"retriever": {}, "floor": {}, "teacher": {}}
  splits, lists, evs = {}, {}, {}
  for name in SPLITS:
    t = time.perf_counter()
    ex = split_lib.make_split(sequences, name, max_history=width,
                              all_training_targets=spec.all_training_targets and name == "train")
    users = ex.users if name == "train" else None  # leave-own-user-out for training targets
    stats["retriever"][name] = retriever_lib.evaluate(
        ret, ex.histories, ex.targets, _full_history(sequences, ex), users, seed=spec.seed)
    lists[name] = candidates_lib.build_lists(ret, ex, sequences, cand_cfg, name == "train")
    splits[name] = ex
    evs[name] = evidence_lib.compute(features, ex.histories[:, width - spec.max_history:],
                                     lists[name].candidates, spec.evidence_decay,
                                     spec.evidence_window)
    stats["floor"][name] = lists[name].report
    timings[f"{name}_lists_s"] = time.perf_counter() - t
  test_positions = lists["test"].target_positions
  stats["floor"]["test_subset"] = candidates_lib.position_report(
      test_positions[np.isin(splits["test"].users, subset)], spec.num_candidates)

  t = time.perf_counter()
  thresholds = evidence_lib.fit_thresholds(evs["train"].values)
  tuned_n3 = None
  if teacher_weights is None:
    teacher_weights, tuned_n3 = teacher_lib.tune(evs["validation"].values,
                                                 lists["validation"].target_positions)
  rankings = {n: teacher_lib.rankings(evs[n].values, teacher_weights) for n in SPLITS}
  for name in SPLITS:
    stats["teacher"][name] = teacher_lib.ranking_metrics(rankings[name],
                                                         lists[name].target_positions)
  in_subset = np.isin(splits["test"].users, subset)
  stats["teacher"]["test_subset"] = teacher_lib.ranking_metrics(rankings["test"][in_subset],
                                                                test_positions[in_subset])
  accept = teacher_lib.accepted(rankings["train"], lists["train"].target_positions)
  timings["teacher_s"] = time.perf_counter() - t

  if spec.learned_headroom:
    t = time.perf_counter()
    feats = {n: headroom_lib.candidate_features(
        evs[n], lists[n].scores, ret.freq[lists[n].candidates],
        teacher_lib.scores(evs[n].values, teacher_weights)) for n in ("validation", "test")}
    learned = headroom_lib.learned_headroom(
        feats["validation"], lists["validation"].target_positions,
        {"test": (feats["test"], test_positions),
         "test_subset": (feats["test"][in_subset], test_positions[in_subset])}, seed=spec.seed)
    stats["learned"] = {k: learned[k] for k in ("test", "test_subset")}
    timings["learned_s"] = time.perf_counter() - t

  t = time.perf_counter()
  out = {}
  for name in SPLITS:
    keep = accept if (name == "train" and spec.rejection) else np.ones(len(splits[name]), bool)
    is_train = name == "train"
    out[name] = _records(splits[name], lists[name],
                         evidence_lib.bucketize(evs[name].values, thresholds),
                         splits[name].histories[:, width - spec.max_history:],
                         rankings[name] if is_train else None, evs[name] if is_train else None,
                         catalog, keep)
  timings["records_s"] = time.perf_counter() - t
  timings["total_s"] = time.perf_counter() - t0
  stats.update({
      "sizes": {n: len(out[n]) for n in SPLITS} | {"test_subset": int(in_subset.sum()),
                                                   "train_lists": len(splits["train"])},
      "teacher_weights": dataclasses.asdict(teacher_weights),
      "teacher_tuned_validation_N@3": tuned_n3,
      "acceptance": float(accept.mean()),
      "evidence_thresholds": {k: thresholds[i].round(6).tolist()
                              for i, k in enumerate(evidence_lib.KINDS)},
      "config": {name: getattr(spec, name) for name in (
        "max_history", "num_candidates", "negative_pool", "pool_size", "seed", "rejection",
        "all_training_targets", "evidence_decay", "evidence_window", "learned_headroom")},
      "timings": {k: round(v, 2) for k, v in timings.items()},
  })
  return out, stats
