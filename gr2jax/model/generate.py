"""Autoregressive decoding: a jitted prefill, then a jitted `lax.while_loop` of 1-token steps.

The whole decode loop runs on device (no host sync per token). Prompts are right-padded with
per-example lengths; the cache is sized to prompt + max_new_tokens by default and donated to both
jitted functions. Each example stops at any of the eos ids; its later tokens are `pad_token_id`.
The loop exits as soon as every example has stopped. NFE counts forward passes, prefill included.
"""

import dataclasses
import functools

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from gr2jax import settings
from gr2jax.model import decode_core, validate
from gr2jax.model.cache import KVCache, init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import layer_list
from gr2jax.model.qwen3 import forward


@dataclasses.dataclass(frozen=True, kw_only=True)
class ARDecoding(decode_core.Decoding):
  """How an AR decode runs (decode_core.Decoding's fields, then these; static under jit)."""

  WHERE = "ARDecoding"

  top_k: int = settings.integer(0, doc="keep only the k most likely tokens when sampling (0 = "
                                "off)", minimum=0)
  top_p: float = settings.real(1.0, doc="keep the smallest set of most likely tokens whose "
                               "probability reaches p (1 = off)", low=0, high=1, low_open=True)
  cache_size: int | None = decode_core.optional_int(doc="KV cache slots per row; None = P + "
                                                    "max_new_tokens", minimum=1)


@flax.struct.dataclass
class GenerateOutput:
  """Result of `generate`.

  Attributes:
    tokens: [B, max_new] int32 generated tokens, `pad_token_id` after an example stops.
    logprobs: [B, max_new] f32 log-prob of each token under the model (temperature 1, no top-k/p),
      0 after an example stops.
    lengths: [B] int32 generated tokens per example, the stopping eos included.
    nfe: int32 scalar, forward passes run (the prefill counts as one).
  """

  tokens: jax.Array
  logprobs: jax.Array
  lengths: jax.Array
  nfe: jax.Array


def first_argmax(x: jax.Array) -> jax.Array:
  """jnp.argmax(x, axis=-1) (first maximum; first NaN if any) as two plain reductions.

  XLA:CPU lowers jnp.argmax to a (value, index) pair reduction that does not vectorise: over a
  [B, T, V] vocab axis it cost ~6x a max + min pair, most of the decode loop's overhead on CPU.

  Args:
    x: [..., V] values.

  Returns:
    [...] int32 index of the first maximum along the last axis.
  """
  top = jnp.max(x, axis=-1, keepdims=True)
  hit = (x == top) | jnp.isnan(x)  # max() propagates NaN, and argmax picks the first NaN
  idx = jnp.arange(x.shape[-1], dtype=jnp.int32)
  return jnp.min(jnp.where(hit, idx, x.shape[-1]), axis=-1)


def sample_logits(logits: jax.Array, key: jax.Array, decoding: ARDecoding) -> jax.Array:
  """Picks one token per row.

  Args:
    logits: [B, V] f32.
    key: PRNG key (unused when greedy).
    decoding: the static settings (temperature, top_k, top_p).

  Returns:
    [B] int32 token ids.
  """
  if decoding.temperature == 0:
    return first_argmax(logits)
  neg = jnp.finfo(jnp.float32).min
  logits = logits / decoding.temperature
  if decoding.top_k:
    kth = lax.top_k(logits, decoding.top_k)[0][:, -1:]  # [B, 1]
    logits = jnp.where(logits < kth, neg, logits)
  if decoding.top_p < 1:
    sorted_logits = jnp.sort(logits, axis=-1)[:, ::-1]  # [B, V] descending
    probs = jax.nn.softmax(sorted_logits, axis=-1)
    before = jnp.cumsum(probs, axis=-1) - probs  # mass strictly above each token
    num_kept = jnp.sum(before < decoding.top_p, axis=-1, keepdims=True)  # >= 1
    threshold = jnp.take_along_axis(sorted_logits, num_kept - 1, axis=-1)
    logits = jnp.where(logits < threshold, neg, logits)
  return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)


_prefill = jax.jit(decode_core.prefill_into, static_argnums=1, donate_argnames="cache")


def prefill(params: dict, config: ModelConfig, tokens: jax.Array, lengths: jax.Array,
            cache: KVCache):
  """Jitted `ragged_prefill` into an empty cache, donated: ([B, V] f32 next-token logits, cache).

  The inputs are checked before tracing (`validate.prompts`; errors name the argument).
  """
  tokens, lengths = validate.prompts("prefill", config, tokens, lengths)
  return _prefill(layer_list(params), config, tokens, lengths, cache)


def decode(params: dict, config: ModelConfig, cache: KVCache, logits: jax.Array, key: jax.Array,
           decoding: ARDecoding) -> tuple[GenerateOutput, KVCache]:
  """Samples up to decoding.max_new_tokens tokens after a prefilled cache, in one on-device while
  loop.

  Jitted (the cache donated) and fed by `prefill`: its inputs are device values, not checked here
  (`generate` checks everything before it calls the two).

  Args:
    params: the param pytree (stacked layers are converted by params.layer_list first).
    config: the model (static).
    cache: the prefilled cache (donated) with room for max_new_tokens - 1 more tokens.
    logits: [B, V] f32 next-token logits from the prefill.
    key: PRNG key.
    decoding: the static settings (stop ids None: config.eos_token_ids).

  Returns:
    (GenerateOutput with nfe counting the decode steps only (generate adds the prefill), the
    cache holding the prompt and every generated token but the last).
  """
  return _decode(layer_list(params), config, cache, logits, key, decoding=decoding)


@functools.partial(jax.jit, static_argnames=("config", "decoding"), donate_argnames="cache")
def _decode(params: dict, config: ModelConfig, cache: KVCache, logits: jax.Array, key: jax.Array,
            *, decoding: ARDecoding) -> tuple[GenerateOutput, KVCache]:
  b = logits.shape[0]
  max_new_tokens = decoding.max_new_tokens
  eos = jnp.asarray(config.eos_token_ids if decoding.stop_token_ids is None
                    else decoding.stop_token_ids, jnp.int32)
  pad = config.pad_token_id

  def pick(logits, key, done):  # -> token [B], its log-prob [B]
    token = sample_logits(logits, key, decoding)
    logp = jnp.take_along_axis(jax.nn.log_softmax(logits, axis=-1), token[:, None], axis=-1)[:, 0]
    return jnp.where(done, pad, token), jnp.where(done, 0.0, logp)

  def record(state, step, token, logp, done_before):
    tokens, logprobs, lengths, done = state
    tokens = lax.dynamic_update_slice(tokens, token[:, None], (0, step))
    logprobs = lax.dynamic_update_slice(logprobs, logp[:, None], (0, step))
    lengths = jnp.where(done_before, lengths, step + 1)
    return tokens, logprobs, lengths, done | jnp.isin(token, eos)

  key, sub = jax.random.split(key)
  no_done = jnp.zeros((b,), bool)
  token, logp = pick(logits, sub, no_done)
  out = (jnp.full((b, max_new_tokens), pad, jnp.int32), jnp.zeros((b, max_new_tokens), jnp.float32),
         jnp.zeros((b,), jnp.int32), no_done)
  out = record(out, 0, token, logp, no_done)

  def cond(carry):
    step, _, _, _, out = carry
    return (step < max_new_tokens) & ~jnp.all(out[3])

  def body(carry):
    step, cache, token, key, out = carry
    logits, cache = forward(params, config, token[:, None], cache=cache, update_cache=True)
    key, sub = jax.random.split(key)
    done = out[3]
    token, logp = pick(logits[:, 0], sub, done)
    return step + 1, cache, token, key, record(out, step, token, logp, done)

  step, cache, _, _, (tokens, logprobs, lengths, _) = lax.while_loop(
      cond, body, (jnp.int32(1), cache, token, key, out))
  return GenerateOutput(tokens=tokens, logprobs=logprobs, lengths=lengths, nfe=step - 1), cache


def generate(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
             prompt_lengths: jax.Array | None, decoding: ARDecoding, *,
             key: jax.Array | None = None) -> GenerateOutput:
  """AR generation for a batch of right-padded prompts (decode_core.Decoding's convention).

  Args:
    params: the param pytree.
    config: the model.
    prompt_tokens: [B, P] int prompts, right-padded.
    prompt_lengths: [B] int real prompt lengths (each in [1, P]); None: P for every row.
    decoding: ARDecoding (max_new_tokens N; temperature, top_k, top_p; stop ids; cache size).
    key: PRNG key; required unless greedy.

  Returns:
    GenerateOutput (tokens [B, N], logprobs [B, N], lengths [B], nfe incl. the prefill).

  Raises:
    TypeError / ValueError naming the argument, before anything is traced: prompts that are not
      [B, P] integers in [0, V), lengths outside 1..P, decoding that is not an ARDecoding (its
      own fields are checked when it is built), a cache_size below P + N - 1, P + N (or
      cache_size) past config.max_position_embeddings (decode_core.check_positions), top_k > V,
      a key that is not a PRNG key, stop ids (decoding's or config.eos_token_ids) outside
      [0, V).
  """
  where = "generate"
  prompt_tokens, prompt_lengths = validate.prompts(where, config, prompt_tokens, prompt_lengths)
  b, p = prompt_tokens.shape
  stop, key = decode_core.check_call(where, decoding, ARDecoding, config, key)
  n = decoding.max_new_tokens
  if decoding.top_k > config.vocab_size:
    raise ValueError(f"generate: decoding.top_k={decoding.top_k} exceeds the vocab size "
                     f"{config.vocab_size}")
  cache_size = decode_core.check_positions(where, config, p, n, decoding.cache_size)
  if cache_size < p + n - 1:
    raise ValueError(f"generate: cache_size={cache_size} < prompt {p} + max_new_tokens {n} - 1")
  params = layer_list(params)
  logits, cache = _prefill(params, config, prompt_tokens, prompt_lengths,
                           init_cache(config, b, cache_size))
  out, _ = _decode(params, config, cache, logits, key,
                   decoding=dataclasses.replace(decoding, stop_token_ids=stop))
  return out.replace(nfe=out.nfe + 1)
