"""The static-shape KV cache (WORKSPACE.md "KV cache").

Slot s of example b holds position s: prompts are right-padded and start at slot 0; `lengths[b]`
counts the valid slots. `gr2jax.model.qwen3.forward(..., update_cache=True)` writes the T new
keys and values at slots `lengths + arange(T)` and advances `lengths`; nothing here
depends on data shapes, so one compile serves a (batch, max_len, query_len) shape.

Layout: one buffer per layer (not one [L, B, S, K, H] stack), keys [B*K, H, S] and values
[B*K, S, H] (row b*K + k is row b's kv head k), so a decode step reads each layer's cache in place
and writes it in place. Each choice removes a per-step copy found in the compiled AR step on XLA
CPU (docs/results/memory_limit.md): a stack sliced per layer is a copy per layer per step; in
these layouts the attention scores `q . k` (contracting H) and the value sum `p . v`
(contracting S) are dots in canonical form (one batch dim, the contraction between the two matrix
dims), where [B, S, K, H] made XLA transpose the keys every step; and with one batch dim the
donated buffer is updated in place, where 4-d [B, K, ., .] buffers were copied twice per step.
Sharding: rows are B-major, so PartitionSpec(('data', 'tp')) splits B over 'data', K over 'tp'.
"""

import flax.struct
import jax
import jax.numpy as jnp

from gr2jax.model.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  """Per-layer keys and values of the tokens seen so far.

  Attributes:
    k: L arrays [B*K, H, S], the keys (after q/k-norm and RoPE) of each layer, compute dtype.
    v: L arrays [B*K, S, H], the values.
    lengths: [B] int32, valid slots per example (slots >= lengths are ignored).
  """

  k: tuple[jax.Array, ...]
  v: tuple[jax.Array, ...]
  lengths: jax.Array

  @property
  def max_len(self) -> int:
    """S, the number of slots."""
    return self.v[0].shape[1]

  @property
  def batch(self) -> int:
    return self.lengths.shape[0]


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
  k, h = config.num_kv_heads, config.head_dim
  dtype = jnp.dtype(config.compute_dtype)
  zeros = lambda shape: tuple(jnp.zeros(shape, dtype) for _ in range(config.num_layers))
  return KVCache(k=zeros((batch * k, h, max_len)), v=zeros((batch * k, max_len, h)),
                 lengths=jnp.zeros((batch,), jnp.int32))
