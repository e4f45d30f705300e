"""The train-step factory: 8-device fsdp x tp == 1 device; micro-batches 4 x 2 == one batch of 8."""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from gr2jax.data.batches import Batch
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params, init_params
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import optim, sft
from gr2jax.train import state as state_lib
from gr2jax.train import step as step_lib
from tests.train.toy import toy_config

CONFIG = dataclasses.replace(ModelConfig.tiny(vocab_size=64), attention_chunk_bytes=8 << 20)


def _batch(seed=0, b=8, t=16, p=4):
  """Random rows: a p-token prompt, then t - p response tokens with random weights."""
  rng = np.random.default_rng(seed)
  tokens = rng.integers(0, 64, (b, t)).astype(np.int32)
  weights = rng.choice([0.0, 0.5, 1.0], size=(b, t - p)).astype(np.float32)
  return Batch(prompt_tokens=tokens[:, :p], prompt_lengths=np.full((b,), p, np.int32),
               example_mask=np.ones((b,), bool), response_tokens=tokens[:, p:],
               response_lengths=np.full((b,), t - p, np.int32), response_weights=weights)


def _run(mesh, micro_batches=1, steps=2):
  optimizer = optim.make_optimizer(toy_config().optimizer)
  abstract = state_lib.abstract_state(abstract_params(CONFIG), optimizer)
  shardings = state_lib.state_shardings(CONFIG, abstract, mesh)
  params = jax.device_put(init_params(CONFIG, jax.random.key(0)), shardings.params)
  state = jax.jit(lambda p: state_lib.create_state(p, optimizer, 0), out_shardings=shardings)(
    params)
  loss_fn = functools.partial(sft.sft_loss, config=CONFIG)
  with jax.set_mesh(mesh):
    train_step = step_lib.make_train_step(loss_fn, optimizer, micro_batches=micro_batches,
                                          state_shardings=shardings,
                                          batch_sharding=mesh_lib.batch_sharding(mesh))
    losses = []
    for i in range(steps):
      state, metrics = train_step(state, _batch(i))
      losses.append(float(metrics["loss"]))
  return losses, jax.device_get(state.params), state


@pytest.fixture(scope="module")
def single():
  return _run(mesh_lib.make_mesh(fsdp=1, devices=jax.devices()[:1]))


@pytest.mark.integration
def test_sharded_step_equals_single_device(single):
  mesh = mesh_lib.make_mesh(data=1, fsdp=4, tp=2)
  losses, params, state = _run(mesh)
  assert state.params["layers"]["q"].sharding.spec[1] == "fsdp"
  np.testing.assert_allclose(losses, single[0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, single[1])


def test_micro_batches_equal_one_batch(single):
  losses, params, _ = _run(mesh_lib.make_mesh(fsdp=1, devices=jax.devices()[:1]),
                           micro_batches=4)
  np.testing.assert_allclose(losses, single[0], rtol=1e-5)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-5), params, single[1])


def test_state_shardings_place_adam_moments_like_params():
  mesh = mesh_lib.make_mesh(data=2, fsdp=2, tp=2)
  optimizer = optim.make_optimizer(toy_config().optimizer)
  abstract = state_lib.abstract_state(abstract_params(CONFIG), optimizer)
  sh = state_lib.state_shardings(CONFIG, abstract, mesh)
  adam = sh.opt_state[1][0]  # chain(clip, adamw) -> adamw = chain(scale_by_adam, ...)
  assert adam.mu["layers"]["up"] == sh.params["layers"]["up"]
  assert adam.nu["embed"] == sh.params["embed"]


def test_mesh_sizes_are_checked():
  with pytest.raises(ValueError, match="does not use"):
    mesh_lib.make_mesh(data=3, fsdp=1, tp=1)
  with pytest.raises(ValueError, match="one may be -1"):
    mesh_lib.make_mesh(data=-1, fsdp=-1)


def test_no_weight_decay_on_norms():
  mask = optim.decay_mask(init_params(CONFIG, jax.random.key(0)))
  assert mask["final_norm"] is False and mask["layers"]["q_norm"] is False
  assert mask["layers"]["q"] is True and mask["embed"] is True
