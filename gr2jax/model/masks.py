"""Attention masks (WORKSPACE.md "Masks and block alignment"): one convention for all stages.

Block alignment is response-relative. Positions before `start` (the prompt) are their own block
(causal, exactly the AR prefill); response position p >= start belongs to block
`start + (p - start) // block_size`. A query sees a key iff the key's block id is <= the query's
and the key is valid. block_size = 1 is the causal mask.
"""

import jax
import jax.numpy as jnp


def block_ids(positions: jax.Array, start: jax.Array, block_size: int, xp=jnp) -> jax.Array:
  """Block id of each position under the response-relative convention: the one definition of
  the block structure (the decoder, CFT, rollouts, replay and the static layout pattern).

  Args:
    positions: [B, T] (or [T]) int positions.
    start: [B] (or scalar) int, the first response position of each example.
    block_size: static block size (1 = causal).
    xp: jnp (traced) or np (a static pattern, gr2jax/diffusion/layout.py).

  Returns:
    [B, T] int32: `positions` where `positions < start`, else `start + (positions - start) //
    block_size`.
  """
  positions = xp.asarray(positions, xp.int32)
  start = xp.asarray(start, xp.int32)
  start = start.reshape(start.shape + (1,) * (positions.ndim - start.ndim))
  rel = positions - start
  return xp.where(rel < 0, positions, start + rel // block_size)


def padding_mask(lengths: jax.Array, size: int) -> jax.Array:
  """[B, size] bool: slot s of example b is valid iff s < lengths[b]."""
  return jnp.arange(size, dtype=jnp.int32)[None, :] < jnp.asarray(lengths, jnp.int32)[:, None]


def make_attention_mask(q_positions: jax.Array, k_positions: jax.Array, k_valid: jax.Array,
                        start: jax.Array, block_size: int) -> jax.Array:
  """The block-causal (causal for block_size 1) attention mask.

  Args:
    q_positions: [B, T] query positions.
    k_positions: [B, S] key positions.
    k_valid: [B, S] bool, False for padding / unwritten cache slots.
    start: [B] (or scalar) first response position (irrelevant when block_size is 1).
    block_size: static block size.

  Returns:
    [B, T, S] bool, True where query t may attend to key s.
  """
  q_blocks = block_ids(q_positions, start, block_size)  # [B, T]
  k_blocks = block_ids(k_positions, start, block_size)  # [B, S]
  return (k_blocks[:, None, :] <= q_blocks[:, :, None]) & jnp.asarray(k_valid, bool)[:, None, :]


def decode_mask(lengths: jax.Array, cache_size: int, q_positions: jax.Array,
                start: jax.Array = 0, block_size: int = 1,
                new_valid: jax.Array | None = None) -> jax.Array:
  """The mask for `forward` with a cache: keys are [cache slots S | the T new tokens].

  Cache slot s holds position s and is valid iff s < lengths[b]; the new tokens sit at
  `q_positions` and are all valid unless `new_valid` says otherwise.

  Args:
    lengths: [B] valid cache slots.
    cache_size: S, the cache's slot count (static).
    q_positions: [B, T] positions of the new tokens.
    start: [B] (or scalar) first response position.
    block_size: static block size (1 = causal).
    new_valid: optional [B, T] bool validity of the new tokens as keys.

  Returns:
    [B, T, S + T] bool.
  """
  q_positions = jnp.asarray(q_positions, jnp.int32)
  b, t = q_positions.shape
  slots = jnp.broadcast_to(jnp.arange(cache_size, dtype=jnp.int32), (b, cache_size))
  k_positions = jnp.concatenate([slots, q_positions], axis=1)
  if new_valid is None:
    new_valid = jnp.ones((b, t), bool)
  k_valid = jnp.concatenate([padding_mask(lengths, cache_size), new_valid], axis=1)
  return make_attention_mask(q_positions, k_positions, k_valid, start, block_size)
