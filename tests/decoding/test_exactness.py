"""The teacher-forced check (gr2jax/decoding/exactness.py) on the toy AR model in fp32: an AR
decode has no flip; a planted runner-up token is the one flip, with the margin a cache-free
forward gives; slots past a row's length are not checked; the tolerance is relative to the
position's largest logit. (bf16 at batch 1, 8 and 16: tests/test_gpu_check.py.)"""

import jax
import numpy as np
import pytest

from gr2jax.decoding import exactness
from gr2jax.model import generate, qwen3
from gr2jax.model.params import init_params
from tests.train.toy_policy import AR, BATCH, DIFFUSION

N = 10


@pytest.fixture(scope="module")
def decoded():
  params = init_params(AR, jax.random.key(0))
  out = generate.generate(params, AR, BATCH.prompt_tokens, BATCH.prompt_lengths,
                          generate.ARDecoding(max_new_tokens=N))
  return params, np.asarray(out.tokens), np.asarray(out.lengths)


def _last_logits(params, row: int, tokens: np.ndarray) -> np.ndarray:
  """[V] the logits after [prompt row | tokens] from one cache-free forward."""
  prompt = BATCH.prompt_tokens[row, :BATCH.prompt_lengths[row]]
  return np.asarray(qwen3.forward(params, AR, np.concatenate([prompt, tokens])[None])[0])[0, -1]


def test_an_ar_decode_has_no_flip_and_past_its_length_nothing_is_checked(decoded):
  params, tokens, lengths = decoded
  assert lengths.min() < N  # a row that stopped: its pad slots must not count
  past = np.arange(N)[None, :] >= lengths[:, None]
  check = exactness.teacher_forced_check(params, AR, BATCH.prompt_tokens, BATCH.prompt_lengths,
                                         np.where(past, 1, tokens), lengths)
  s = exactness.summary(check)
  assert (s["positions"], s["flips"], s["max_flip_margin"]) == (int(lengths.sum()), 0, None)
  np.testing.assert_array_equal(check.argmax[check.valid], tokens[check.valid])
  assert (check.margin == 0).all() and (check.scale[check.valid] > 0).all()


def test_a_planted_runner_up_is_the_one_flip_with_its_margin(decoded):
  params, tokens, lengths = decoded
  row, j = 0, int(lengths[0]) - 1  # the last token: no later position sees the change
  logits = _last_logits(params, row, tokens[row, :j])
  runner_up = int(np.argsort(logits)[-2])
  planted = tokens.copy()
  planted[row, j] = runner_up
  check = exactness.teacher_forced_check(params, AR, BATCH.prompt_tokens, BATCH.prompt_lengths,
                                         planted, lengths)
  assert np.argwhere(check.flipped).tolist() == [[row, j]]
  margin, scale = logits.max() - logits[runner_up], np.abs(logits).max()
  np.testing.assert_allclose(check.margin[row, j], margin, rtol=1e-5)
  np.testing.assert_allclose(check.scale[row, j], scale, rtol=1e-5)
  assert check.argmax[row, j] == tokens[row, j]
  s = exactness.summary(check, tolerance=1.01 * margin / scale)
  assert (s["flips"], s["beyond_tolerance"]) == (1, 0)
  assert s["max_flip_relative"] == pytest.approx(margin / scale, rel=1e-5)
  assert exactness.summary(check, tolerance=0.99 * margin / scale)["beyond_tolerance"] == 1


def test_the_check_refuses_a_block_diffusion_config(decoded):
  params, tokens, lengths = decoded
  with pytest.raises(ValueError, match="^teacher_forced_check: .*block_size=4"):
    exactness.teacher_forced_check(params, DIFFUSION, BATCH.prompt_tokens, BATCH.prompt_lengths,
                                   tokens, lengths)


def test_differences_count_rows_and_slots_inside_either_length():
  tokens = np.array([[5, 6, 7, 0], [5, 6, 7, 8]])
  reference = np.array([[5, 6, 7, 9], [5, 9, 7, 8]])
  d = exactness.differences(tokens, [3, 4], reference, [4, 4])
  assert d == {"rows": 2, "rows_differing": 2, "positions_differing": 2, "first_index": [3, 1]}
  assert exactness.differences(tokens, [3, 4], tokens, [3, 4])["rows_differing"] == 0
