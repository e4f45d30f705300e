"""Run checkpoints: orbax CheckpointManager under `workdir/<stage>/checkpoints/`.

Each checkpoint holds the TrainState (params, optimiser state, step, PRNG key) and the data
iterator's position (JSON). Saves happen every `save_every` steps (async), the newest `keep` are
kept, and a SIGTERM/SIGINT makes the loop save before it exits (`StopFlag`). `restore_latest`
walks back from the newest step: a checkpoint that fails to restore (truncated or deleted files)
is reported with a warning and the one before it is used. The stage's final params are also
exported in gr2jax/checkpoint.py's format, the hand-over format to the next stage and load_model.
"""

import os
import signal

import jax
import orbax.checkpoint as ocp
from absl import logging

from gr2jax.train.state import TrainState


class StopFlag:
  """Set by SIGTERM / SIGINT while installed; the loop saves and exits when it sees it."""

  def __init__(self):
    self.signum = None
    self._previous = {}

  def __enter__(self):
    for sig in (signal.SIGTERM, signal.SIGINT):
      self._previous[sig] = signal.signal(sig, self._handle)
    return self

  def _handle(self, signum, frame):
    del frame
    logging.warning("received signal %d: saving a checkpoint before exiting", signum)
    self.signum = signum

  def __exit__(self, *exc):
    for sig, handler in self._previous.items():
      signal.signal(sig, handler)
    return False

  def __bool__(self) -> bool:
    return self.signum is not None


def make_manager(directory: str, *, keep: int, async_save: bool = True) -> ocp.CheckpointManager:
  """A CheckpointManager keeping the newest `keep` steps (saves are requested explicitly)."""
  options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True,
                                         enable_async_checkpointing=async_save)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def save(manager: ocp.CheckpointManager, state: TrainState, data_state: dict) -> None:
  """Saves state + iterator position at state.step (async; manager.wait_until_finished joins)."""
  step = int(jax.device_get(state.step))
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             data=ocp.args.JsonSave(data_state)), force=True)


def restore_latest(manager: ocp.CheckpointManager, abstract: TrainState):
  """The newest checkpoint that restores, walking back past broken ones.

  Args:
    manager: the run's manager.
    abstract: the state's ShapeDtypeStructs with shardings (restored leaves land there).

  Returns:
    (state, data_state, step) or None when no checkpoint restores.
  """
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001 -- any failure means "this step is unusable"
      logging.warning("checkpoint step %d under %s does not restore (%s: %s); trying the one "
                      "before it", step, manager.directory, type(e).__name__, str(e)[:300])
      print(f"WARNING: checkpoint step {step} is unreadable ({type(e).__name__}); falling back "
            "to the previous one", flush=True)
      continue
    return out["state"], out["data"], step
  return None
