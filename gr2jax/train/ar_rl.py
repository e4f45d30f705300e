"""AR GRPO for the GR2 teacher (research/papers.md §1.5): rollouts, rewards, replay-free scoring.

`prepare` runs outside the jitted step: for each of the batch's prompts it samples G responses
with gr2jax.model.generate (temperature T), parses them, scores them with the one reward
(rewards.rank_rewards: invalid / truncated / overflowing -> -1, kept in its group), computes the
group advantages (grpo.group_advantages, zero-variance groups dropped) and re-scores pi_old with
a teacher-forced forward under the current (= sampling) params. `ar_rl_loss` scores the same
tokens under theta and applies grpo.policy_loss.

Log-prob convention (one for AR and diffusion): commit.token_log_probs, i.e. log softmax of
logits / T (T = the sampling temperature), the same distribution the sampler drew from.
Layout: [prompt (P slots, right-padded) | response (R slots)], response token j at RoPE position
prompt_length + j, causal in slot order over valid keys (the prompt's padding slots are
invisible; `attention.causal_pattern` and-ed with key validity), so the forward equals the
sampler's cached decoding.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax import chunks
from gr2jax.diffusion import commit
from gr2jax.model import attention, masks, qwen3
from gr2jax.model import generate as generate_lib
from gr2jax.model.config import ModelConfig
from gr2jax.train import grpo, rewards


def sequence_inputs(prompt_tokens, prompt_lengths, response_tokens, response_lengths):
  """Tokens, positions and mask of the [prompt | response] layout (module docstring).

  Args:
    prompt_tokens: [B, P]; prompt_lengths: [B]; response_tokens: [B, R]; response_lengths: [B].

  Returns:
    (tokens [B, P + R], positions [B, P + R], mask [B, P + R, P + R] bool, the mask's
    attention.Pattern).
  """
  b, p = prompt_tokens.shape
  r = response_tokens.shape[1]
  positions = jnp.concatenate([
    jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)),
    prompt_lengths[:, None] + jnp.arange(r, dtype=jnp.int32)[None, :]], axis=1)
  valid = jnp.concatenate([masks.padding_mask(prompt_lengths, p),
                           masks.padding_mask(response_lengths, r)], axis=1)
  pattern = attention.causal_pattern(p + r)
  mask = attention.apply_pattern(pattern, valid)
  return jnp.concatenate([prompt_tokens, response_tokens], axis=1), positions, mask, pattern


def response_log_probs(params: dict, config: ModelConfig, batch: dict, temperature: float):
  """[B, R] log-probs of the response tokens (query before each token, AR shift)."""
  p = batch["prompt_tokens"].shape[1]
  r = batch["response_tokens"].shape[1]
  tokens, positions, mask, pattern = sequence_inputs(
    batch["prompt_tokens"], batch["prompt_lengths"], batch["response_tokens"],
    batch["response_lengths"])
  # Response token j is predicted at the prompt's last real token (j = 0) or response slot j - 1.
  query = jnp.concatenate([batch["prompt_lengths"][:, None] - 1,
                           p + jnp.broadcast_to(jnp.arange(r - 1), (tokens.shape[0], r - 1))],
                          axis=1)
  logits, _ = qwen3.forward(params, config, tokens, positions, mask, logits_at=query,
                            mask_pattern=pattern)
  logp = commit.token_log_probs(logits, config.mask_token_id, temperature)
  return jnp.take_along_axis(logp, batch["response_tokens"][..., None], axis=-1)[..., 0]


def ar_rl_loss(params: dict, batch: dict, key: jax.Array, *, config: ModelConfig,
               temperature: float, eps_low: float, eps_high: float):
  """GRPO on prepared rollouts (`prepare`): (loss_sum, token count, aux sums)."""
  del key
  logp = response_log_probs(params, config, batch, temperature)
  return grpo.policy_loss(logp, batch["logp_old"], batch["advantages"], batch["token_weights"],
                          eps_low=eps_low, eps_high=eps_high)


@functools.partial(jax.jit, static_argnames=("config", "temperature"))
def _old_log_probs(params, config, batch, temperature):
  return response_log_probs(params, config, batch, temperature)


def prepare(params: dict, batch: dict, key: jax.Array, *, config: ModelConfig, tokenizer,
            labels_of, group_size: int, temperature: float, max_new_tokens: int,
            alpha: float, chunk_rows: int = 0, sharding=None) -> tuple[dict, dict]:
  """Rollouts -> the GRPO batch (module docstring).

  Args:
    params: the current params (they sample, and pi_old = them: one update per rollout batch).
    batch: an inputs.make_train_batch batch of Bp prompts (example_index, target_position).
    key: the step's PRNG key.
    config: the model.
    tokenizer: the data build's tokenizer.
    labels_of: example index -> the candidate label strings.
    group_size: G rollouts per prompt.
    temperature: sampling temperature (> 0).
    max_new_tokens: R, the response cap (a row that does not stop within R is invalid).
    alpha: the format-reward weight.
    chunk_rows: rows per rollout / pi_old call (chunks.map_row_chunks; 0 = all at once).
    sharding: the placement of each chunk (the batch sharding; None: numpy inputs).

  Returns:
    (the train batch with Bp * G rows, rollout stats).
  """
  rows = np.flatnonzero(batch["example_mask"])
  rep = lambda x: np.repeat(np.asarray(x)[rows], group_size, axis=0)
  prompts, prompt_lengths = rep(batch["prompt_tokens"]), rep(batch["prompt_lengths"])
  sampling = generate_lib.Sampling(temperature=temperature)

  def rollouts(chunk, chunk_key):
    out = generate_lib.generate(params, config, chunk["prompt_tokens"], chunk["prompt_lengths"],
                                max_new_tokens=max_new_tokens, key=chunk_key, sampling=sampling)
    return out.tokens, out.lengths

  tokens, lengths = chunks.map_row_chunks(
    rollouts, {"prompt_tokens": prompts, "prompt_lengths": prompt_lengths}, chunk_rows,
    sharding=sharding, key=key)
  labels = [labels_of(int(i)) for i in rep(batch["example_index"])]
  reward, valid, results = rewards.rollout_rewards(
    tokenizer, tokens, lengths, labels, rep(batch["target_position"]), config.eos_token_ids,
    alpha=alpha)
  adv, keep = grpo.group_advantages(reward.reshape(-1, group_size))
  weights = (np.arange(tokens.shape[1])[None, :] < lengths[:, None]).astype(np.float32)
  weights *= np.repeat(keep, group_size)[:, None]
  train = {"prompt_tokens": prompts, "prompt_lengths": prompt_lengths,
           "response_tokens": tokens, "response_lengths": lengths.astype(np.int32),
           "advantages": adv.reshape(-1), "token_weights": weights}
  scored = {k: train[k] for k in ("prompt_tokens", "prompt_lengths", "response_tokens",
                                   "response_lengths")}
  train["logp_old"] = chunks.map_row_chunks(
    lambda chunk, _: _old_log_probs(params, config, chunk, temperature), scored, chunk_rows,
    sharding=sharding)
  stats = {"reward": float(reward.mean()), "valid_rate": float(valid.mean()),
           "kept_groups": float(keep.mean()), "response_len": float(lengths.mean()),
           "promoted": float(np.mean([r.ranking[0] != 0 for r in results]))}
  return train, stats
