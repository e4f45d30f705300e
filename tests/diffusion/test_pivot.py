"""Pivot-aligned blocks: the rows put each answer at a block boundary, the width has room for the
fillers, the config records the filler (and refuses a bad one), the parser reads the same answer."""

import numpy as np
import pytest

from gr2jax.data import answer
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import policy
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
  width = policy.response_width(r, _diffusion(5))
  assert width >= r + B - 1 and width % 16 == 0
  assert policy.response_width(r, _diffusion()) == r
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
    assert (w[:head] == 0.5).all() and (w[head:head + na] == 1.0).all()
    assert (w[head + na:] == 0).all()


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


FILLERS = pivot.Fillers(block_size=B, filler_id=5, think_end_id=4, tail_len=2)


def test_fillers_are_the_run_after_the_think_end_and_its_blank_line():
  #            <think> r  r </think> \n \n | f  f  f  f  f  f  f  f  | answer ... eos
  aligned = [9, 7, 7, 4, 5, 5] + [5] * 2 + [20, 21, 22, 1]
  unaligned = [9, 7, 4, 5, 5, 20, 5, 21, 1]  # the answer right after the blank line: no filler
  no_think = [20, 5, 5, 21, 1]
  tokens = np.zeros((3, 16), np.int32)
  for b, row in enumerate((aligned, unaligned, no_think)):
    tokens[b, :len(row)] = row
  lengths = np.array([len(aligned), len(unaligned), len(no_think)])
  mask = FILLERS.mask(tokens, lengths)
  assert np.flatnonzero(mask[0]).tolist() == [6, 7] and not mask[1:].any()
  compact, compact_lengths, source = pivot.without_fillers(tokens, lengths, mask)
  assert compact_lengths.tolist() == [10, len(unaligned), len(no_think)]
  assert compact[0, :10].tolist() == [9, 7, 7, 4, 5, 5, 20, 21, 22, 1]
  np.testing.assert_array_equal(compact[1:], tokens[1:])
  assert source[0].tolist()[:12] == [0, 1, 2, 3, 4, 5, -1, -1, 6, 7, 8, 9]


def test_with_fillers_puts_the_distributions_back_and_makes_the_filler_certain():
  logp = np.log(np.random.default_rng(0).dirichlet(np.ones(8), size=(1, 4))).astype(np.float32)
  source = np.array([[0, -1, 1, 2]])
  out = np.asarray(pivot.with_fillers(logp, source, 5))
  np.testing.assert_array_equal(out[0, [0, 2, 3]], logp[0, :3])
  assert out[0, 1, 5] == 0 and (out[0, 1, np.arange(8) != 5] == pivot.IMPOSSIBLE).all()
