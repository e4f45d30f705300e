"""Pivot-aligned blocks: the rows put each answer at a block boundary, the width has room for the
fillers, the config records the filler (and refuses a bad one), the parser reads the same answer."""

import numpy as np
import pytest

from gr2jax.data import answer, tokenizer as tokenizer_lib
from gr2jax.diffusion import convert, pivot
from gr2jax.model.config import ModelConfig
from gr2jax.train import inputs
from tests.train.toy import toy_lengths, toy_split, toy_tokenizer

B = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
  tok = toy_tokenizer(str(tmp_path_factory.mktemp("tok")))
  return toy_split(tok, range(12)), tok


def _diffusion(filler=None):
  ar = ModelConfig.tiny(vocab_size=64, eos_token_ids=(1,), pad_token_id=2)
  return convert.to_diffusion(ar, B, 3, filler)


@pytest.mark.parametrize("r", [0, 1, 7, 8, 9, 16])
def test_aligned_response_starts_the_answer_at_a_block_boundary(r):
  reasoning, ans = np.arange(10, 10 + r), np.array([50, 51, 52])
  tokens, head = pivot.aligned_response(reasoning, ans, B, 5)
  assert head % B == 0 and head - r == (-r) % B < B
  np.testing.assert_array_equal(tokens[:r], reasoning)
  assert (tokens[r:head] == 5).all()
  np.testing.assert_array_equal(tokens[head:], ans)


def test_rows_of_a_pivot_aligned_model_fill_the_reasoning_block(data):
  split, tok = data
  p, r = toy_lengths([split])
  width = pivot.response_width(r, _diffusion(5))
  assert width >= r + B - 1 and width % 16 == 0
  assert pivot.response_width(r, _diffusion()) == r
  plain = inputs.make_batch(split.encoded[:4], batch_size=4, prompt_len=p, response_len=width,
                            pad_id=tok.pad_token_id, lambda_r=0.5, lambda_o=1.0)
  aligned = inputs.make_batch(split.encoded[:4], batch_size=4, prompt_len=p, response_len=width,
                              pad_id=tok.pad_token_id, lambda_r=0.5, lambda_o=1.0, block_size=B,
                              filler_id=5)
  np.testing.assert_array_equal(aligned.prompt_tokens, plain.prompt_tokens)
  for b, ex in enumerate(split.encoded[:4]):
    nr, na = len(ex.reasoning), len(ex.answer)
    head = nr + (-nr) % B
    assert aligned.response_lengths[b] == head + na
    np.testing.assert_array_equal(aligned.response_tokens[b, head:head + na], ex.answer)
    w = aligned.response_weights[b]
    assert (w[:head] == 0.5).all() and (w[head:head + na] == 1.0).all() and (w[head + na:] == 0).all()


def test_the_config_records_the_filler_and_refuses_a_special_token():
  config = _diffusion(5)
  assert config.pivot_filler_id == 5
  assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config
  assert "pivot_filler_id" not in _diffusion().to_hf_dict()
  for bad in (1, 2, 3, 64, -1):  # eos, pad, mask, outside the vocabulary
    with pytest.raises(ValueError, match="pivot_filler_id"):
      _diffusion(bad)


def test_the_filler_is_the_newline_and_the_parser_skips_it(data):
  _, tok = data
  filler = tokenizer_lib.filler_token_id(tok)
  assert tok.decode([filler]) == "\n"
  labels = [f"<|slot_{i}|>" for i in range(3)]
  text = '<think>\n</think>\n\n{"ranking": ["<|slot_2|>", "<|slot_0|>", "<|slot_1|>"]}<|im_end|>'
  aligned = text.replace("</think>\n\n", "</think>\n\n" + "\n" * (B - 3))
  for t in (text, aligned):
    result = answer.parse_answer(t, labels)
    assert result.valid and result.ranking.tolist() == [2, 0, 1]
