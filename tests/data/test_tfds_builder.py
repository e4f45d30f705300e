"""Tests for gr2jax/data/tfds_builder.py: write array_record, read back with data_source."""

import sys

import numpy as np
import pytest

from gr2jax.data import prompts, tfds_builder
from tests.data.toy_records import toy_catalog, toy_example, toy_sids


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  catalog, sids = toy_catalog(), toy_sids()
  config = prompts.PromptConfig(answer_format="sid")
  examples = {split: [toy_example(user=u + 10 * k, with_teacher=split == "train")
                      for u in range(3 + k)]
              for k, split in enumerate(tfds_builder.SPLITS)}
  records = {split: [tfds_builder.to_record(ex, prompts.render_example(ex, catalog, sids, config),
                                            sids) for ex in exs]
             for split, exs in examples.items()}
  data_dir = str(tmp_path_factory.mktemp("tfds"))
  tfds_builder.build(records, data_dir)
  return data_dir, examples, records


def test_round_trip_in_order_without_tensorflow(built):
  data_dir, examples, records = built
  for split in tfds_builder.SPLITS:
    source = tfds_builder.data_source(data_dir, split)
    assert len(source) == len(examples[split])
    for i, ex in enumerate(examples[split]):
      got = tfds_builder.decode_record(source[i])
      want = records[split][i]
      assert got["user"] == ex.user and got["target_position"] == ex.target_position
      for key in ("history", "candidates", "candidate_sids", "retriever_scores", "evidence",
                  "teacher_ranking"):
        np.testing.assert_array_equal(got[key], want[key])
      for key in ("prompt", "reasoning", "answer"):
        assert got[key] == want[key]
      assert got["labels"] == tuple(want["labels"])
  assert "tensorflow" not in sys.modules


def test_unknown_split_rejected(tmp_path):
  with pytest.raises(ValueError, match="unknown splits"):
    tfds_builder.build({"dev": []}, str(tmp_path))
