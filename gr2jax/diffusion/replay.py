"""Cache-free replay of a block-diffusion trace (what TraceRL-style RL re-scores).

Round s of the replay rebuilds, in every block at once, the canvas the decoder saw at denoising
step s of that block: response tokens with `commit_step >= s` are the mask token, the others
(seeds and tokens committed at earlier steps) are clean. It is scored in one cache-free forward
of the x_t (+) x_0 layout

  [prompt (P slots) | clean response (R slots) | noisy response (R slots)]

with RoPE positions prompt_length + j for response index j in both halves, and the mask

  prompt / clean queries: block-causal over prompt + clean keys (masks.block_ids);
  noisy queries of block k: prompt + clean keys of blocks < k, and the noisy keys of block k.

This is exactly what each decode forward saw (the cache holds the clean earlier blocks), so the
log-prob of a token committed at step s is read from the noisy half in round s at the query
before it (AR shift), and a block's seed token from the clean half at the query before it (the
previous block's commit forward, or the prompt's last token for block 0).
R is max_new rounded up to a multiple of the block size; slots beyond max_new hold the mask token,
as in the decoder.
"""

import functools

import jax
import jax.numpy as jnp
from jax import lax

from gr2jax.diffusion import commit
from gr2jax.diffusion.decode import NEVER_STEP, SEED_STEP, DiffusionOutput
from gr2jax.model import masks, qwen3
from gr2jax.model.config import ModelConfig


def replay_inputs(
  prompt_tokens: jax.Array,
  prompt_lengths: jax.Array,
  trace_tokens: jax.Array,
  commit_step: jax.Array,
  lengths: jax.Array,
  round_index: jax.Array,
  *,
  block_size: int,
  mask_token_id: int,
):
  """Tokens, positions and mask of replay round `round_index` (layout in the module docstring).

  Args:
    prompt_tokens: [B, P] right-padded prompts.
    prompt_lengths: [B] real prompt lengths.
    trace_tokens: [B, M] DiffusionOutput.trace_tokens.
    commit_step: [B, M] DiffusionOutput.commit_step.
    lengths: [B] DiffusionOutput.lengths.
    round_index: [] the denoising step s to rebuild.
    block_size: the decode block size.
    mask_token_id: the mask token.

  Returns:
    (tokens [B, P + 2R] int32, positions [B, P + 2R] int32, mask [B, P + 2R, P + 2R] bool).
  """
  b, p = prompt_tokens.shape
  m = trace_tokens.shape[1]
  r = -(-m // block_size) * block_size
  pad = ((0, 0), (0, r - m))
  trace = jnp.pad(trace_tokens, pad, constant_values=mask_token_id)  # [B, R]
  steps = jnp.pad(commit_step, pad, constant_values=NEVER_STEP)
  clean_ok = jnp.arange(r)[None, :] < lengths[:, None]
  clean = jnp.where(clean_ok, trace, mask_token_id)
  noisy = jnp.where(steps >= round_index, mask_token_id, trace)
  tokens = jnp.concatenate([prompt_tokens, clean, noisy], axis=1)

  resp_pos = prompt_lengths[:, None] + jnp.arange(r, dtype=jnp.int32)[None, :]  # [B, R]
  positions = jnp.concatenate(
    [jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p)), resp_pos, resp_pos], axis=1
  )
  part = jnp.concatenate([jnp.zeros(p + r, jnp.int32), jnp.ones(r, jnp.int32)])  # 1 = noisy
  valid = jnp.concatenate(
    [masks.padding_mask(prompt_lengths, p), clean_ok, jnp.ones((b, r), bool)], axis=1
  )
  blocks = masks.block_ids(positions, prompt_lengths, block_size)  # [B, N]
  qb, kb = blocks[:, :, None], blocks[:, None, :]
  q_noisy, k_noisy = part[None, :, None] == 1, part[None, None, :] == 1
  mask = jnp.where(
    q_noisy,
    jnp.where(k_noisy, kb == qb, kb < qb),
    ~k_noisy & (kb <= qb),
  )
  return tokens, positions, mask & valid[:, None, :]


@functools.partial(jax.jit, static_argnames=("config", "block_size", "temperature"))
def replay_log_probs(
  params: dict,
  config: ModelConfig,
  prompt_tokens: jax.Array,
  prompt_lengths: jax.Array,
  output: DiffusionOutput,
  *,
  block_size: int,
  temperature: float = 0.0,
) -> jax.Array:
  """Re-scores every committed token of a trace cache-free, round by round.

  Args:
    params: the param pytree.
    config: the model.
    prompt_tokens: [B, P] the prompts given to the decoder.
    prompt_lengths: [B].
    output: the decoder's DiffusionOutput.
    block_size: the decode block size.
    temperature: the decode temperature (log-probs use commit.token_log_probs).

  Returns:
    [B, M] f32 log-probs of `output.trace_tokens`, 0 where never committed; equal to
    `output.commit_logprob` up to float error.
  """
  p = prompt_tokens.shape[1]
  m = output.trace_tokens.shape[1]
  r = -(-m // block_size) * block_size
  steps = output.commit_step
  committed = steps < NEVER_STEP
  num_rounds = jnp.max(jnp.where(committed, steps, 0)) + 1
  target = output.trace_tokens

  def score(round_index):
    tokens, positions, mask = replay_inputs(
      prompt_tokens,
      prompt_lengths,
      output.trace_tokens,
      steps,
      output.lengths,
      round_index,
      block_size=block_size,
      mask_token_id=config.mask_token_id,
    )
    logits, _ = qwen3.forward(params, config, tokens, positions, mask)
    logp = commit.token_log_probs(logits, config.mask_token_id, temperature)  # [B, N, V]
    # Response index j is predicted by the query before it (AR shift).
    clean_q = jnp.broadcast_to(p + jnp.arange(r - 1, dtype=jnp.int32), (target.shape[0], r - 1))
    seed_q = jnp.concatenate([prompt_lengths[:, None] - 1, clean_q], axis=1)[:, :m]
    noisy_q = (p + r - 1 + jnp.arange(m))[None, :]
    pick = lambda q: jnp.take_along_axis(
      jnp.take_along_axis(logp, q[:, :, None], axis=1), target[:, :, None], axis=2
    )[..., 0]
    return pick(seed_q), pick(jnp.broadcast_to(noisy_q, target.shape))

  seed_lp, _ = score(jnp.zeros((), jnp.int32))

  def body(i, acc):
    _, noisy_lp = score(i)
    return jnp.where(steps == i, noisy_lp, acc)

  acc = jnp.where(steps == SEED_STEP, seed_lp, 0.0)
  return lax.fori_loop(0, num_rounds, body, acc)
