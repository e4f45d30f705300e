"""The pieces every decoder shares: AR (`generate`), block diffusion (diffusion/decode.py) and
draft-and-verify (diffusion/speculative.py) run their loops on these, each written once.

  - `prefill` / `prefill_into`: the prompts' causal prefill into a fresh (given) cache.
  - `padded_width`: a response length rounded up to whole blocks (cache slots, record widths).
  - `write_rows` / `read_rows`: a per-row window of a [B, R] record at per-row offsets.
  - `stop_id_array` / `first_stop`: the stop ids as a traced array; each row's first stop token.
  - `check_sampling`: a decode's temperature and key, checked before tracing.
"""

import jax
import jax.numpy as jnp
from jax import lax

from gr2jax.model import validate
from gr2jax.model.cache import KVCache, init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.qwen3 import ragged_prefill


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


def check_sampling(where: str, temperature, key) -> tuple[float, jax.Array]:
  """A decode's temperature and key, checked before tracing.

  Returns:
    (temperature as a float >= 0, the key; jax.random.key(0) when None and greedy).

  Raises:
    TypeError / ValueError starting with `where`: a negative or non-finite temperature, no key
      at temperature > 0, a key that is not a PRNG key.
  """
  temperature = validate.real(where, "temperature", temperature, low=0, note=" (0 = greedy)")
  if key is None:
    if temperature > 0:
      raise ValueError(f"{where}: temperature={temperature} needs a PRNG key")
    return temperature, jax.random.key(0)
  validate.prng_key(where, "key", key)
  return temperature, key
