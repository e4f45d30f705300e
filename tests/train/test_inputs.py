"""Inputs: make_batch's rows (prompt, response, weights, padding rows); the iterator resumes."""

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


def test_rows_hold_prompt_and_response_apart_with_lambda_weights(data):
  split, tok = data
  p, r = toy_lengths([split])
  examples = split.encoded[:3]
  batch = inputs.make_batch(examples, batch_size=4, prompt_len=p, response_len=r,
                            pad_id=tok.pad_token_id, lambda_r=0.5, lambda_o=1.0)
  assert batch.prompt_tokens.shape == (4, p) and batch.response_tokens.shape == (4, r)
  assert batch.example_index is None and batch.trace_tokens is None
  for b, ex in enumerate(examples):
    lp, nr, lr = len(ex.prompt), len(ex.reasoning), len(ex.reasoning) + len(ex.answer)
    assert batch.prompt_lengths[b] == lp and batch.response_lengths[b] == lr
    np.testing.assert_array_equal(batch.prompt_tokens[b, :lp], ex.prompt)
    assert np.all(batch.prompt_tokens[b, lp:] == tok.pad_token_id)
    np.testing.assert_array_equal(batch.response_tokens[b, :lr],
                                  np.concatenate([ex.reasoning, ex.answer]))
    assert np.all(batch.response_tokens[b, lr:] == tok.pad_token_id)
    w = batch.response_weights[b]
    assert nr > 0 and (w[:nr] == 0.5).all() and (w[nr:lr] == 1.0).all() and (w[lr:] == 0).all()
    assert batch.target_position[b] == ex.target_position
  # The row that only pads the batch: the last prompt again, no response, no weight.
  assert batch.example_mask.tolist() == [True, True, True, False]
  np.testing.assert_array_equal(batch.prompt_tokens[3], batch.prompt_tokens[2])
  assert batch.prompt_lengths[3] == batch.prompt_lengths[2]
  assert batch.response_lengths[3] == 0 and batch.response_weights[3].sum() == 0


def test_iterator_state_resumes_the_same_batches(data):
  split, tok = data
  it = _iterator(split, tok)
  for _ in range(7):  # crosses an epoch boundary (5 batches per epoch)
    next(it)
  saved = it.get_state()
  expected = [next(it).example_index for _ in range(4)]
  resumed = _iterator(split, tok)
  resumed.set_state(saved)
  got = [next(resumed).example_index for _ in range(4)]
  np.testing.assert_array_equal(np.stack(got), np.stack(expected))
  with pytest.raises(ValueError, match="batch_size"):
    inputs.BatchIterator(split, batch_size=5, seed=3, prompt_len=1, response_len=1, pad_id=0,
                         lambda_r=1, lambda_o=1).set_state(saved)


@pytest.mark.parametrize("prompt_len,response_len,match", [
  (4, 64, "prompt of .* tokens exceeds prompt_len=4"),
  (128, 2, "response of .* tokens exceeds response_len=2")])
def test_too_long_rows_are_errors_naming_the_length(data, prompt_len, response_len, match):
  split, _ = data
  with pytest.raises(ValueError, match=match):
    inputs.make_batch(split.encoded[:2], batch_size=2, prompt_len=prompt_len,
                      response_len=response_len, pad_id=0, lambda_r=0.5, lambda_o=1.0)
  with pytest.raises(ValueError, match="3 examples for a batch of 2"):
    inputs.make_batch(split.encoded[:3], batch_size=2, prompt_len=prompt_len,
                      response_len=response_len, pad_id=0, lambda_r=0.5, lambda_o=1.0)
