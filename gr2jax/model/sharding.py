"""The mesh axes, and the PartitionSpecs of the param tree on a mesh with 'fsdp' and 'tp' axes.

The axes ('data', 'fsdp', 'tp') are named here, once, for the model's constraint and shard_map
points and for the training mesh (train/mesh.py); a batch splits over BATCH_AXES.

FSDP shards the hidden axis D of every matrix; TP shards the vocab, the heads and the MLP width F
(Megatron-style). Norm scales are replicated. Axes are `AxisType.Auto`: XLA's sharding propagation
places the activations, so the forward needs no annotations and runs unchanged on one device.
A dimension that the mesh axis does not divide is replicated instead (e.g. a vocab grown by added
tokens), which changes only the layout, never the result.
Host <-> global arrays (`global_arrays`, `host_arrays`) are the one placement of batches and
read-back of results for single- and multi-process runs.
"""

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_decoding_params, abstract_params

DATA, FSDP, TP = "data", "fsdp", "tp"
AXES = (DATA, FSDP, TP)
BATCH_AXES = (DATA, FSDP)

# Param name -> mesh axis per dimension (shapes as in WORKSPACE.md; layer params lead with L).
_SPECS = {
    "embed": (TP, FSDP),  # [V, D]
    "lm_head": (FSDP, TP),  # [D, V]
    "final_norm": (None,),  # [D]
    "input_norm": (None, None), "post_attn_norm": (None, None),  # [L, D]
    "q_norm": (None, None), "k_norm": (None, None),  # [L, H]
    "q": (None, FSDP, TP, None), "k": (None, FSDP, TP, None),  # [L, D, N|K, H]
    "v": (None, FSDP, TP, None),
  "qkv": (None, FSDP, TP, None, None),  # [L, D, K, G + 2, H] (the decoders' fused q, k, v)
    "o": (None, TP, None, FSDP),  # [L, N, H, D]
    "gate": (None, FSDP, TP), "up": (None, FSDP, TP),  # [L, D, F]
    "down": (None, TP, FSDP),  # [L, F, D]
}


def _spec(path: tuple, shape: tuple, mesh: Mesh | None = None) -> PartitionSpec:
  """The spec of the param at `path`; with a mesh, axes that do not divide a dim are dropped.
  A layer of the decoders' layout (a tuple index in the path: params.layer_list) has no L axis."""
  name = path[-1].key
  axes = _SPECS.get(name)
  if axes and any(isinstance(k, jax.tree_util.SequenceKey) for k in path):
    axes = axes[1:]
  if axes is None or len(axes) != len(shape):
    raise ValueError(f"sharding: no spec for param {jax.tree_util.keystr(path)} of shape {shape}")
  if mesh is not None:
    axes = tuple(a if a is None or dim % mesh.shape[a] == 0 else None
                 for a, dim in zip(axes, shape, strict=True))
  return PartitionSpec(*axes)


def param_specs(config: ModelConfig, mesh: Mesh | None = None, *, decoding: bool = False) -> dict:
  """The param tree of PartitionSpecs (fitted to `mesh`'s axis sizes when given); `decoding`:
  of the decoders' layout (params.layer_list) instead of the stored one."""
  abstract = abstract_decoding_params(config) if decoding else abstract_params(config)
  return jax.tree_util.tree_map_with_path(lambda p, x: _spec(p, x.shape, mesh), abstract)


def param_shardings(config: ModelConfig, mesh: Mesh, *, decoding: bool = False) -> dict:
  """The param tree of NamedShardings on `mesh` (e.g. for a sharded orbax restore)."""
  return jax.tree.map(lambda s: NamedSharding(mesh, s),
                      param_specs(config, mesh, decoding=decoding),
                      is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_axes(mesh) -> tuple[str, ...]:
  """The BATCH_AXES that `mesh` (a Mesh or an AbstractMesh, e.g. the one in context) has, in
  order; () for an empty mesh."""
  names = () if mesh.empty else mesh.axis_names
  return tuple(a for a in BATCH_AXES if a in names)


def global_arrays(tree, sharding: jax.sharding.Sharding):
  """Host arrays -> global jax.Arrays with `sharding`, each process filling only its own shards.

  Every process passes the same host values (e.g. the same seeded batch); a process copies to its
  devices only the slices its shards hold (`jax.make_array_from_callback`), so this is the one
  placement that works in single- and multi-process runs alike (jit refuses numpy inputs with a
  sharding that spans other processes' devices).

  Args:
    tree: a pytree of host arrays (numpy or array-likes).
    sharding: the sharding of every leaf (e.g. train/mesh.py batch_sharding: a leading-axis
      spec, a prefix for any rank).

  Returns:
    The same tree of global jax.Arrays.
  """
  def place(x):
    x = np.asarray(x)
    return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])

  return jax.tree.map(place, tree)


def host_arrays(tree):
  """jax.Arrays -> numpy, whole (the global value) in every process.

  An array spanning other processes' devices is gathered (`multihost_utils.process_allgather`,
  a collective: every process must call this with the same tree); a fully addressable one (any
  array of a single-process run) is copied as is.
  """
  def fetch(x):
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
      return multihost_utils.process_allgather(x, tiled=True)
    return np.asarray(x)

  return jax.tree.map(fetch, tree)
