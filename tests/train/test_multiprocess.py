"""Two JAX processes on this machine run the SFT step of one process, over one global mesh.

The multi-host path (`experiments/run.py --multihost`) on CPU: each worker process (this file run
as a script) sets 2 host devices, joins a localhost coordinator with `jax.distributed.initialize`
(CPU collectives: gloo, jax's default since 0.4.3x, set explicitly), builds the ('data', 'fsdp',
'tp') = (1, 2, 2) mesh over the 4 global devices, and runs the same jitted, donated SFT train step
(2 micro-batches) the loop runs. Batches are global arrays built from the same host data in every
process (model/sharding.py `global_arrays`, as loop.train places them: each process fills only its
own shards); params are read back with `host_arrays` (a gather, as the loop's export does). Both
processes then write one orbax run checkpoint into the same directory
(gr2jax/train/run_checkpoints.py) and restore it; each checks its restored shards against its
live state, and one more step from the restored state must equal the step from the live one.
The test compares the workers' losses and params with one process running the same steps on a
4-device mesh of the same shape.
"""

import functools
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NUM_PROCESSES = 2
DEVICES_PER_PROCESS = 2
STEPS = 2
ROWS, PROMPT, LENGTH = 8, 16, 24


def _setup():
  """(config, optimizer, batches [numpy Batches]) shared by the workers and the reference."""
  import ml_collections

  from gr2jax.data.batches import Batch
  from gr2jax.model.config import ModelConfig
  from gr2jax.train import optim

  config = ModelConfig.tiny(vocab_size=256, attention_chunk_bytes=1 << 20)
  optimizer = optim.make_optimizer(ml_collections.ConfigDict(dict(
    learning_rate=1e-2, warmup_steps=1, total_steps=10, schedule="cosine", end_lr_factor=0.1,
    b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.01, clip_norm=1.0)))
  rng = np.random.default_rng(0)
  batches = []
  for _ in range(STEPS + 1):  # inputs.make_batch's fields that the SFT loss reads
    prompt_lengths = rng.integers(PROMPT // 2, PROMPT + 1, ROWS).astype(np.int32)
    response_lengths = rng.integers(2, LENGTH - PROMPT + 1, ROWS).astype(np.int32)
    prompt_tokens = np.zeros((ROWS, PROMPT), np.int32)
    response_tokens = np.zeros((ROWS, LENGTH - PROMPT), np.int32)
    response_weights = np.zeros((ROWS, LENGTH - PROMPT), np.float32)
    for i in range(ROWS):
      p, r = prompt_lengths[i], response_lengths[i]
      prompt, response = rng.integers(0, config.vocab_size, (2, LENGTH))
      prompt_tokens[i, :p] = prompt[:p]
      response_tokens[i, :r] = response[:r]
      response_weights[i, :r] = rng.choice(np.float32([0.5, 1.0]), r)
    batches.append(Batch(prompt_tokens=prompt_tokens, prompt_lengths=prompt_lengths,
                         example_mask=np.ones(ROWS, bool), response_tokens=response_tokens,
                         response_lengths=response_lengths, response_weights=response_weights))
  return config, optimizer, batches


def _run(mesh, ckpt_dir=None):
  """STEPS train steps on `mesh` (+ a checkpoint round trip when ckpt_dir is given).

  Returns:
    (losses [STEPS + 1] after one more step, params as numpy, checks dict).
  """
  import jax

  from gr2jax.model import params as params_lib
  from gr2jax.model.sharding import global_arrays, host_arrays
  from gr2jax.train import mesh as mesh_lib
  from gr2jax.train import run_checkpoints, sft
  from gr2jax.train import state as state_lib
  from gr2jax.train import step as step_lib

  config, optimizer, batches = _setup()
  abstract = state_lib.abstract_state(params_lib.abstract_params(config), optimizer)
  shardings = state_lib.state_shardings(config, abstract, mesh)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          abstract, shardings)
  batch_sh = mesh_lib.batch_sharding(mesh)
  init = jax.jit(lambda: params_lib.init_params(config, jax.random.key(0)),
                 out_shardings=shardings.params)  # created in place: no host array crosses
  state = jax.jit(lambda p: state_lib.create_state(p, optimizer, 0), out_shardings=shardings)(
    init())
  loss = step_lib.Loss(functools.partial(sft.sft_loss, config=config), sft.FIELDS)  # stages.py's
  to_global = lambda b: global_arrays(b.select(loss.fields), batch_sh)  # the loop's placement
  with jax.set_mesh(mesh):
    step = step_lib.make_train_step(loss, optimizer, micro_batches=2, state_shardings=shardings,
                                    batch_sharding=batch_sh)
  losses, checks = [], {}
  for b in batches[:STEPS]:
    with jax.set_mesh(mesh):
      state, metrics = step(state, to_global(b))
    losses.append(float(metrics["loss"]))
  if ckpt_dir is not None:
    manager = run_checkpoints.make_manager(ckpt_dir, keep=2)
    record = {"config": {"train": {"steps": STEPS}}}  # the loop's run record (its shape)
    run_checkpoints.save(manager, state, {"epoch": 0, "index": STEPS}, record)
    manager.wait_until_finished()
    fresh = run_checkpoints.make_manager(ckpt_dir, keep=2)  # as a rerun of the job would
    restored, data_state, at = run_checkpoints.restore_latest(fresh, abstract, record)
    same = jax.tree.map(lambda a, b: all(np.array_equal(x.data, y.data) for x, y in zip(
      a.addressable_shards, b.addressable_shards, strict=True)), restored, state)
    checks = {"restored_step": at, "data_state": data_state,
              "restored_equal": bool(all(jax.tree.leaves(same))),
              "local_devices": len(jax.local_devices()), "global_devices": jax.device_count()}
    with jax.set_mesh(mesh):
      from_restored, m_restored = step(restored, to_global(batches[STEPS]))
    checks["restored_loss"] = float(m_restored["loss"])
    params_restored = host_arrays(from_restored.params)
  with jax.set_mesh(mesh):
    state, metrics = step(state, to_global(batches[STEPS]))
  losses.append(float(metrics["loss"]))
  params = host_arrays(state.params)  # the loop's export gather
  if ckpt_dir is not None:
    checks["restored_params_equal"] = bool(all(jax.tree.leaves(jax.tree.map(
      np.array_equal, params_restored, params))))
  return losses, jax.tree.map(np.asarray, params), checks


def worker(process_id: int, port: int, out_dir: str) -> None:
  """One process of the 2-process job (this file's __main__)."""
  os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES_PER_PROCESS}"
  sys.path.insert(0, REPO)
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_default_matmul_precision", "highest")
  jax.distributed.initialize(f"localhost:{port}", NUM_PROCESSES, process_id)
  from gr2jax.train import mesh as mesh_lib

  mesh = mesh_lib.make_mesh(1, 2, 2)  # over all 4 devices of both processes
  losses, params, checks = _run(mesh, os.path.join(out_dir, "ckpt"))
  flat = {jax.tree_util.keystr(p): x for p, x in jax.tree_util.tree_flatten_with_path(params)[0]}
  np.savez(os.path.join(out_dir, f"params_{process_id}.npz"), **flat)
  with open(os.path.join(out_dir, f"result_{process_id}.json"), "w") as f:
    json.dump({"losses": losses, **checks}, f)
  jax.distributed.shutdown()


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def test_two_processes_equal_one(tmp_path):
  import jax

  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO}
  port = _free_port()
  procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), str(i), str(port),
                             str(tmp_path)], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
           for i in range(NUM_PROCESSES)]
  deadline = time.monotonic() + 600
  outputs = []
  try:
    for p in procs:
      outputs.append(p.communicate(timeout=max(deadline - time.monotonic(), 1))[0])
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for p, out in zip(procs, outputs, strict=True):
    assert p.returncode == 0, out[-4000:]

  from gr2jax.train import mesh as mesh_lib

  ref_losses, ref_params, _ = _run(mesh_lib.make_mesh(1, 2, 2, devices=jax.devices()[:4]))
  flat_ref = {jax.tree_util.keystr(p): x
              for p, x in jax.tree_util.tree_flatten_with_path(ref_params)[0]}
  for i in range(NUM_PROCESSES):
    with open(tmp_path / f"result_{i}.json") as f:
      result = json.load(f)
    assert result["local_devices"] == DEVICES_PER_PROCESS
    assert result["global_devices"] == NUM_PROCESSES * DEVICES_PER_PROCESS
    np.testing.assert_allclose(result["losses"], ref_losses, rtol=1e-5)
    assert result["restored_step"] == STEPS
    assert result["data_state"] == {"epoch": 0, "index": STEPS}
    assert result["restored_equal"] and result["restored_params_equal"]
    assert result["restored_loss"] == result["losses"][-1]
    params = np.load(tmp_path / f"params_{i}.npz")
    assert set(params.files) == set(flat_ref)
    for k, ref in flat_ref.items():
      # Adam moves a param by ~lr whatever its gradient's size, so a near-zero gradient summed in
      # another order by the two-process collectives moves it by a small fraction of lr (1e-2):
      # seen up to 1.7e-6 in one element of 10^5; atol = 1e-3 x lr.
      np.testing.assert_allclose(params[k], ref, rtol=1e-5, atol=1e-5, err_msg=k)
  assert sorted(os.listdir(tmp_path / "ckpt")) == [str(STEPS)]


if __name__ == "__main__":
  worker(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
