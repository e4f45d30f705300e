"""The static-shape KV cache (WORKSPACE.md "KV cache").

Slot s of example b holds position s: prompts are right-padded and start at slot 0; `lengths[b]`
counts the valid slots. `gr2jax.model.qwen3.forward(..., update_cache=True)` writes the T new
keys and values at slots `lengths + arange(T)` and advances `lengths`; nothing here
depends on data shapes, so one compile serves a (batch, max_len, query_len) shape.
"""

import flax.struct
import jax
import jax.numpy as jnp

from gr2jax.model.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values of the tokens seen so far.

  Attributes:
    k: [L, B, S, K, H] keys (after q/k-norm and RoPE), in the compute dtype.
    v: [L, B, S, K, H] values, in the compute dtype.
    lengths: [B] int32, valid slots per example (slots >= lengths are ignored).
  """

  k: jax.Array
  v: jax.Array
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """S, the number of slots."""
    return self.k.shape[2]

  @property
  def batch(self) -> int:
    return self.k.shape[1]


def init_cache(config: ModelConfig, batch: int, max_len: int) -> KVCache:
  """An empty cache (zeros, lengths 0).

  Args:
    config: the model (L, K, H and the compute dtype).
    batch: B.
    max_len: S, slots per example; at most `config.max_position_embeddings`.

  Returns:
    The KVCache.
  """
  if not 0 < max_len <= config.max_position_embeddings:
    raise ValueError(f"init_cache: max_len={max_len} must be in [1, max_position_embeddings="
                     f"{config.max_position_embeddings}]")
  shape = (config.num_layers, batch, max_len, config.num_kv_heads, config.head_dim)
  dtype = jnp.dtype(config.compute_dtype)
  return KVCache(k=jnp.zeros(shape, dtype), v=jnp.zeros(shape, dtype),
                 lengths=jnp.zeros((batch,), jnp.int32))
