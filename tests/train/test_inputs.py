"""Inputs: prompt / response arrays agree with the concatenated batch; the iterator resumes."""

import numpy as np
import pytest

from gr2jax.train import inputs
from tests.train.toy import toy_lengths, toy_split, toy_tokenizer


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  tok = toy_tokenizer(str(tmp_path_factory.mktemp("tok")))
  return toy_split(tok, range(20)), tok


def _iterator(split, tok, seed=3):
  p, r = toy_lengths([split])
  return inputs.BatchIterator(split, batch_size=4, seed=seed, prompt_len=p, response_len=r,
                              pad_id=tok.pad_token_id, lambda_r=0.5, lambda_o=1.0)


def test_prompt_and_response_arrays_match_the_concatenated_batch(data):
  split, tok = data
  batch = next(_iterator(split, tok))
  for b in range(4):
    p, r = batch["prompt_lengths"][b], batch["response_lengths"][b]
    assert batch["lengths"][b] == p + r
    np.testing.assert_array_equal(batch["tokens"][b, :p], batch["prompt_tokens"][b, :p])
    np.testing.assert_array_equal(batch["tokens"][b, p:p + r], batch["response_tokens"][b, :r])
    np.testing.assert_array_equal(batch["loss_weights"][b, p:p + r],
                                  batch["response_weights"][b, :r])
    assert np.all(batch["response_tokens"][b, r:] == tok.pad_token_id)
    assert np.all(batch["response_weights"][b, r:] == 0)


def test_iterator_state_resumes_the_same_batches(data):
  split, tok = data
  it = _iterator(split, tok)
  for _ in range(7):  # crosses an epoch boundary (5 batches per epoch)
    next(it)
  saved = it.get_state()
  expected = [next(it)["example_index"] for _ in range(4)]
  resumed = _iterator(split, tok)
  resumed.set_state(saved)
  got = [next(resumed)["example_index"] for _ in range(4)]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected))
  with pytest.raises(ValueError, match="batch_size"):
    inputs.BatchIterator(split, batch_size=5, seed=3, prompt_len=1, response_len=1, pad_id=0,
                         lambda_r=1, lambda_o=1).set_state(saved)


def test_too_long_prompt_is_an_error_naming_the_length(data):
  split, tok = data
  with pytest.raises(ValueError, match="prompt_len"):
    inputs.make_train_batch(split.encoded[:2], batch_size=2, prompt_len=4, response_len=64,
                            pad_id=0, lambda_r=0.5, lambda_o=1.0)
