"""GR2's decoupled SFT loss on the assistant message (GR2, arXiv 2602.07774).

  L_SFT = -lambda_r sum_i log P(r_i | P, r_<i) - lambda_o sum_j log P(o_j | P, r, o_<j)

`batch.response_weights[b, j]` (gr2jax/data/batches.py `Batch`, built by train/inputs.py) is the
weight of predicting response token j: lambda_r on reasoning, lambda_o on the answer, 0 on
padding. The response is scored by the one causal scorer (decoding/policy.py `causal_log_probs`,
the LM head only at the R response queries). Returned as (weighted sum, weight sum): the step
normalises per weighted token, once.
"""

import chex
import jax
import jax.numpy as jnp

from gr2jax.data.batches import Batch
from gr2jax.decoding.policy import causal_log_probs
from gr2jax.model.config import ModelConfig

# The Batch fields sft_loss reads.
FIELDS = ("prompt_tokens", "prompt_lengths", "response_tokens", "response_lengths",
          "response_weights")


def sft_loss(params: dict, batch: Batch, key: jax.Array, *, config: ModelConfig):
  """Weighted next-token cross-entropy on the response (AR shift: query t - 1 predicts token t).

  Args:
    params: the param pytree.
    batch: prompt_tokens [B, P] (right-padded), prompt_lengths [B], response_tokens [B, R],
      response_lengths [B], response_weights [B, R] f32.
    key: unused (SFT draws nothing).
    config: the model (AR).

  Returns:
    (sum_j w_j * -log p(r_j | P, r_<j), sum_j w_j, {'accuracy': sum of w_j * [r_j is the arg-max]}).
  """
  del key
  targets, w = batch.response_tokens, batch.response_weights.astype(jnp.float32)
  chex.assert_equal_shape([targets, w])
  logp, log_probs = causal_log_probs(params, config, batch.prompt_tokens, batch.prompt_lengths,
                                     targets, batch.response_lengths,
                                     return_log_probs=True)  # [B, R], [B, R, V]
  correct = (logp >= jnp.max(log_probs, axis=-1)).astype(jnp.float32)
  return -jnp.sum(logp * w), jnp.sum(w), {"accuracy": jnp.sum(correct * w)}
