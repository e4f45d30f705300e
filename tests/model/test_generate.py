"""AR decoding: cached greedy == full-forward argmax, ragged == one-by-one, sampling, EOS stop."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.model.config import ModelConfig
from gr2jax.model.generate import ARDecoding, first_argmax, generate, sample_logits
from gr2jax.model.params import init_params
from gr2jax.model.qwen3 import forward

CONFIG = ModelConfig.tiny(vocab_size=64, pad_token_id=0)
PARAMS = jax.tree.map(lambda x: x * 20, init_params(CONFIG, jax.random.key(0)))  # peaky logits
LENGTHS = jnp.array([3, 6])
PROMPTS = jnp.where(jnp.arange(6) < LENGTHS[:, None],
                    jax.random.randint(jax.random.key(1), (2, 6), 1, 64), 0)
N = 7


@pytest.fixture(scope="module")
def greedy():
  return generate(PARAMS, CONFIG, PROMPTS, LENGTHS, ARDecoding(max_new_tokens=N))


def test_greedy_equals_full_forward_argmax(greedy):
  assert greedy.tokens.shape == greedy.logprobs.shape == (2, N)
  assert int(greedy.nfe) == N  # prefill + N - 1 steps
  np.testing.assert_array_equal(greedy.lengths, [N, N])
  fwd = jax.jit(forward, static_argnums=1)
  for b in range(2):
    n = int(LENGTHS[b])
    seq = jnp.concatenate([PROMPTS[b, :n], greedy.tokens[b]])[None]
    logits, _ = fwd(PARAMS, CONFIG, seq)
    step_logits = logits[0, n - 1:n - 1 + N]  # the logits that chose each generated token
    np.testing.assert_array_equal(jnp.argmax(step_logits, -1), greedy.tokens[b])
    ref_logp = jnp.take_along_axis(jax.nn.log_softmax(step_logits), greedy.tokens[b][:, None], 1)
    np.testing.assert_allclose(greedy.logprobs[b], ref_logp[:, 0], atol=1e-4)


def test_ragged_batch_equals_one_by_one(greedy):
  for b in range(2):
    one = generate(PARAMS, CONFIG, PROMPTS[b:b + 1], LENGTHS[b:b + 1],
                   ARDecoding(max_new_tokens=N))
    np.testing.assert_array_equal(one.tokens[0], greedy.tokens[b])


def test_stop_at_eos(greedy):
  eos = int(greedy.tokens[0, 2])
  first = int(np.argmax(np.asarray(greedy.tokens[0]) == eos))  # first occurrence, <= 2
  out = generate(PARAMS, dataclasses.replace(CONFIG, eos_token_ids=(eos, 63)), PROMPTS[:1],
                 LENGTHS[:1], ARDecoding(max_new_tokens=N))
  given = generate(PARAMS, CONFIG, PROMPTS[:1], LENGTHS[:1],
                   ARDecoding(max_new_tokens=N, stop_token_ids=(eos, 63)))
  for field in ("tokens", "logprobs", "lengths", "nfe"):  # the settings' stop ids = the config's
    np.testing.assert_array_equal(getattr(given, field), getattr(out, field))
  assert int(out.lengths[0]) == first + 1
  np.testing.assert_array_equal(out.tokens[0, :first + 1], greedy.tokens[0, :first + 1])
  np.testing.assert_array_equal(out.tokens[0, first + 1:], 0)
  np.testing.assert_array_equal(out.logprobs[0, first + 1:], 0.0)
  assert int(out.nfe) == first + 1  # the loop exits once every example has stopped


def test_sampling_reproducible():
  decoding = ARDecoding(max_new_tokens=N, temperature=1.5, top_k=20, top_p=0.9)
  params = jax.tree.map(lambda x: x / 20, PARAMS)  # the flat logits of the plain init
  run = lambda key: generate(params, CONFIG, PROMPTS, LENGTHS, decoding, key=key).tokens
  a, b, c = run(jax.random.key(3)), run(jax.random.key(3)), run(jax.random.key(4))
  np.testing.assert_array_equal(a, b)
  assert not np.array_equal(a, c)
  with pytest.raises(ValueError, match="PRNG key"):
    generate(PARAMS, CONFIG, PROMPTS, None, dataclasses.replace(decoding, max_new_tokens=2))


def test_sample_logits_filters():
  logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]] * 500))
  keys = jax.random.split(jax.random.key(0), 3)
  sampled = lambda **kw: ARDecoding(max_new_tokens=1, temperature=1.0, **kw)
  top_k = sample_logits(logits, keys[0], sampled(top_k=2))
  assert set(np.asarray(top_k).tolist()) == {0, 1}
  top_p = sample_logits(logits, keys[1], sampled(top_p=0.7))
  assert set(np.asarray(top_p).tolist()) == {0, 1}  # 0.5 < 0.7 needs the second token too
  tiny_p = sample_logits(logits, keys[2], sampled(top_p=0.1))
  np.testing.assert_array_equal(tiny_p, 0)


def test_bad_arguments():
  with pytest.raises(ValueError, match="prompt_lengths"):
    generate(PARAMS, CONFIG, PROMPTS, jnp.array([0, 6]), ARDecoding(max_new_tokens=2))
  with pytest.raises(ValueError, match="cache_size=5 < prompt 6"):
    generate(PARAMS, CONFIG, PROMPTS, None, ARDecoding(max_new_tokens=4, cache_size=5))
  with pytest.raises(ValueError, match="top_p"):
    ARDecoding(max_new_tokens=1, top_p=0.0)
  with pytest.raises(ValueError, match="max_position_embeddings"):
    generate(PARAMS, dataclasses.replace(CONFIG, max_position_embeddings=8), PROMPTS, None,
             ARDecoding(max_new_tokens=4))


TWO = ARDecoding(max_new_tokens=2)


def test_bad_prompts_are_named_before_tracing():
  """under jit an id >= V made the row's logits NaN, a negative id wrapped."""
  for bad, value in ((64, 64), (-1, -1)):
    with pytest.raises(ValueError, match=rf"generate: prompt_tokens\[1, 2\] = {value} is outside "
                                         r"the vocab \[0, 63\]"):
      generate(PARAMS, CONFIG, PROMPTS.at[1, 2].set(bad), LENGTHS, TWO)
  with pytest.raises(TypeError, match="prompt_tokens must be an integer array, got dtype float32"):
    generate(PARAMS, CONFIG, PROMPTS.astype(jnp.float32), None, TWO)
  with pytest.raises(ValueError, match=r"prompt_tokens has an empty dimension, shape \(2, 0\)"):
    generate(PARAMS, CONFIG, PROMPTS[:, :0], None, TWO)
  with pytest.raises(ValueError, match=r"prompt_lengths\[0\] = 7 is outside \[1, 6\]"):
    generate(PARAMS, CONFIG, PROMPTS, np.array([7, 6]), TWO)
  with pytest.raises(TypeError, match="max_new_tokens must be an int"):
    ARDecoding(max_new_tokens=2.0)
  with pytest.raises(TypeError, match="key must be a PRNG key"):
    generate(PARAMS, CONFIG, PROMPTS, None, TWO, key=3)
  with pytest.raises(ValueError, match=r"eos_token_ids\[0\] = 99 is outside the vocab"):
    generate(PARAMS, dataclasses.replace(CONFIG, eos_token_ids=(99,)), PROMPTS, None, TWO)
  with pytest.raises(ValueError, match=r"stop_token_ids\[1\] = 64 is outside the vocab"):
    generate(PARAMS, CONFIG, PROMPTS, None, ARDecoding(max_new_tokens=2, stop_token_ids=[3, 64]))
  with pytest.raises(ValueError, match="top_k=65 exceeds the vocab size 64"):
    generate(PARAMS, CONFIG, PROMPTS, None,
             ARDecoding(max_new_tokens=2, temperature=1.0, top_k=65), key=jax.random.key(0))
  with pytest.raises(ValueError, match="temperature=nan must be finite"):
    ARDecoding(max_new_tokens=2, temperature=float("nan"))
  with pytest.raises(TypeError, match="decoding must be of type ARDecoding, got int"):
    generate(PARAMS, CONFIG, PROMPTS, None, 2)


def test_first_argmax_equals_jnp_argmax_with_ties_nan_and_inf():
  rng = np.random.default_rng(0)
  x = rng.integers(-2, 2, (64, 9)).astype(np.float32)  # many ties
  x[rng.random(x.shape) < 0.2] = -np.inf
  x[:4] = -np.inf  # all -inf rows
  x[4:12][rng.random((8, 9)) < 0.3] = np.nan
  x[12, 5] = np.inf
  got = jax.jit(first_argmax)(x)
  assert got.dtype == jnp.int32
  np.testing.assert_array_equal(got, jnp.argmax(x, axis=-1))
