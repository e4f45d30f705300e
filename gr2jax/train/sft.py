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
  """Weighted next-token cross-entropy on the response (AR shift: query t - 1 predicts token t).

  Args:
    params: the param pytree.
    batch: tokens, positions [B, T] int32 (prompt + response contiguous, right-padded),
      prompt_lengths [B], response_tokens [B, R], response_weights [B, R] f32.
    key: unused (SFT draws nothing).
    config: the model.

  Returns:
    (sum_j w_j * -log p(r_j | P, r_<j), sum_j w_j, {'accuracy': sum of w_j * [r_j is the arg-max]}).
  """
  del key
  targets, w = batch["response_tokens"], batch["response_weights"].astype(jnp.float32)
  chex.assert_equal_shape([batch["tokens"], batch["positions"]])
  chex.assert_equal_shape([targets, w])
  r = targets.shape[1]
  query = batch["prompt_lengths"][:, None] - 1 + jnp.arange(r)[None, :]  # [B, R]
  query = jnp.minimum(query, batch["tokens"].shape[1] - 1)  # padding rows past T weigh 0
  logits, _ = qwen3.forward(params, config, batch["tokens"], batch["positions"],
                            logits_at=query)  # causal over the right-padded rows; [B, R, V]
  logp = token_log_probs(logits, targets)
  correct = (logp >= jnp.max(jax.nn.log_softmax(logits), axis=-1)).astype(jnp.float32)
  return -jnp.sum(logp * w), jnp.sum(w), {"accuracy": jnp.sum(correct * w)}
