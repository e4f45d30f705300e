"""The one train-step factory every stage uses (SFT, AR RL, CFT, OPD, diffusion RL).

A stage supplies a loss with the contract

  loss_fn(params, batch, key) -> (loss_sum f32[], weight f32[], aux {name: f32[] sum})

on a `Batch` (gr2jax/data/batches.py), as a `Loss`: the function and the Batch fields it reads
(the loop places only those on the device). The step sums loss_sum, weight, aux and the gradient
of loss_sum over micro-batches (a lax.scan), then divides once: loss = sum / weight, grad =
d(sum) / weight. With global arrays under jit the sums already span every device and host, so
micro-batching and multi-host runs normalise exactly like one big batch. Randomness is
fold_in(state.key, state.step) (then the micro-batch index), so a resumed run draws the same
masks and samples.
"""

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from einops import rearrange

from gr2jax.data.batches import Batch
from gr2jax.train.state import TrainState, fp32

LossFn = Callable[[dict, Batch, jax.Array], tuple[jax.Array, jax.Array, dict]]


@dataclasses.dataclass(frozen=True)
class Loss:
  """A stage's loss and the Batch fields it reads.

  Calling it runs `fn` on `batch.select(fields)`, so a loss never sees a field it does not
  declare, and `fields` is exactly what the loop places on the device.

  Attributes:
    fn: the loss (module docstring).
    fields: the names of the Batch fields fn reads.
  """

  fn: LossFn
  fields: tuple[str, ...]

  def __call__(self, params: dict, batch: Batch, key: jax.Array):
    return self.fn(params, batch.select(self.fields), key)


def split_micro_batches(batch: Batch, num: int) -> Batch:
  """[B, ...] leaves -> [B / num, num, ...], a reshape (no copy); micro-batch m = `[:, m]` holds
  rows m, m + num, ... (so every device's rows split evenly when B is sharded). Taking m inside
  the scan keeps the batch in place: a [num, B / num, ...] transpose copied every leaf (the whole
  of OPD's teacher log-probs at 8B)."""
  def split(x):
    if x.shape[0] % num:
      raise ValueError(f"batch of {x.shape[0]} rows does not split into {num} micro-batches")
    return rearrange(x, "(b m) ... -> b m ...", m=num)
  return jax.tree.map(split, batch)


def micro_batch(parts: Batch, m: jax.Array) -> Batch:
  """Micro-batch m ([B / num, ...] leaves) of split_micro_batches' [B / num, num, ...] leaves."""
  return jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, m, axis=1, keepdims=False),
                      parts)


def accumulate(loss_fn: LossFn, params: dict, batch: Batch, key: jax.Array, micro_batches: int,
               *, grads: bool = True):
  """Sums (loss_sum, weight, aux, grad of loss_sum) over micro-batches.

  Args:
    loss_fn: the stage's loss (module docstring).
    params: the params to differentiate.
    batch: the step's batch, leaves [B, ...].
    key: the step's PRNG key (micro-batch m uses fold_in(key, m)).
    micro_batches: M, dividing B.
    grads: False: the loss alone, no gradient (the held-out probe, train/probe.py).

  Returns:
    (loss_sum, weight, aux, grads in fp32), all summed, nothing normalised; without grads
    (loss_sum, weight, aux).
  """
  def one(mb, m):
    def f(p):
      total, weight, aux = loss_fn(p, mb, jax.random.fold_in(key, m))
      return total, (weight, aux)
    if not grads:
      total, (weight, aux) = f(params)
      return total, weight, aux
    (total, (weight, aux)), g = jax.value_and_grad(f, has_aux=True)(params)
    return total, weight, aux, fp32(g)  # summed in fp32 (bf16 sums lose precision)

  if micro_batches == 1:
    return one(batch, 0)
  parts = split_micro_batches(batch, micro_batches)
  first = jax.eval_shape(one, micro_batch(parts, jnp.int32(0)), 0)
  zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), first)

  def body(acc, m):
    return jax.tree.map(jnp.add, acc, one(micro_batch(parts, m), m)), None

  acc, _ = jax.lax.scan(body, zeros, jnp.arange(micro_batches))
  return acc


def apply_gradients(state: TrainState, grads: dict, optimizer: optax.GradientTransformation):
  """One optimiser update (fp32 grads) on the fp32 view of the params; params keep their dtype."""
  params32 = fp32(state.params)
  updates, opt_state = optimizer.update(grads, state.opt_state, params32)
  params = jax.tree.map(lambda p, p32, u: (p32 + u).astype(p.dtype), state.params, params32,
                        updates)
  return state.replace(step=state.step + 1, params=params, opt_state=opt_state)


def train_step(state: TrainState, batch: Batch, *, loss_fn: LossFn,
               optimizer: optax.GradientTransformation, micro_batches: int = 1):
  """One update (un-jitted; `make_train_step` jits it).

  Returns:
    (new state, metrics {'loss', 'weight', 'grad_norm', 'learning_rate'?, aux / weight}).
  """
  key = jax.random.fold_in(state.key, state.step)
  total, weight, aux, grads = accumulate(loss_fn, state.params, batch, key, micro_batches)
  denom = jnp.maximum(weight, 1e-8)
  grads = jax.tree.map(lambda g: g / denom.astype(g.dtype), grads)
  new_state = apply_gradients(state, grads, optimizer)
  metrics = {"loss": total / denom, "weight": weight, "grad_norm": optax.tree.norm(grads),
             **{k: v / denom for k, v in aux.items()}}
  return new_state, metrics


def make_train_step(loss_fn: LossFn, optimizer: optax.GradientTransformation, *,
                    micro_batches: int = 1, state_shardings=None, batch_sharding=None):
  """The jitted step `(state, batch) -> (state, metrics)`, state donated.

  Args:
    loss_fn: the stage's loss (module docstring).
    optimizer: from gr2jax.train.optim.make_optimizer.
    micro_batches: gradient-accumulation micro-batches per step.
    state_shardings: a TrainState of NamedShardings (state.state_shardings) or None.
    batch_sharding: a sharding (prefix) for every batch leaf (mesh.batch_sharding) or None.

  Returns:
    The jitted step.
  """
  def step(state, batch):
    return train_step(state, batch, loss_fn=loss_fn, optimizer=optimizer,
                      micro_batches=micro_batches)

  kwargs = {}
  if state_shardings is not None:
    kwargs = dict(in_shardings=(state_shardings, batch_sharding),
                  out_shardings=(state_shardings, None))
  return jax.jit(step, donate_argnums=0, **kwargs)
