"""Plain records passed between the data modules (see WORKSPACE.md, "Data records").

Items are indexed 0..num_items-1 in the order of `items.jsonl.gz`; users 0..num_users-1 in the
order of `sequences.txt.gz`. Everything here is plain numpy/str so records pickle and hash cheaply.
"""

import dataclasses

import numpy as np

SPLITS = ("train", "validation", "test")


@dataclasses.dataclass(frozen=True)
class Catalog:
  """Item metadata, one entry per item index.

  Attributes:
    asins: [I] item ASINs.
    titles: [I] titles; items without a title hold None (rendered with a placeholder and counted).
    brands: [I] brands or None.
    categories: [I] category paths, general -> specific (always start with "Beauty").
    prices: [I] float32 price, NaN where unknown.
  """

  asins: tuple[str, ...]
  titles: tuple[str | None, ...]
  brands: tuple[str | None, ...]
  categories: tuple[tuple[str, ...], ...]
  prices: np.ndarray

  @property
  def num_items(self) -> int:
    return len(self.asins)


@dataclasses.dataclass(frozen=True)
class Citation:
  """One piece of evidence the rule teacher cites for a candidate it promotes.

  Attributes:
    slot: the candidate's position in D (0-based).
    kind: 'brand' | 'leaf' | 'path' (which match this is).
    value: the matching brand / leaf category / category path prefix, as shown in the prompt.
    history_positions: indices into the example's history of the items that share it (newest first).
  """

  slot: int
  kind: str
  value: str
  history_positions: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class RerankExample:
  """One re-ranking example: a user's history, the candidate list D and (for training) a teacher
  trace.

  Attributes:
    user: user index.
    split: one of SPLITS.
    history: [h] int32 item indices, oldest -> newest, truncated to max_history.
    candidates: [N] int32 item indices in D's (retriever) order; contains the target exactly once.
    target_position: index of the target in `candidates` (0-based).
    retriever_scores: [N] float32 retriever scores of the candidates (non-increasing).
    evidence: [N, 3] int32 bucketed recency-weighted match levels (brand, leaf, path), 0 = no match.
    teacher_ranking: [N] int32 permutation of slots (best first) from the teacher, or None.
    citations: the teacher's cited evidence (empty when none / no teacher).
  """

  user: int
  split: str
  history: np.ndarray
  candidates: np.ndarray
  target_position: int
  retriever_scores: np.ndarray
  evidence: np.ndarray
  teacher_ranking: np.ndarray | None = None
  citations: tuple[Citation, ...] = ()
