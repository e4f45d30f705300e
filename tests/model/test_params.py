"""Param pytree: layout, init, abstract shapes without allocation, counts."""

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.model.config import ModelConfig
from gr2jax.model.params import (
  abstract_decoding_params,
  abstract_params,
  init_params,
  layer_list,
  param_count,
)
from tests.model.test_config import QWEN3_8B_JSON


def test_layout_and_init():
  config = ModelConfig.tiny()
  params = init_params(config, jax.random.key(0))
  assert params["embed"].shape == (4096, 128)
  assert params["layers"]["q"].shape == (2, 128, 4, 32)
  assert params["layers"]["k"].shape == (2, 128, 2, 32)
  assert params["layers"]["o"].shape == (2, 4, 32, 128)
  assert params["lm_head"].shape == (128, 4096)
  np.testing.assert_array_equal(params["layers"]["q_norm"], 1.0)
  np.testing.assert_array_equal(params["final_norm"], 1.0)
  assert abs(float(jnp.std(params["layers"]["gate"])) - 0.02) < 1e-3
  # Distinct params get distinct draws.
  assert not np.allclose(params["layers"]["gate"], params["layers"]["up"])


def test_decoding_layout_fuses_qkv_grouped_by_kv_head():
  """layer_list: one dict per layer; query head n at qkv[:, n // G, n % G], kv head j's key and
  value at qkv[:, j, G] and qkv[:, j, G + 1] (the grouping of the attention); the rest as is."""
  config = ModelConfig.tiny()
  params = init_params(config, jax.random.key(0))
  layers = layer_list(params)["layers"]
  assert isinstance(layers, tuple) and len(layers) == config.num_layers
  g = config.num_heads // config.num_kv_heads
  for i, layer in enumerate(layers):
    assert set(layer) == set(params["layers"]) - {"q", "k", "v"} | {"qkv"}
    assert layer["qkv"].shape == (128, config.num_kv_heads, g + 2, 32)
    for n in range(config.num_heads):
      np.testing.assert_array_equal(layer["qkv"][:, n // g, n % g], params["layers"]["q"][i, :, n])
    np.testing.assert_array_equal(layer["qkv"][:, :, g], params["layers"]["k"][i])
    np.testing.assert_array_equal(layer["qkv"][:, :, g + 1], params["layers"]["v"][i])
    np.testing.assert_array_equal(layer["o"], params["layers"]["o"][i])
  converted = layer_list(params)
  assert layer_list(converted) is converted  # a no-op once converted
  assert jax.tree.map(lambda x: x.shape, abstract_decoding_params(config)) == jax.tree.map(
    lambda x: x.shape, converted)


def test_tied_has_no_lm_head_and_dtype():
  params = init_params(ModelConfig.tiny(tie_word_embeddings=True, param_dtype="bfloat16"),
                       jax.random.key(0))
  assert "lm_head" not in params
  assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(params))


def test_abstract_matches_init():
  config = ModelConfig.tiny()
  concrete = jax.tree.map(lambda x: (x.shape, x.dtype), init_params(config, jax.random.key(1)))
  abstract = jax.tree.map(lambda x: (x.shape, x.dtype), abstract_params(config))
  assert concrete == abstract


def test_qwen3_8b_abstract_allocates_nothing():
  config = ModelConfig.from_hf_dict(QWEN3_8B_JSON, param_dtype="bfloat16")
  before = sum(x.nbytes for x in jax.live_arrays())
  tree = abstract_params(config)
  assert all(isinstance(x, jax.ShapeDtypeStruct) for x in jax.tree.leaves(tree))
  assert sum(x.nbytes for x in jax.live_arrays()) - before < 1 << 20
  assert param_count(config) == 8_190_735_360


def test_counts():
  assert param_count(ModelConfig.tiny()) == 1_442_560
  assert param_count(ModelConfig.small()) == 5_245_696
  assert param_count(ModelConfig.qwen3_0_6b()) == 596_049_920
