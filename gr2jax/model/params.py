"""The param pytree (WORKSPACE.md "Param pytree"): init, abstract shapes, counts.

Letters: V vocab, D hidden, L layers, N query heads, K kv heads, H head_dim, F MLP width. Layer
params are stacked on a leading L axis so the forward scans over layers (training, the stored and
converted layout). Decoders take them as a tuple of L per-layer dicts instead, q, k and v fused
(`layer_list`).
"""

import math

import jax
import jax.numpy as jnp

from gr2jax.model.config import ModelConfig

INIT_STD = 0.02  # normal(0, 0.02) for every matrix, as HF's Qwen3 `initializer_range`


def param_shapes(config: ModelConfig) -> dict:
  """The shape of every param, as the same nested dict as the params.

  Args:
    config: the model.

  Returns:
    {'embed': (V, D), 'layers': {...: (L, ...)}, 'final_norm': (D,), ['lm_head': (D, V)]}.
  """
  c = config
  v, d, l, n, k, h, f = (c.vocab_size, c.hidden_size, c.num_layers, c.num_heads, c.num_kv_heads,
                         c.head_dim, c.intermediate_size)
  shapes = {
      "embed": (v, d),
      "layers": {
          "input_norm": (l, d), "q": (l, d, n, h), "k": (l, d, k, h), "v": (l, d, k, h),
          "o": (l, n, h, d), "q_norm": (l, h), "k_norm": (l, h), "post_attn_norm": (l, d),
          "gate": (l, d, f), "up": (l, d, f), "down": (l, f, d),
      },
      "final_norm": (d,),
  }
  if not c.tie_word_embeddings:
    shapes["lm_head"] = (d, v)
  return shapes


def layer_list(params: dict) -> dict:
  """The params in the decoders' layout: 'layers' as a tuple of L per-layer dicts (no leading L
  axis), each layer's q, k and v fused into one 'qkv' weight (`fuse_qkv`). A no-op when 'layers'
  is already a tuple.

  Why: a decode step is bound by reading the weights once. A scan over the stacked layers slices
  each layer's weights out of the [L, ...] buffers on every step, a copy per layer, and slices
  taken inside the jitted decode loop are copies too (measured on XLA CPU, a 28-layer stack of
  [1024, 3072] matmuls at batch 1: ~0.6 of the copy rate as a scan, ~0.5 with the layers sliced
  inside the jit, ~1.0 with each layer its own argument buffer). Separate q, k and v buffers are
  merged by XLA GPU's dot-merger into one GEMM by concatenating the three weights, on every step
  (docs/results/memory_limit.md); fused once here, the step reads one weight in place. Called
  outside jit (one jitted copy of the layer weights) by the decoders' entry points; callers that
  decode many batches convert once (decoding/policy `decoding_params`) and pass the result.

  Args:
    params: the param pytree (stacked or already per layer).

  Returns:
    The same pytree with 'layers': ({name: [...] without L, 'qkv' for q, k, v}, ...) of length L.
  """
  if isinstance(params["layers"], tuple):
    return params
  return {**params, "layers": _unstack(params["layers"])}


def fuse_qkv(layer: dict) -> dict:
  """One layer's q [D, N, H], k and v [D, K, H] as one 'qkv' [D, K, G + 2, H] (G = N / K).

  Kv head j's slot holds its G query heads (query head j * G + g: the grouping of the attention),
  then its key, then its value. Sharded over K on 'tp' (model/sharding), every shard holds its own
  heads' q, k and v, so the split after the GEMM needs no communication.
  """
  rest = {name: x for name, x in layer.items() if name not in ("q", "k", "v")}
  d, n, h = layer["q"].shape
  k = layer["k"].shape[1]
  q = layer["q"].reshape(d, k, n // k, h)
  return {**rest, "qkv": jnp.concatenate([q, layer["k"][:, :, None], layer["v"][:, :, None]],
                                         axis=2)}


@jax.jit
def _unstack(layers: dict) -> tuple[dict, ...]:
  num_layers = jax.tree.leaves(layers)[0].shape[0]
  return tuple(fuse_qkv(jax.tree.map(lambda x, i=i: x[i], layers)) for i in range(num_layers))


def _is_norm(path: tuple) -> bool:
  return path[-1].key.endswith("norm")


def init_params(config: ModelConfig, key: jax.Array) -> dict:
  """Random params: normal(0, INIT_STD) matrices, ones for every RMSNorm scale.

  Args:
    config: the model; params are stored in `config.param_dtype`.
    key: a PRNG key; each param gets its own fold of it (in tree order).

  Returns:
    The param pytree (WORKSPACE.md).
  """
  dtype = jnp.dtype(config.param_dtype)
  shapes = param_shapes(config)
  paths = jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: isinstance(x, tuple))[0]
  leaves = []
  for i, (path, shape) in enumerate(paths):
    if _is_norm(path):
      leaves.append(jnp.ones(shape, dtype))
    else:
      leaves.append((INIT_STD * jax.random.normal(jax.random.fold_in(key, i), shape)).astype(dtype))
  treedef = jax.tree.structure(shapes, is_leaf=lambda x: isinstance(x, tuple))
  return jax.tree.unflatten(treedef, leaves)


def abstract_params(config: ModelConfig) -> dict:
  """The param pytree as `jax.ShapeDtypeStruct`s, via `jax.eval_shape` (allocates nothing).

  Args:
    config: the model.

  Returns:
    The param pytree with ShapeDtypeStruct leaves.
  """
  return jax.eval_shape(lambda: init_params(config, jax.random.key(0)))


def abstract_decoding_params(config: ModelConfig) -> dict:
  """The params in the decoders' layout (`layer_list`) as `jax.ShapeDtypeStruct`s."""
  return jax.eval_shape(layer_list, abstract_params(config))


def param_count(config: ModelConfig) -> int:
  """Number of scalar params (the LM head counted only when untied)."""
  return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(config)))
