"""SFT loss: equals a direct numpy computation; prompt and pad tokens get zero gradient."""

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.model import qwen3
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import sft

CONFIG = ModelConfig.tiny(vocab_size=64, num_layers=1)
PARAMS = init_params(CONFIG, jax.random.key(0))


def _batch():
  """(tokens [2, 8] the concatenated rows, their loss weights [2, 8], the Batch): row 0: prompt
  0..2, reasoning 3..4, answer 5, pad 6..7; row 1: prompt 0..3, response 4..7."""
  tokens = np.array([[5, 6, 7, 8, 9, 10, 0, 0], [11, 12, 13, 14, 15, 16, 17, 18]], np.int32)
  weights = np.zeros((2, 8), np.float32)
  weights[0, 3:5], weights[0, 5] = 0.5, 1.0
  weights[1, 4:6], weights[1, 6:8] = 0.5, 1.0
  prompt_lengths = np.array([3, 4], np.int32)
  response_lengths = np.array([3, 4], np.int32)  # row 0's pads are no response
  response = np.zeros((2, 5), np.int32)
  response_weights = np.zeros((2, 5), np.float32)
  for b, p in enumerate(prompt_lengths):
    n = 8 - p
    response[b, :n], response_weights[b, :n] = tokens[b, p:], weights[b, p:]
  batch = Batch(prompt_tokens=tokens[:, :4], prompt_lengths=prompt_lengths,
                response_tokens=response, response_lengths=response_lengths,
                response_weights=response_weights)
  return tokens, weights, batch


def test_sft_loss_equals_numpy():
  tokens, weights, batch = _batch()
  total, weight, aux = sft.sft_loss(PARAMS, batch, None, config=CONFIG)
  logits, _ = qwen3.forward(PARAMS, CONFIG, tokens)
  logits = np.asarray(logits, np.float64)
  logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
    - logits.max(-1, keepdims=True)
  expected = 0.0
  for b in range(2):
    for t in range(1, 8):
      expected -= weights[b, t] * logp[b, t - 1, tokens[b, t]]
  np.testing.assert_allclose(float(total), expected, rtol=1e-5)
  assert float(weight) == weights.sum()
  assert 0 <= float(aux["accuracy"]) <= float(weight)


def test_prompt_and_pad_positions_get_zero_gradient():
  """d loss / d logits is zero at every query whose next token weighs 0 (prompt, pad)."""
  tokens, weights, batch = _batch()
  logits, _ = qwen3.forward(PARAMS, CONFIG, tokens)

  def loss_of_logits(lg):
    logp = jax.nn.log_softmax(lg[:, :-1], axis=-1)
    logp = jnp.take_along_axis(logp, jnp.asarray(tokens)[:, 1:, None], -1)[..., 0]
    return -jnp.sum(logp * weights[:, 1:])

  g = np.asarray(jax.grad(loss_of_logits)(logits))  # [B, T, V]
  next_weight = np.concatenate([weights[:, 1:], np.zeros((2, 1))], axis=1)
  assert np.all(g[next_weight == 0] == 0)
  assert np.all(np.abs(g[next_weight > 0]).sum(-1) > 0)
  # And the loss ignores what the prompt/pad tokens are as targets (only their role as inputs).
  changed = _batch()[2]
  changed.response_tokens[0, 4] = 3  # a pad token
  a = sft.sft_loss(PARAMS, batch, None, config=CONFIG)[0]
  b = sft.sft_loss(PARAMS, changed, None, config=CONFIG)[0]
  assert float(a) == float(b)
