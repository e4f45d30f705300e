"""Sharding: on the 8 host devices of conftest, a (4, 2) fsdp x tp forward equals one device."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.generate import ARDecoding, generate
from gr2jax.model.params import init_params, layer_list
from gr2jax.model.qwen3 import forward, ragged_prefill
from gr2jax.model.sharding import (
  BATCH_AXES,
  batch_axes,
  global_arrays,
  host_arrays,
  param_shardings,
  param_specs,
)
from gr2jax.train.mesh import batch_sharding, make_mesh

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

CONFIG = ModelConfig.tiny(vocab_size=256)


def shard_params(params, mesh):
  return jax.device_put(params, param_shardings(CONFIG, mesh))


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
  # The decoders' layout: per layer (no L axis), the fused q, k, v sharded over kv heads.
  decoding = param_specs(CONFIG, decoding=True)
  assert decoding["layers"][0]["qkv"] == PartitionSpec("fsdp", "tp", None, None)
  assert decoding["layers"][1]["o"] == PartitionSpec("tp", None, "fsdp")


def test_batch_axes_are_the_meshs():
  """The batch axes a mesh has, in BATCH_AXES order: the training mesh's, a mesh without 'data',
  none on an empty mesh (the model's constraint points then do nothing)."""
  assert batch_axes(make_mesh(fsdp=4, tp=2)) == BATCH_AXES == ("data", "fsdp")
  assert batch_axes(jax.make_mesh((2, 4), ("tp", "fsdp"))) == ("fsdp",)
  assert batch_axes(jax.sharding.get_abstract_mesh()) == ()


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
  tokens_s = jax.device_put(tokens, batch_sharding(mesh))
  rows = NamedSharding(mesh, PartitionSpec(("fsdp", "tp")))  # [B*K, ...]: B on fsdp, K on tp
  cache_s = init_cache(CONFIG, 4, 8)
  cache_s = jax.device_put(cache_s, cache_s.replace(
    k=(rows,) * CONFIG.num_layers, v=(rows,) * CONFIG.num_layers,
    lengths=batch_sharding(mesh)))
  logits, _ = fwd(sharded, CONFIG, tokens_s)
  np.testing.assert_allclose(logits, ref, atol=1e-5)
  _, cache = fwd(sharded, CONFIG, tokens_s, cache=cache_s, update_cache=True)
  np.testing.assert_allclose(np.stack(cache.k), np.stack(ref_cache.k), atol=1e-5)
  assert len(jnp.asarray(logits).sharding.device_set) == 8
  # The decoders' layout, placed by its own shardings: the same cached forward.
  decoding = jax.device_put(layer_list(params), param_shardings(CONFIG, mesh, decoding=True))
  _, cache = fwd(decoding, CONFIG, tokens_s, cache=cache_s, update_cache=True)
  np.testing.assert_allclose(np.stack(cache.k), np.stack(ref_cache.k), atol=1e-5)


def test_sharded_generate_equals_unsharded():
  mesh = make_mesh(fsdp=4, tp=2)
  params = jax.tree.map(lambda x: x * 20, init_params(CONFIG, jax.random.key(0)))  # peaky
  prompts = jax.random.randint(jax.random.key(1), (4, 6), 1, CONFIG.vocab_size)
  lengths = jnp.array([3, 6, 4, 5])
  ref = generate(params, CONFIG, prompts, lengths, ARDecoding(max_new_tokens=5))
  on_batch = lambda x: jax.device_put(x, batch_sharding(mesh))
  out = generate(shard_params(params, mesh), CONFIG, on_batch(prompts), on_batch(lengths),
                 ARDecoding(max_new_tokens=5))
  np.testing.assert_array_equal(out.tokens, ref.tokens)


def test_cache_write_is_split_by_row():
  """The prefill's K/V write on an 8-way batch-sharded mesh (the cache created inside jit, as the
  decoders do): every device handles only its rows. A scatter indexed by (row, slot) pairs made
  XLA's partitioner replicate it, with arrays of all rows on every device (the 8B decoders'
  replicated KV cache, docs/plan_qwen3_8b.md)."""
  rows, prompt, slots = 24, 256, 320  # 24 rows: no param dimension is 24
  mesh = make_mesh(fsdp=8, tp=1)
  batch = batch_sharding(mesh)
  params = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                        jax.eval_shape(lambda: init_params(CONFIG, jax.random.key(0))),
                        param_shardings(CONFIG, mesh))

  def prefill(params, tokens, lengths):
    return ragged_prefill(params, CONFIG, tokens, lengths, init_cache(CONFIG, rows, slots),
                          read_cache=False)

  with jax.set_mesh(mesh):
    hlo = jax.jit(prefill).lower(
      params, jax.ShapeDtypeStruct((rows, prompt), jnp.int32, sharding=batch),
      jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=batch)).compile().as_text()
  k, h = CONFIG.num_kv_heads, CONFIG.head_dim
  assert f"[{rows * k // 8},{h},{slots}]" in hlo and f"[{rows * k // 8},{slots},{h}]" in hlo
  assert f"[{rows * k}," not in hlo  # no buffer of all rows: the cache split by row


def test_global_arrays_and_host_arrays_round_trip():
  mesh = make_mesh(fsdp=4, tp=2)
  batch = batch_sharding(mesh)
  tree = {"tokens": np.arange(24, dtype=np.int32).reshape(8, 3), "lengths": np.arange(8)}
  placed = global_arrays(tree, batch)
  for name, x in placed.items():
    assert isinstance(x, jax.Array) and x.sharding == batch
    assert x.addressable_shards[0].data.shape[0] == 2  # 8 rows over 4 fsdp shards
    np.testing.assert_array_equal(x, tree[name])
  back = host_arrays({**placed, "host": np.ones(3)})
  assert all(isinstance(x, np.ndarray) for x in back.values())
  np.testing.assert_array_equal(back["tokens"], tree["tokens"])
