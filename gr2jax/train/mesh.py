"""The training mesh ('data', 'fsdp', 'tp') and the shardings of the batch.

Params use gr2jax.model.sharding's specs (D over 'fsdp'; heads, MLP and vocab over 'tp'), which are
replicated over 'data'. Batches split their leading axis over ('data', 'fsdp'). Every axis is
AxisType.Auto: propagation places the activations, plus the one constraint point in the forward
(qwen3.shard_activations).
"""

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec

from gr2jax.model.sharding import AXES, BATCH_AXES


def make_mesh(data: int = 1, fsdp: int = -1, tp: int = 1, devices=None) -> Mesh:
  """A ('data', 'fsdp', 'tp') mesh; exactly one axis may be -1 (= the remaining devices).

  Args:
    data: data-parallel replicas.
    fsdp: parameter-sharded data parallelism.
    tp: tensor parallelism.
    devices: default jax.devices() (all processes' devices in a multi-host job).

  Returns:
    The Mesh.
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = [data, fsdp, tp]
  if sizes.count(-1) > 1 or any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"mesh: data={data} fsdp={fsdp} tp={tp}: sizes must be >= 1, one may be -1")
  known = int(np.prod([s for s in sizes if s != -1]))
  if -1 in sizes:
    if len(devices) % known:
      raise ValueError(f"mesh: {known} does not divide the {len(devices)} devices")
    sizes[sizes.index(-1)] = len(devices) // known
  if int(np.prod(sizes)) != len(devices):
    raise ValueError(f"mesh: data x fsdp x tp = {sizes} does not use the {len(devices)} devices")
  return jax.make_mesh(tuple(sizes), AXES, axis_types=(AxisType.Auto,) * 3, devices=devices)


def batch_size_multiple(mesh: Mesh) -> int:
  """The batch size must be a multiple of this (the product of the batch axes)."""
  return int(np.prod([mesh.shape[a] for a in BATCH_AXES]))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """Leading (batch) axis over ('data', 'fsdp'), the rest replicated; a prefix for every leaf."""
  return NamedSharding(mesh, PartitionSpec(BATCH_AXES))
