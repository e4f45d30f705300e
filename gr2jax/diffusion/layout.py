"""The two-stream training layout: ONE function builds the inputs of CFT, replay and scoring.

A sequence of the layout is

  [prompt (P slots) | clean response x_0 (R slots) | noisy response x_t^1 | ... | x_t^K]

with R the response width rounded up to a multiple of the block size B = config.block_size
(the extra slots hold the mask token, as in the decoder's last block). K >= 0 noisy streams
share one prompt and one clean stream: CFT's complementary pair is K = 2 (the mask and its
inverse), RL replay packs its denoising rounds as K = rounds streams, and K = 0 with B = 1 is
the causal `[prompt | response]` forward of the one causal scorer (decoding/policy.py: SFT, AR RL,
the OPD teacher). Noisy stream k holds the response with the positions `noisy[:, k]` replaced
by the mask token.

RoPE positions: prompt slot i has position i; response index j has position prompt_length + j in
the clean stream and in every noisy stream (BD3-LM / Fast-dLLM v2: identical
positions in each half). Block alignment is response-relative (`masks.block_ids`): the prompt is
causal, response index j belongs to block j // B.

Attention (the x_t (+) x_0 mask of BD3-LM / Fast-dLLM v2, with the decoder's alignment):
  - prompt and clean queries: block-causal over prompt + clean keys, never a noisy key;
  - noisy queries of stream k, block b: the prompt, clean blocks < b, and the noisy keys of
    block b of the same stream k (bidirectional), never another stream.
Keys are valid where the prompt / clean response is real (slot < length); every noisy slot is a
valid key (a decoder canvas holds mask tokens up to the block's end). A noisy block therefore sees
exactly what the decoder's forward of that block saw: the KV cache (prompt + committed earlier
blocks) plus its own canvas. The rule above is static in slot coordinates (prompt slot i is block
i, response index j block P + j // B: the order of `masks.block_ids` on every valid slot; stream
0 = prompt and clean, k + 1 = noisy stream k), so the mask is `attention.apply_pattern(pattern,
key_valid)` with the static `attention.TwoStream(P, R, K, B).pattern()`, which is
`attention.Pattern`'s one rule and what the attention kernels take (gr2jax/model/attention.py).
With K >= 1 the reference path attends per noisy block (`attention.two_stream`): the prompt and
clean queries over the prompt and clean keys, each noisy block over those keys and its own, so
a stream costs its R queries over P + R + B keys and the [N, N] mask is never formed.

Reading predictions (AR token shift, Diffusion-GR2, arXiv 2607.01170): response token j is predicted
by the query before it. A block's seed (j % B == 0) is predicted from the clean stream (query j - 1,
the previous block's last token, or the prompt's last token for j = 0): that is the decoder's
commit forward (or prefill). Any other token is predicted in a noisy stream at query j - 1, which
lies in j's own block. `prediction_queries` gives these indices; `score` runs the forward with the
LM head only there.

Contract: a seed must not be noisy where it is read (the decoder never masks a seed); CFT's
sampler and replay's step map both guarantee it.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp

from gr2jax.diffusion import commit
from gr2jax.model import attention, masks, qwen3
from gr2jax.model.config import ModelConfig

CLEAN_STREAM = -1


class Layout(NamedTuple):
  """Inputs of one forward of the two-stream layout (N = P + (1 + K) R).

  Attributes:
    tokens: [B, N] int32.
    positions: [B, N] int32 RoPE positions.
    mask: [B, N, N] bool, True where a query may attend to a key.
    pattern: the mask's static structure (attention.Pattern; mask = pattern & key validity).
  """

  tokens: jax.Array
  positions: jax.Array
  mask: jax.Array
  pattern: attention.Pattern


def padded_width(width: int, block_size: int) -> int:
  """R: a response width rounded up to a multiple of the block size."""
  return -(-width // block_size) * block_size


def two_stream_inputs(
  config: ModelConfig,
  prompt_tokens: jax.Array,
  prompt_lengths: jax.Array,
  response_tokens: jax.Array,
  response_lengths: jax.Array,
  noisy: jax.Array,
) -> Layout:
  """Builds `[prompt | clean response | noisy response x K]` (layout in the module docstring).

  Args:
    config: the model; its block_size aligns the blocks and its mask_token_id masks (an AR
      model, mask_token_id None, only with K = 0: the causal scorer, decoding/policy.py).
    prompt_tokens: [B, P] int right-padded prompts.
    prompt_lengths: [B] int real prompt lengths (>= 1).
    response_tokens: [B, M] int responses (anything after `response_lengths` is allowed: it is
      invalid in the clean stream and kept, unless noisy, in the noisy streams).
    response_lengths: [B] int real response lengths (clean-stream keys valid below it).
    noisy: [B, M] or [B, K, M] bool, True where noisy stream k holds the mask token.

  Returns:
    Layout with N = P + (1 + K) * R, R = padded_width(M, config.block_size).
  """
  prompt_tokens = jnp.asarray(prompt_tokens, jnp.int32)
  response_tokens = jnp.asarray(response_tokens, jnp.int32)
  noisy = jnp.asarray(noisy, bool)
  if noisy.ndim == 2:
    noisy = noisy[:, None]
  b, p = prompt_tokens.shape
  m = response_tokens.shape[1]
  if noisy.ndim != 3 or response_tokens.shape[0] != b or noisy.shape[::2] != (b, m):
    raise ValueError(
      f"two_stream_inputs: prompts {prompt_tokens.shape}, responses {response_tokens.shape} and "
      f"noisy {noisy.shape} must be [B, P], [B, M] and [B, (K,) M]"
    )
  k = noisy.shape[1]
  if config.mask_token_id is None and k:
    raise ValueError("two_stream_inputs: config.mask_token_id is None (not a diffusion model), "
                     f"but {k} noisy streams need it")
  # The token of an empty slot: the mask token, or the pad token for an AR model (K = 0).
  mask_id = config.pad_token_id if config.mask_token_id is None else config.mask_token_id
  r = padded_width(m, config.block_size)
  response = jnp.pad(response_tokens, ((0, 0), (0, r - m)), constant_values=mask_id)  # [B, R]
  noisy = jnp.pad(noisy, ((0, 0), (0, 0), (0, r - m)), constant_values=True)  # [B, K, R]
  clean_valid = masks.padding_mask(response_lengths, r)  # [B, R]
  clean = jnp.where(clean_valid, response, mask_id)
  noisy_tokens = jnp.where(noisy, mask_id, response[:, None, :]).reshape(b, k * r)
  tokens = jnp.concatenate([prompt_tokens, clean, noisy_tokens], axis=1)

  resp_pos = jnp.asarray(prompt_lengths, jnp.int32)[:, None] + jnp.arange(r, dtype=jnp.int32)
  positions = jnp.concatenate(
    [jnp.broadcast_to(jnp.arange(p, dtype=jnp.int32), (b, p))] + [resp_pos] * (1 + k), axis=1
  )
  valid = jnp.concatenate(
    [masks.padding_mask(prompt_lengths, p), clean_valid, jnp.ones((b, k * r), bool)], axis=1
  )
  pattern = attention.TwoStream(p, r, k, config.block_size).pattern()
  return Layout(tokens=tokens, positions=positions, mask=attention.apply_pattern(pattern, valid),
                pattern=pattern)


def prediction_queries(
  stream: jax.Array, prompt_lengths: jax.Array, prompt_width: int, response_width: int
) -> jax.Array:
  """The query index whose logits predict each response token (AR token shift).

  Args:
    stream: [B, M] int, CLEAN_STREAM (-1) to read token j from the clean stream (seeds), else
      the noisy stream k >= 0 to read it from (j % B must then be >= 1).
    prompt_lengths: [B] int.
    prompt_width: P of the layout.
    response_width: R of the layout (padded).

  Returns:
    [B, M] int32: prompt_lengths - 1 for j = 0 in the clean stream, else the slot of response
    index j - 1 in the chosen stream, P + (1 + stream) * R + j - 1.
  """
  stream = jnp.asarray(stream, jnp.int32)
  j = jnp.arange(stream.shape[1], dtype=jnp.int32)[None, :]
  prev = prompt_width + (1 + stream) * response_width + j - 1
  first = jnp.asarray(prompt_lengths, jnp.int32)[:, None] - 1
  return jnp.where((stream == CLEAN_STREAM) & (j == 0), first, prev)


def logits(params: dict, config: ModelConfig, inputs: Layout, queries: jax.Array) -> jax.Array:
  """One forward of a layout with the LM head only at `queries`.

  Args:
    params: the param pytree.
    config: the model.
    inputs: a Layout.
    queries: [B, M] int query indices (prediction_queries).

  Returns:
    [B, M, V] f32 raw logits.
  """
  return qwen3.forward(
    params, config, inputs.tokens, inputs.positions, qwen3.Mask(inputs.mask, inputs.pattern),
    logits_at=queries,
  )[0]


def score(
  params: dict,
  config: ModelConfig,
  inputs: Layout,
  queries: jax.Array,
  targets: jax.Array,
  *,
  temperature: float = 0.0,
  return_log_probs: bool = False,
) -> tuple[jax.Array, jax.Array | None]:
  """The targets' log-probs from `logits` (one forward, the LM head only at `queries`).

  Log-probs are `commit.token_log_probs` (mask token suppressed, / temperature when > 0): the
  distribution the decoder samples and commits from.

  Args:
    params: the param pytree.
    config: the model.
    inputs: a Layout.
    queries: [B, M] int query indices (prediction_queries).
    targets: [B, M] int the tokens to score.
    temperature: the decode temperature (0 = greedy, scored at temperature 1).
    return_log_probs: also return the full [B, M, V] log-probs.

  Returns:
    (log-probs of the targets [B, M] f32, the full log-probs [B, M, V] f32 or None).
  """
  logp = commit.token_log_probs(logits(params, config, inputs, queries), config.mask_token_id,
                                temperature)  # [B, M, V]
  chosen = jnp.take_along_axis(logp, jnp.asarray(targets, jnp.int32)[..., None], axis=-1)[..., 0]
  return chosen, logp if return_log_probs else None
