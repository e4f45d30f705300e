"""KVCache: static shapes, dtype, pytree behaviour, size check."""

import jax
import jax.numpy as jnp
import pytest

from gr2jax.model.cache import KVCache, init_cache
from gr2jax.model.config import ModelConfig


def test_init_cache():
  cache = init_cache(ModelConfig.tiny(compute_dtype="bfloat16"), batch=3, max_len=10)
  assert len(cache.k) == len(cache.v) == 2  # one buffer per layer: [B*K, H, S], [B*K, S, H]
  assert {x.shape for x in cache.k} == {(6, 32, 10)} and {x.shape for x in cache.v} == {(6, 10, 32)}
  assert cache.batch == 3 and cache.max_len == 10
  assert {x.dtype for x in cache.k + cache.v} == {jnp.dtype(jnp.bfloat16)}
  assert cache.lengths.dtype == jnp.int32 and cache.lengths.shape == (3,)
  assert (cache.max_len, cache.batch) == (10, 3)


def test_is_a_pytree():
  cache = init_cache(ModelConfig.tiny(), batch=1, max_len=4)
  leaves, treedef = jax.tree.flatten(cache)
  assert len(leaves) == 2 * 2 + 1  # k and v of the 2 layers, lengths
  again = jax.tree.unflatten(treedef, leaves)
  assert isinstance(again, KVCache)
  bumped = jax.jit(lambda c: c.replace(lengths=c.lengths + 1))(cache)
  assert int(bumped.lengths[0]) == 1


def test_max_len_bounded():
  with pytest.raises(ValueError, match="max_position_embeddings"):
    init_cache(ModelConfig.tiny(max_position_embeddings=8), batch=1, max_len=9)
