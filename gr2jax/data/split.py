"""TIGER leave-one-out split and the seeded 1,615-user evaluation subset (TIGER, Rajput et al.,
NeurIPS 2023).

Per user sequence s (oldest first, length L >= 4):
  test:       target s[L-1], history s[:L-1]
  validation: target s[L-2], history s[:L-2]
  train:      targets s[1..L-3], each with its prefix as history; by default only the LAST one,
              s[L-3] ("trainex"), one example per user.
Models fit on training data (the retriever, the teacher's thresholds) see only s[:L-2]
(`training_sequences`). Histories keep the most recent `max_history` items.
"""

import dataclasses

import numpy as np

from gr2jax.data.records import SPLITS

PAD = -1  # history padding id
EVAL_SUBSET_SIZE = 1615  # Diffusion-GR2 evaluates on 1,615 test users


@dataclasses.dataclass(frozen=True)
class SplitExamples:
  """Next-item examples of one split, as parallel arrays.

  Attributes:
    split: one of SPLITS.
    users: [E] int32 user indices.
    ends: [E] int32 index of the target in the user's sequence (history = the items before it).
    targets: [E] int32 target items.
    histories: [E, H] int32 the last H items before the target, oldest -> newest, RIGHT-aligned
      (the newest item is in column H-1) and left-padded with PAD.
  """

  split: str
  users: np.ndarray
  ends: np.ndarray
  targets: np.ndarray
  histories: np.ndarray

  def __len__(self) -> int:
    return len(self.users)

  def history(self, e: int) -> np.ndarray:
    """[h] unpadded history of example e, oldest -> newest."""
    row = self.histories[e]
    return row[row != PAD]

  def select(self, index: np.ndarray) -> "SplitExamples":
    """The examples at `index` (an int index array or a bool mask)."""
    return dataclasses.replace(self, users=self.users[index], ends=self.ends[index],
                               targets=self.targets[index], histories=self.histories[index])


MIN_ITEMS = 4  # 1 history item + the train, validation and test targets


def short_users(sequences: list[np.ndarray]) -> np.ndarray:
  """[k] int indices of the users with fewer than MIN_ITEMS items (the split cannot use them)."""
  return np.flatnonzero(np.array([len(s) for s in sequences], np.int64) < MIN_ITEMS)


def _check_lengths(sequences: list[np.ndarray]) -> None:
  short = short_users(sequences)
  if short.size:
    raise ValueError(f"TIGER split needs >= {MIN_ITEMS} items per user (1 history + train + "
                     f"validation + test); users at 0-based indices {short[:5].tolist()} (of "
                     f"{short.size}) have fewer (the data build names them by file, line and "
                     "user id, and drops them with data.drop_unusable_users=True)")


def training_sequences(sequences: list[np.ndarray]) -> list[np.ndarray]:
  """Each user's training part s[:L-2]: everything models may be fit on."""
  _check_lengths(sequences)
  return [s[:-2] for s in sequences]


def make_split(sequences: list[np.ndarray], split: str, *, max_history: int = 20,
               all_training_targets: bool = False) -> SplitExamples:
  """The examples of one split.

  Args:
    sequences: per user int32 item indices, oldest first.
    split: 'train', 'validation' or 'test'.
    max_history: H, the number of most recent history items kept.
    all_training_targets: for 'train', one example per training target s[1..L-3] (user-major,
      chronological) instead of only the last one.

  Returns:
    The SplitExamples (users in increasing order).
  """
  if split not in SPLITS:
    raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
  if max_history < 1:
    raise ValueError(f"max_history must be >= 1, got {max_history}")
  _check_lengths(sequences)
  lengths = np.array([len(s) for s in sequences], np.int64)
  num_users = len(sequences)
  if split == "train" and all_training_targets:
    counts = lengths - 3  # targets 1..L-3
    users = np.repeat(np.arange(num_users), counts)
    first = np.cumsum(counts) - counts
    ends = np.arange(users.size) - np.repeat(first, counts) + 1
  else:
    users = np.arange(num_users)
    ends = lengths - {"train": 3, "validation": 2, "test": 1}[split]
  flat = np.concatenate(sequences)
  offsets = np.cumsum(lengths) - lengths
  cols = ends[:, None] - max_history + np.arange(max_history)  # [E, H] positions in the sequence
  histories = np.where(cols >= 0, flat[offsets[users][:, None] + np.maximum(cols, 0)], PAD)
  return SplitExamples(split=split, users=users.astype(np.int32), ends=ends.astype(np.int32),
                       targets=flat[offsets[users] + ends].astype(np.int32),
                       histories=histories.astype(np.int32))


def dataset_stats(sequences: list[np.ndarray], num_items: int) -> dict[str, int]:
  """Users, items, interactions and examples per split (all training targets)."""
  _check_lengths(sequences)
  interactions = sum(len(s) for s in sequences)
  return {"users": len(sequences), "items": num_items, "interactions": interactions,
          "train_targets": interactions - 3 * len(sequences), "validation": len(sequences),
          "test": len(sequences)}


def eval_subset(num_users: int, size: int = EVAL_SUBSET_SIZE, seed: int = 0) -> np.ndarray:
  """The evaluation user subset: `size` distinct users drawn uniformly without replacement.

  Definition (stable across numpy versions): `np.random.default_rng(seed).permutation(num_users)`,
  its first `size` entries, sorted ascending. Diffusion-GR2 reports on 1,615 Beauty test users.

  Returns:
    [size] int32 sorted user indices.
  """
  if not 0 < size <= num_users:
    raise ValueError(f"subset size must be in [1, {num_users}], got {size}")
  return np.sort(np.random.default_rng(seed).permutation(num_users)[:size]).astype(np.int32)
