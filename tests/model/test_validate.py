"""gr2jax/model/validate.py and the checks forward / ragged_prefill run before tracing.

Each case here was accepted by the code before its check was added and gave a silently wrong result
(clamped or NaN logits, a wrapped id, a length of 0 reading position -1).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.model import qwen3, validate
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params

CONFIG = ModelConfig.tiny(vocab_size=16, hidden_size=16, head_dim=8, intermediate_size=32,
                          num_layers=1)
TOKENS = np.array([[1, 2, 3], [4, 5, 6]])


@pytest.fixture(scope="module")
def params():
  rng = np.random.default_rng(0)
  return jax.tree.map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s.shape), s.dtype),
                      abstract_params(CONFIG))


def test_helpers_name_the_argument():
  with pytest.raises(TypeError, match="f: x must be an integer array, got dtype bool"):
    validate.integer_array("f", "x", np.ones(3, bool))
  with pytest.raises(ValueError, match=r"f: x must have shape \(2, \?\), got shape \(2,\)"):
    validate.integer_array("f", "x", np.ones(2, int), shape=(2, None))
  with pytest.raises(ValueError, match=r"f: x\[1, 0\] = 9 is outside \[0, 4\]"):
    validate.check_range("f", "x", jnp.array([[0, 1], [9, 2]]), 0, 5)
  traced = jax.jit(lambda x: validate.check_range("f", "x", x, 0, 1) or x)  # traced: skipped
  np.testing.assert_array_equal(traced(jnp.array([5, 6])), [5, 6])
  with pytest.raises(TypeError, match="f: k must be a PRNG key"):
    validate.prng_key("f", "k", np.zeros(2, np.int32))
  validate.prng_key("f", "k", jax.random.PRNGKey(0))  # legacy uint32[2] keys are keys too


def test_token_ids_are_ints_in_the_vocab_named_by_index():
  assert validate.token_ids("f", "stop", [np.int64(3), 1], vocab_size=4) == (3, 1)
  for values, vocab, error, match in [
    ("12", None, TypeError, r"^f: stop must be a sequence of ints, got str$"),
    ([1, 2.0], None, TypeError, r"^f: stop\[1\] must be an int, got float 2.0$"),
    ([1, -1], None, ValueError, r"^f: stop\[1\]=-1 must be >= 0$"),
    ([4], 4, ValueError, r"^d\.stop\[0\] = 4 is outside the vocab \[0, 3\]$"),
  ]:
    with pytest.raises(error, match=match):
      validate.token_ids("d." if vocab else "f", "stop", values, vocab)


def test_responses_are_integer_rows_with_lengths_in_0_to_m():
  tokens, lengths = validate.responses("f", np.array([[1, 2, 0], [3, 0, 0]]), [3, 0], rows=2,
                                       vocab_size=16)
  assert tokens.dtype == lengths.dtype == np.int32 and lengths.tolist() == [3, 0]
  for args, kwargs, error, match in [
    ((TOKENS, [3, 4]), {}, ValueError, r"^f: lengths\[1\] = 4 is outside \[0, 3\]$"),
    ((TOKENS, [3, 3]), dict(rows=3), ValueError,
     r"^f: tokens has shape \(2, 3\), expected \(3, \?\)$"),
    ((TOKENS, [3]), {}, ValueError, r"^f: lengths has shape \(1,\), expected \(2,\)$"),
    ((TOKENS * 4, [3, 3]), dict(vocab_size=16), ValueError,
     r"^f: tokens\[1, 0\] = 16 is outside the vocab \[0, 15\]$"),
    ((TOKENS * 1.0, [3, 3]), dict(names=("ref", "ref_lengths")), TypeError,
     "^f: ref must be an integer array, got dtype float64$"),
  ]:
    with pytest.raises(error, match=match):
      validate.responses("f", *args, **kwargs)


def test_forward_checks(params):
  with pytest.raises(ValueError, match=r"forward: logits_at\[1, 0\] = 3 is outside \[0, 2\]"):
    qwen3.forward(params, CONFIG, TOKENS, logits_at=np.array([[0], [3]]))
  with pytest.raises(TypeError, match="forward: mask must be a bool array"):
    qwen3.forward(params, CONFIG, TOKENS, mask=np.ones((2, 3, 3), np.float32))
  with pytest.raises(ValueError, match=r"forward: tokens\[0, 0\] = -1 is outside the vocab"):
    qwen3.forward(params, CONFIG, -TOKENS)
  with pytest.raises(ValueError, match=r"params\['embed'\] has shape \(16, 16\), expected"):
    qwen3.forward(params, ModelConfig.tiny(vocab_size=17, hidden_size=16, head_dim=8,
                                           intermediate_size=32, num_layers=1), TOKENS)
  with pytest.raises(ValueError, match=r"cache.lengths\[0\] = 9 is outside \[0, 8\]"):
    cache = init_cache(CONFIG, 2, 8)
    qwen3.forward(params, CONFIG, TOKENS, cache=cache.replace(lengths=jnp.array([9, 0])))
  # Any integer dtype (or a list) is the same input.
  ref, _ = qwen3.forward(params, CONFIG, TOKENS.astype(np.int32))
  for tokens in (TOKENS.astype(np.uint8), TOKENS.tolist(), jnp.asarray(TOKENS)):
    np.testing.assert_array_equal(qwen3.forward(params, CONFIG, tokens)[0], ref)
  assert np.isfinite(np.asarray(ref)).all()


def test_ragged_prefill_checks(params):
  cache = init_cache(CONFIG, 2, 5)
  with pytest.raises(ValueError, match=r"ragged_prefill: lengths\[1\] = 0 is outside \[1, 3\]"):
    qwen3.ragged_prefill(params, CONFIG, TOKENS, np.array([3, 0]), cache)
  with pytest.raises(ValueError, match=r"ragged_prefill: lengths has shape \(3,\), expected"):
    qwen3.ragged_prefill(params, CONFIG, TOKENS, np.array([3, 1, 1]), cache)
  with pytest.raises(TypeError, match="ragged_prefill: cache must be a KVCache"):
    qwen3.ragged_prefill(params, CONFIG, TOKENS, np.array([3, 1]), None)
