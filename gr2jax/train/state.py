"""The train state: step, params, optimiser state, PRNG key (frozen models live outside it).

Shardings are derived without allocating anything: `jax.eval_shape` of the state, params placed by
gr2jax.model.sharding, optimiser leaves by the param they mirror (Adam's mu / nu), the rest
replicated.
"""

import flax
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from gr2jax.model import sharding as model_sharding
from gr2jax.model.config import ModelConfig


@flax.struct.dataclass
class TrainState:
  """Attributes: step int32 []; params the param pytree; opt_state the optax state over fp32
  params; key uint32 [2] raw PRNG key (per-step keys are fold_in(key, step))."""

  step: jax.Array
  params: dict
  opt_state: optax.OptState
  key: jax.Array


def fp32(params):
  """The fp32 view of a param tree (the optimiser's moments live in fp32)."""
  return jax.tree.map(lambda x: x.astype(jnp.float32), params)


def create_state(params: dict, optimizer: optax.GradientTransformation, seed: int) -> TrainState:
  """A fresh state at step 0 around `params`."""
  return TrainState(step=jnp.zeros((), jnp.int32), params=params,
                    opt_state=optimizer.init(fp32(params)),
                    key=jax.random.PRNGKey(seed))


def abstract_state(params_shape: dict, optimizer: optax.GradientTransformation) -> TrainState:
  """The state's ShapeDtypeStructs (nothing allocated)."""
  return jax.eval_shape(lambda p: create_state(p, optimizer, 0), params_shape)


def _key_names(path) -> tuple[str, ...]:
  return tuple(str(p.key) for p in path if isinstance(p, jax.tree_util.DictKey))


def state_shardings(config: ModelConfig, state_shape: TrainState, mesh: Mesh) -> TrainState:
  """NamedShardings of every leaf of a TrainState (shapes from `abstract_state`).

  Args:
    config: the model (its param specs).
    state_shape: the abstract state.
    mesh: the training mesh (gr2jax.train.mesh).

  Returns:
    A TrainState of NamedShardings.
  """
  param_sh = model_sharding.param_shardings(config, mesh)
  by_path = {_key_names(path): (sh, leaf.shape) for (path, sh), leaf in zip(
    jax.tree_util.tree_flatten_with_path(param_sh)[0],
    jax.tree.leaves(state_shape.params), strict=True)}
  replicated = NamedSharding(mesh, PartitionSpec())

  def opt_leaf(path, leaf):
    names = _key_names(path)
    for start in range(len(names)):
      hit = by_path.get(names[start:])
      if hit is not None and hit[1] == leaf.shape:
        return hit[0]
    return replicated

  return TrainState(step=replicated, params=param_sh,
                    opt_state=jax.tree_util.tree_map_with_path(opt_leaf, state_shape.opt_state),
                    key=replicated)
