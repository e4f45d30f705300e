"""The pieces every decoder shares: AR (`generate`), block diffusion (diffusion/decode.py) and
draft-and-verify (diffusion/speculative.py) run their loops on these, each written once.

  - `Decoding`: the one settings convention. Every decoder is called as
      decoder(model(s), prompt_tokens [B, P], prompt_lengths [B] | None, decoding, *, key=None)
    with `decoding` its own frozen subclass of Decoding (generate.ARDecoding,
    decode.BlockDecoding, speculative.DraftDecoding): the shared fields (max_new_tokens,
    temperature, stop_token_ids) are named, defaulted and checked here; each subclass adds its
    own. A settings object checks its own fields when it is built; the decoder checks what
    depends on the model, the prompts and the key (`check_call`).
  - `prefill` / `prefill_into`: the prompts' causal prefill into a fresh (given) cache.
  - `padded_width`: a response length rounded up to whole blocks (cache slots, record widths).
  - `write_rows` / `read_rows`: a per-row window of a [B, R] record at per-row offsets.
  - `stop_id_array` / `first_stop`: the stop ids as a traced array; each row's first stop token.
"""

import dataclasses

import jax
import jax.numpy as jnp
from jax import lax

from gr2jax import settings
from gr2jax.model import validate
from gr2jax.model.cache import KVCache, init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.qwen3 import ragged_prefill


def optional_int(*, doc: str, minimum: int):
  """A field holding None (the default) or an int >= minimum (settings.integer's check)."""
  def check(where: str, name: str, value) -> None:
    if value is not None:
      settings.check_int(where, name, value, minimum=minimum)
  return settings.value(None, doc=doc, what=f"None or int >= {minimum}", check=check)


def _stop_ids(where: str, name: str, value) -> None:
  if value is not None:
    validate.token_ids(where, name, value, vocab_size=None)


def keep(decoding: settings.Settings, **values) -> None:
  """Sets a frozen settings block's checked fields to the forms the decoders hold (an int, a
  float, a commit order object): only in a decoder's `check`, so jit's static hashing sees one
  value whatever type it was given in."""
  for name, value in values.items():
    object.__setattr__(decoding, name, value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Decoding(settings.Settings):
  """The settings every decoder shares (module docstring); hashable, static under jit. Each
  subclass's WHERE is its name, which starts its messages (`ARDecoding: top_k=...`); stop ids
  None are the model's config.eos_token_ids (for draft-and-verify, the verifier's)."""

  WHERE = "Decoding"

  max_new_tokens: int = settings.integer(doc="N, the most response tokens per row", minimum=1)
  temperature: float = settings.real(0.0, doc="0 = greedy; > 0 samples at that temperature (the "
                                     "decoder then needs a key)", low=0, note=" (0 = greedy)")
  stop_token_ids: tuple[int, ...] | None = settings.value(
    None, doc="ids that end a row (kept in its length); None = the model's eos ids",
    what="None or token ids >= 0", check=_stop_ids)

  def check(self, where: str) -> None:
    """Keeps N an int, the temperature a float and the stop ids a tuple of ints."""
    keep(self, max_new_tokens=int(self.max_new_tokens), temperature=float(self.temperature))
    if self.stop_token_ids is not None:
      keep(self, stop_token_ids=tuple(int(i) for i in self.stop_token_ids))


def check_call(where: str, decoding: Decoding, kind: type, config: ModelConfig,
               key) -> tuple[tuple[int, ...], jax.Array]:
  """What a decoder checks of its settings before tracing (module docstring).

  Args:
    where: the decoder's name, starting every message.
    decoding: the call's settings.
    kind: the decoder's Decoding subclass.
    config: the model whose vocab the stop ids index (and whose eos ids are the default).
    key: the call's PRNG key or None.

  Returns:
    (the stop ids: decoding's, else config.eos_token_ids, checked to be in the vocab; the key,
    jax.random.key(0) when None and greedy).

  Raises:
    TypeError: decoding is not a `kind`; a key that is not a PRNG key.
    ValueError: a stop id outside the vocab; no key at temperature > 0.
  """
  if not isinstance(decoding, kind):
    raise TypeError(f"{where}: decoding must be of type {kind.__name__}, got "
                    f"{type(decoding).__name__}")
  stop = validate.token_ids(where, "stop_token_ids" if decoding.stop_token_ids is not None
                            else "config.eos_token_ids", config.eos_token_ids
                            if decoding.stop_token_ids is None else decoding.stop_token_ids,
                            config.vocab_size)
  if key is None:
    if decoding.temperature > 0:
      raise ValueError(f"{where}: temperature={decoding.temperature} needs a PRNG key")
    return stop, jax.random.key(0)
  validate.prng_key(where, "key", key)
  return stop, key


def prefill(params: dict, config: ModelConfig, prompt_tokens: jax.Array, prompt_lengths: jax.Array,
            slots: int) -> tuple[jax.Array, KVCache]:
  """The causal prefill of right-padded prompts into a fresh cache (traceable).

  Args:
    params: the decoders' layout (params.layer_list).
    config: the model.
    prompt_tokens: [B, P] int32.
    prompt_lengths: [B] int32 real lengths.
    slots: static cache slots per row (>= P).

  Returns:
    (logits [B, V] f32 at each row's last prompt token, the cache holding the prompts).
  """
  return prefill_into(params, config, prompt_tokens, prompt_lengths,
                      init_cache(config, prompt_tokens.shape[0], slots))


def prefill_into(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
                 prompt_lengths: jax.Array, cache: KVCache) -> tuple[jax.Array, KVCache]:
  """`prefill` into a given empty cache (generate.prefill's, donated): same Args and Returns."""
  return ragged_prefill(params, config, prompt_tokens, prompt_lengths, cache, read_cache=False)


def padded_width(length: int, block_size: int) -> int:
  """ceil(length / block_size) * block_size: a response of `length` tokens in whole blocks."""
  return -(-length // block_size) * block_size


def slots_needed(config: ModelConfig, prompt_width: int, max_new_tokens: int) -> int:
  """P + N in whole blocks of config.block_size: the cache slots (positions) a decode of N new
  tokens after prompts of width P uses by default (AR, block_size 1: P + N)."""
  return prompt_width + padded_width(max_new_tokens, config.block_size)


def most_new_tokens(config: ModelConfig, prompt_width: int) -> int:
  """The largest N whose slots_needed fits config.max_position_embeddings (< 1: none fits)."""
  b = config.block_size
  return (config.max_position_embeddings - prompt_width) // b * b


def check_positions(where: str, config: ModelConfig, prompt_width: int, max_new_tokens: int,
                    cache_size: int | None = None, model: str = "the model") -> int:
  """The cache slots per row of a decode, checked against the model's positions before
  anything is traced (init_cache's own check would name neither the decoder nor N).

  Args:
    where: the decoder's name, starting the message.
    config: the model whose cache it is.
    prompt_width: P.
    max_new_tokens: N.
    cache_size: the decoding's explicit cache_size, or None for slots_needed.
    model: how the message names the model ('the drafter' / 'the verifier' of a pair).

  Returns:
    cache_size, else slots_needed(config, P, N).

  Raises:
    ValueError: more slots than config.max_position_embeddings, naming max_new_tokens and P
      with the largest N that fits (or cache_size, when given).
  """
  m = config.max_position_embeddings
  if cache_size is not None:
    if cache_size > m:
      raise ValueError(f"{where}: cache_size={cache_size} exceeds the {m} positions {model} has "
                       "(max_position_embeddings)")
    return cache_size
  need = slots_needed(config, prompt_width, max_new_tokens)
  if need > m:
    p, n, b = prompt_width, max_new_tokens, config.block_size
    total = (f"{p} + {n}" if n % b == 0 else
             f"{p} + {need - p} ({n} in whole blocks of {b})")
    most = most_new_tokens(config, p)
    fix = (f"max_new_tokens <= {most} fits" if most >= 1 else
           f"prompts of width {p} leave no room")
    raise ValueError(f"{where}: max_new_tokens={n} with prompts of width {p} needs {total} = "
                     f"{need} positions; {model} has {m} (max_position_embeddings): {fix}")
  return need


def write_rows(buf: jax.Array, block: jax.Array, start: jax.Array) -> jax.Array:
  """buf [B, R] with block [B, W] written into row b from start[b] (clamped as
  lax.dynamic_update_slice clamps)."""
  return jax.vmap(lambda r, x, s: lax.dynamic_update_slice(r, x, (s,)))(buf, block, start)


def read_rows(buf: jax.Array, start: jax.Array, size: int) -> jax.Array:
  """buf [B, R] -> [B, size], row b from start[b]."""
  return jax.vmap(lambda r, s: lax.dynamic_slice(r, (s,), (size,)))(buf, start)


def stop_id_array(stop_ids: tuple[int, ...]) -> jax.Array:
  """[S] int32 stop ids for a traced decode; (-1,) (no token) when there are none."""
  return jnp.asarray(stop_ids or (-1,), jnp.int32)


def first_stop(tokens: jax.Array, valid: jax.Array, stop_ids: jax.Array) -> jax.Array:
  """[B] int32 index of each row's first valid stop token in tokens [B, T] (T where none).

  Args:
    tokens: [B, T] int32.
    valid: [B, T] bool, the positions that count (committed / kept).
    stop_ids: [S] int32.
  """
  t = tokens.shape[1]
  is_stop = jnp.isin(tokens, stop_ids) & valid  # [B, T]
  return jnp.min(jnp.where(is_stop, jnp.arange(t, dtype=jnp.int32)[None, :], t), axis=-1)
