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


def _good_inputs(decoded):
  params, tokens, lengths = decoded
  return dict(prompt_tokens=BATCH.prompt_tokens, prompt_lengths=BATCH.prompt_lengths,
              tokens=tokens, lengths=lengths), params


BAD_CHECKS = [  # argument -> its bad value (from the good inputs), error, message
  ("lengths", lambda g: np.array([-1, 3]), ValueError,
   r"^teacher_forced_check: lengths\[0\] = -1 is outside \[0, 10\]$"),
  ("lengths", lambda g: np.array([3, N + 1]), ValueError,
   r"^teacher_forced_check: lengths\[1\] = 11 is outside \[0, 10\]$"),
  ("lengths", lambda g: np.array([3.0, 4.0]), TypeError,
   "^teacher_forced_check: lengths must be an integer array, got dtype float64$"),
  ("tokens", lambda g: np.where(np.arange(N) == 2, AR.vocab_size, g["tokens"]), ValueError,
   r"^teacher_forced_check: tokens\[0, 2\] = 64 is outside the vocab \[0, 63\]$"),
  ("tokens", lambda g: np.where(np.arange(N) == 1, -1, g["tokens"]), ValueError,
   r"^teacher_forced_check: tokens\[0, 1\] = -1 is outside the vocab \[0, 63\]$"),
  ("tokens", lambda g: g["tokens"] + 0.7, TypeError,
   "^teacher_forced_check: tokens must be an integer array, got dtype float"),
  ("tokens", lambda g: g["tokens"][:1], ValueError,
   r"^teacher_forced_check: tokens has shape \(1, 10\), expected \(2, \?\)$"),
  ("tokens", lambda g: g["tokens"][0], ValueError,
   r"^teacher_forced_check: tokens must have shape \(2, \?\), got shape \(10,\)$"),
  ("lengths", lambda g: np.array([3, 4, 5]), ValueError,
   r"^teacher_forced_check: lengths has shape \(3,\), expected \(2,\)$"),
  ("prompt_lengths", lambda g: np.array([0, 3]), ValueError,
   r"^teacher_forced_check: prompt_lengths\[0\] = 0 is outside \[1, 6\]$"),
  ("prompt_tokens", lambda g: g["prompt_tokens"][:, :, None], ValueError,
   "^teacher_forced_check: prompt_tokens must have rank 2"),
]


@pytest.mark.parametrize("name, bad, error, match", BAD_CHECKS)
def test_the_check_refuses_input_it_cannot_judge_naming_the_argument(decoded, name, bad, error,
                                                                     match):
  """Each was judged before: negative lengths as '0 positions, exact', an out-of-vocab id as a
  NaN margin within tolerance (a negative one wrapped), float tokens truncated, other rows
  broadcast or a raw array error."""
  good, params = _good_inputs(decoded)
  with pytest.raises(error, match=match):
    exactness.teacher_forced_check(params, AR, **(good | {name: bad(good)}))


@pytest.mark.parametrize("tolerance, error, match", [
  (float("nan"), ValueError, "^summary: tolerance=nan must be finite$"),
  (float("inf"), ValueError, "^summary: tolerance=inf must be finite$"),
  (-0.01, ValueError, "^summary: tolerance=-0.01 must be >= 0$"),
  ("0.1", TypeError, "^summary: tolerance must be a real number, got str '0.1'$"),
])
def test_summary_refuses_a_tolerance_that_is_not_finite_and_non_negative(decoded, tolerance,
                                                                         error, match):
  """A NaN tolerance reported every flip within tolerance (margin > NaN is False)."""
  params, tokens, lengths = decoded
  check = exactness.teacher_forced_check(params, AR, BATCH.prompt_tokens, BATCH.prompt_lengths,
                                         tokens, lengths)
  with pytest.raises(error, match=match):
    exactness.summary(check, tolerance)
  with pytest.raises(TypeError, match="^summary: check must be an exactness.Check"):
    exactness.summary(check._asdict())


@pytest.mark.parametrize("args, error, match", [
  ((np.ones((2, 4), int), [3, 4], np.ones((1, 4), int), [4]), ValueError,
   r"^differences: reference has shape \(1, 4\), expected \(2, \?\)$"),
  ((np.ones((2, 4), int), [3, 4], np.ones((2, 4), int), [4]), ValueError,
   r"^differences: reference_lengths has shape \(1,\), expected \(2,\)$"),
  ((np.ones((2, 4)), [3, 4], np.ones((2, 4), int), [4, 4]), TypeError,
   "^differences: tokens must be an integer array, got dtype float64$"),
  ((np.ones((2, 4), int), [-1, 4], np.ones((2, 4), int), [4, 4]), ValueError,
   r"^differences: lengths\[0\] = -1 is outside \[0, 4\]$"),
  ((np.ones((2, 4), int), [3, 4], np.ones((2, 4), int), [4, 5]), ValueError,
   r"^differences: reference_lengths\[1\] = 5 is outside \[0, 4\]$"),
])
def test_differences_refuse_rows_that_do_not_pair_up(args, error, match):
  """Other row counts broadcast (a [1, M] reference against every row) or failed with a raw
  numpy error; lengths past the width counted padding."""
  with pytest.raises(error, match=match):
    exactness.differences(*args)


def test_differences_do_not_read_a_negative_id_as_padding():
  """A token inside one row's length differs from the other row's empty slot whatever its id."""
  d = exactness.differences(np.array([[5, -1]]), [2], np.array([[5, 0]]), [1])
  assert (d["positions_differing"], d["first_index"]) == (1, [1])
