"""GR2's decoupled SFT loss on the assistant message (research/papers.md §1.4).

  L_SFT = -lambda_r sum_i log P(r_i | P, r_<i) - lambda_o sum_j log P(o_j | P, r, o_<j)

`batch['loss_weights'][b, t]` (gr2jax/data/batches.py) is the weight of predicting token t from
position t - 1's logits: lambda_r on reasoning, lambda_o on the answer, 0 on prompt and padding.
Returned as (weighted sum, weight sum): the step normalises per weighted token, once.
"""

import chex
import jax
import jax.numpy as jnp

from gr2jax.model import qwen3
from gr2jax.model.config import ModelConfig


def token_log_probs(logits: jax.Array, targets: jax.Array) -> jax.Array:
  """log softmax(logits)[target]; logits [B, T, V] f32, targets [B, T] -> [B, T] f32."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return jnp.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]


def sft_loss(params: dict, batch: dict, key: jax.Array, *, config: ModelConfig):
  """Weighted next-token cross-entropy (AR shift: logits at t - 1 predict token t).

  Args:
    params: the param pytree.
    batch: tokens, positions [B, T] int32, loss_weights [B, T] f32 (see the module docstring).
    key: unused (SFT draws nothing).
    config: the model.

  Returns:
    (sum_t w_t * -log p(x_t | x_<t), sum_t w_t, {'accuracy': sum of w_t * [argmax == x_t]}).
  """
  del key
  tokens, weights = batch["tokens"], batch["loss_weights"]
  chex.assert_equal_shape([tokens, batch["positions"], weights])
  logits, _ = qwen3.forward(params, config, tokens, batch["positions"])  # causal, right-padded
  targets, w = tokens[:, 1:], weights[:, 1:].astype(jnp.float32)
  logp = token_log_probs(logits[:, :-1], targets)
  correct = (jnp.argmax(logits[:, :-1], axis=-1) == targets).astype(jnp.float32)
  return -jnp.sum(logp * w), jnp.sum(w), {"accuracy": jnp.sum(correct * w)}
