"""TFDS dataset `amazon_beauty_gr2`: re-ranking examples with their rendered prompt and target.

Written as array_record with `disable_shuffling=True` (record i = the i-th example of the split),
so neither writing nor reading needs TensorFlow. Read with `tfds.data_source` (random access);
Text features come back as bytes, decoded by `decode_record`. Splits: train, validation, test
and test_1615 (the seeded 1,615-user subset).
"""

import os
from collections.abc import Iterable, Mapping

import numpy as np
import tensorflow_datasets as tfds

from gr2jax.data.prompts import RenderedExample
from gr2jax.data.records import RerankExample

NAME = "amazon_beauty_gr2"
SPLITS = ("train", "validation", "test", "test_1615")
TEXT_FIELDS = ("prompt", "reasoning", "answer")


def _features() -> tfds.features.FeaturesDict:
  tensor = tfds.features.Tensor
  return tfds.features.FeaturesDict({
    "user": np.int32,
    "history": tensor(shape=(None,), dtype=np.int32),  # [h] item ids, oldest first
    "candidates": tensor(shape=(None,), dtype=np.int32),  # [N] item ids in D's order
    "candidate_sids": tensor(shape=(None, 4), dtype=np.int32),  # [N, 4] (WORKSPACE: 4-token SIDs)
    "retriever_scores": tensor(shape=(None,), dtype=np.float32),  # [N]
    "evidence": tensor(shape=(None, 3), dtype=np.int32),  # [N, 3] brand, leaf, path buckets
    "target_position": np.int32,
    "teacher_ranking": tensor(shape=(None,), dtype=np.int32),  # [N] slots, or [0] if none
    "labels": tfds.features.Sequence(tfds.features.Text()),  # [N] answer labels
    "prompt": tfds.features.Text(),
    "reasoning": tfds.features.Text(),  # '' without a teacher trace
    "answer": tfds.features.Text(),  # '' without a teacher trace
  })


def to_record(example: RerankExample, rendered: RenderedExample, sids: np.ndarray) -> dict:
  """The feature dict of one example.

  Args:
    example: the re-ranking example.
    rendered: its rendered prompt / reasoning / answer (prompts.render_example).
    sids: [num_items, L] int32 semantic IDs.

  Returns:
    A dict matching the builder's features.
  """
  ranking = example.teacher_ranking
  return {
    "user": example.user,
    "history": np.asarray(example.history, np.int32),
    "candidates": np.asarray(example.candidates, np.int32),
    "candidate_sids": np.asarray(sids[example.candidates], np.int32),
    "retriever_scores": np.asarray(example.retriever_scores, np.float32),
    "evidence": np.asarray(example.evidence, np.int32).reshape(-1, 3),
    "target_position": example.target_position,
    "teacher_ranking": np.zeros((0,), np.int32) if ranking is None else np.asarray(ranking,
                                                                                   np.int32),
    "labels": list(rendered.labels),
    "prompt": rendered.prompt,
    "reasoning": rendered.reasoning,
    "answer": rendered.answer,
  }


class AmazonBeautyGr2(tfds.core.GeneratorBasedBuilder):
  """Amazon Beauty re-ranking lists with GR2 prompts; built from in-memory records."""

  VERSION = tfds.core.Version("1.0.0")
  RELEASE_NOTES = {"1.0.0": "Initial release."}
  # No checksum/metadata files live next to this module; TFDS's lookup of them
  # (`code_path` -> importlib_resources, not installed) is skipped.
  code_path = None

  def __init__(self, *, records: Mapping[str, Iterable[dict]] | None = None, **kwargs):
    """Args: records: {split: feature dicts} to write (only needed to build); kwargs: TFDS's."""
    self._records = records
    super().__init__(file_format="array_record", **kwargs)

  def _info(self) -> tfds.core.DatasetInfo:
    return tfds.core.DatasetInfo(
      builder=self, features=_features(), disable_shuffling=True,
      description="Amazon Beauty 5-core re-ranking lists (TIGER split) with GR2 prompts.")

  def _split_generators(self, dl_manager):
    del dl_manager  # nothing is downloaded
    if self._records is None:
      raise ValueError(f"{NAME}: no records given; build with AmazonBeautyGr2(records=...)")
    unknown = set(self._records) - set(SPLITS)
    if unknown:
      raise ValueError(f"{NAME}: unknown splits {sorted(unknown)}; expected {SPLITS}")
    return {split: self._generate_examples(records) for split, records in self._records.items()}

  def _generate_examples(self, records):
    yield from enumerate(records)


def build(records: Mapping[str, Iterable[dict]], data_dir: str) -> AmazonBeautyGr2:
  """Writes the dataset under `data_dir` and returns its builder.

  Args:
    records: {split: feature dicts from `to_record`}.
    data_dir: the TFDS data directory.

  Returns:
    The prepared builder.
  """
  builder = AmazonBeautyGr2(records=records, data_dir=data_dir)
  tfds.display_progress_bar(os.environ.get("GR2JAX_PROGRESS", "1") != "0")  # per-split bars
  builder.download_and_prepare()
  return builder


def data_source(data_dir: str, split: str):
  """Random-access source of one split (`len`, `source[i]`), without TensorFlow."""
  return tfds.data_source(NAME, data_dir=data_dir, split=split, download=False)


def decode_record(record: dict) -> dict:
  """Decodes the bytes of Text features (prompt/reasoning/answer/labels) to str."""
  out = dict(record)
  for key in TEXT_FIELDS:
    out[key] = record[key].decode("utf-8")
  out["labels"] = tuple(label.decode("utf-8") for label in record["labels"])
  return out

