"""gr2jax/decoding/evaluation.py's cache: keyed by what decides a result, found by its key alone."""

import dataclasses

import numpy as np
import pytest

from gr2jax.decoding import evaluation, prompt_io
from gr2jax.decoding.policy import make_policy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import convert
from gr2jax.model.config import ModelConfig
from tests.train.toy_policy import AR, DIFFUSION


def _data(source="tfds-abc/test_1615[:4]"):
  return prompt_io.SplitData(encoded=[], users=np.arange(4), labels=[], teacher_top1=np.zeros(4),
                          source=source)


def test_the_key_covers_model_spec_data_and_shapes():
  policy = make_policy(AR, DecodeSpec(), 16)
  key = evaluation.cache_key("m", policy, _data(), batch_size=8, prompt_len=64)
  others = [
    evaluation.cache_key("m2", policy, _data(), batch_size=8, prompt_len=64),
    evaluation.cache_key("m", make_policy(AR, DecodeSpec(eval_tau=0.9), 16), _data(),
                         batch_size=8, prompt_len=64),
    evaluation.cache_key("m", make_policy(DIFFUSION, DecodeSpec(), 16), _data(), batch_size=8,
                         prompt_len=64),
    evaluation.cache_key("m", make_policy(AR, DecodeSpec(), 32), _data(), batch_size=8,
                         prompt_len=64),
    evaluation.cache_key("m", policy, _data("tfds-abc/test[:4]"), batch_size=8, prompt_len=64),
    evaluation.cache_key("m", policy, _data(), batch_size=4, prompt_len=64),
    evaluation.cache_key("m", policy, _data(), batch_size=8, prompt_len=80)]
  assert len({key, *others}) == 1 + len(others)
  with pytest.raises(ValueError, match="no source"):
    evaluation.cache_key("m", policy, dataclasses.replace(_data(), source=""), batch_size=8,
                         prompt_len=64)


def test_keys_cached_before_a_config_field_was_retired_still_match():
  """The keys of two evaluations computed while ModelConfig had pivot_filler_id (None here): a
  retired field counts at its old value, so those cached results are found again. A change to
  what decides an evaluation changes these on purpose."""
  ar = ModelConfig.tiny(vocab_size=64, eos_token_ids=(1,), pad_token_id=2)
  keys = [evaluation.cache_key("m", make_policy(c, DecodeSpec(block_size=4), 16), _data(),
                               batch_size=8, prompt_len=64)
          for c in (ar, convert.to_diffusion(ar, 4, 3))]
  assert keys == ["d7a2cac302b99a0c", "8809540f494dde93"]


def test_a_result_is_computed_once_and_found_under_any_name(tmp_path):
  calls = []

  def run(out_path):
    calls.append(out_path)
    with open(out_path, "w") as f:
      f.write('{"user": 1}\n')
    return {"R@1": 0.5}

  first = evaluation.evaluate_cached(str(tmp_path), "sft_test", "k1", run)
  again = evaluation.evaluate_cached(str(tmp_path), "ar_sft_test", "k1", run)  # another name
  assert first == again == ({"R@1": 0.5, "cache_key": "k1"}, [{"user": 1}]) and len(calls) == 1
  evaluation.evaluate_cached(str(tmp_path), "sft_test", "k2", run)
  assert len(calls) == 2


def test_per_user_reads_users_and_target_ranks_in_the_rows_order():
  rows = [{"user": 7, "target_rank": 2, "response": "x"}, {"user": 3, "target_rank": 1}]
  got = evaluation.per_user(rows)
  np.testing.assert_array_equal(got.users, [7, 3])
  np.testing.assert_array_equal(got.ranks, [2, 1])
