"""Sharding: on the 8 host devices of conftest, a (4, 2) fsdp x tp forward equals one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.generate import generate
from gr2jax.model.params import init_params
from gr2jax.model.qwen3 import forward
from gr2jax.model.sharding import (
  cache_spec,
  data_spec,
  make_mesh,
  param_shardings,
  param_specs,
  shard_params,
)

CONFIG = ModelConfig.tiny(vocab_size=256)


def test_make_mesh():
  mesh = make_mesh(fsdp=-1, tp=2)
  assert dict(mesh.shape) == {"fsdp": 4, "tp": 2}
  with pytest.raises(ValueError, match="tp=3"):
    make_mesh(tp=3)
  with pytest.raises(ValueError, match="fsdp=3"):
    make_mesh(fsdp=3, tp=2)


def test_specs_match_the_param_tree():
  specs = param_specs(CONFIG)
  assert specs["layers"]["q"] == PartitionSpec(None, "fsdp", "tp", None)
  assert specs["embed"] == PartitionSpec("tp", "fsdp")
  assert specs["final_norm"] == PartitionSpec(None)
  params = init_params(CONFIG, jax.random.key(0))
  assert jax.tree.structure(params) == jax.tree.structure(
      specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
  # A vocab the tp axis does not divide is replicated on that dimension only.
  odd = param_specs(dataclasses.replace(CONFIG, vocab_size=257), make_mesh(tp=2))
  assert odd["embed"] == PartitionSpec(None, "fsdp")


def test_sharded_forward_equals_unsharded():
  mesh = make_mesh(fsdp=4, tp=2)
  params = init_params(CONFIG, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (4, 8), 0, CONFIG.vocab_size)
  fwd = jax.jit(forward, static_argnums=1, static_argnames="update_cache")
  ref, _ = fwd(params, CONFIG, tokens)
  ref_cache = fwd(params, CONFIG, tokens, cache=init_cache(CONFIG, 4, 8), update_cache=True)[1]

  sharded = shard_params(params, mesh)
  assert sharded["layers"]["gate"].sharding.spec == PartitionSpec(None, "fsdp", "tp")
  assert jax.tree.map(lambda x: x.sharding, sharded) == param_shardings(CONFIG, mesh)
  tokens_s = jax.device_put(tokens, NamedSharding(mesh, data_spec()))
  cache_s = jax.device_put(init_cache(CONFIG, 4, 8), jax.tree.map(
      lambda s: NamedSharding(mesh, s), cache_spec(),
      is_leaf=lambda x: isinstance(x, PartitionSpec)))
  logits, _ = fwd(sharded, CONFIG, tokens_s)
  np.testing.assert_allclose(logits, ref, atol=1e-5)
  _, cache = fwd(sharded, CONFIG, tokens_s, cache=cache_s, update_cache=True)
  np.testing.assert_allclose(cache.k, ref_cache.k, atol=1e-5)
  assert len(jnp.asarray(logits).sharding.device_set) == 8


def test_sharded_generate_equals_unsharded():
  mesh = make_mesh(fsdp=4, tp=2)
  params = jax.tree.map(lambda x: x * 20, init_params(CONFIG, jax.random.key(0)))  # peaky
  prompts = jax.random.randint(jax.random.key(1), (4, 6), 1, CONFIG.vocab_size)
  lengths = jnp.array([3, 6, 4, 5])
  ref = generate(params, CONFIG, prompts, lengths, max_new_tokens=5)
  on_batch = lambda x: jax.device_put(x, NamedSharding(mesh, data_spec()))
  out = generate(shard_params(params, mesh), CONFIG, on_batch(prompts), on_batch(lengths),
                 max_new_tokens=5)
  np.testing.assert_array_equal(out.tokens, ref.tokens)
