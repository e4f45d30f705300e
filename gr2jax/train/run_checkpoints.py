"""Run checkpoints: orbax CheckpointManager under `workdir/<stage>/checkpoints/`.

Each checkpoint holds the TrainState (params, optimiser state, step, PRNG key), the data
iterator's position (JSON) and the run record (JSON, run_identity.run_record: the resolved
config, the data build, the init's digest, P and R). Saves happen every `save_every` steps
(async), the newest `keep` are kept, and a SIGTERM/SIGINT makes the loop save before it exits
(`StopFlag`); the loop saves only a finite state (`all_finite`).

The run record and what a resume may change are gr2jax/run_identity.py's (`run_record`,
RUN_NEUTRAL, ADDED_AT_DEFAULT, `changed_fields`): a record describes the work, not where the
workdir or the checkout lives, so the same run resumes from another directory, a moved or copied
workdir, or another clone.

`restore_latest` walks back from the newest step. A step whose run record differs from this run's
in a field that alters the run (everything but run_identity.RUN_NEUTRAL; train.steps only when
below the step) is refused (`RunChangedError`, naming the fields), never skipped. A step that
fails to restore (truncated or deleted files) is reported and the one before it is used; once one
restores, the broken newer steps are moved aside to `checkpoints.broken/` so the run can save
those steps again. When steps exist but none restores, nothing is deleted or overwritten: it is
an `UnreadableCheckpointsError` naming each step's error. `move_run_aside` (train.restart) parks
the checkpoints, logs, export and evaluation files of a previous run instead of deleting them.
The stage's final params are also exported in gr2jax/exports.py's format, the hand-over format
to the next stage and load_model.
"""

import os
import shutil
import signal
import time

import jax
import jax.numpy as jnp
import orbax.checkpoint as ocp
from absl import logging

from gr2jax import run_identity
from gr2jax import workdir as workdir_lib
from gr2jax.train.state import TrainState


class RunChangedError(ValueError):
  """The checkpoints were written by a run with other settings; the message names the fields."""


class UnreadableCheckpointsError(RuntimeError):
  """Run checkpoints exist but none restores; the message names each step's error."""


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


def check_resume(saved: dict, current: dict, step: int, directory: str) -> None:
  """Raises RunChangedError unless `current` may resume the checkpoint `step` recorded as
  `saved` (no run-altering field changed, train.steps not below `step`)."""
  lines = [f"  {field}: {a!r} (checkpoint) -> {b!r} (this run)"
           for field, a, b in run_identity.changed_fields(saved, current)]
  steps = current["config"]["train"]["steps"]
  if steps < step:
    lines.append(f"  train.steps: {steps} is below the checkpoint's step {step}")
  if lines:
    raise RunChangedError(
      f"{directory}: checkpoint step {step} was written by a run with other settings:\n"
      + "\n".join(lines) + "\nRerun with the checkpoint's settings, use a new workdir, or pass "
      f"--config.stages.{current['config'].get('stage', '<stage>')}.train.restart=True (moves "
      "these checkpoints and logs aside, starts from config.init).")


def save(manager: ocp.CheckpointManager, state: TrainState, data_state: dict,
         record: dict) -> None:
  """Saves state + iterator position + run record at state.step (async;
  manager.wait_until_finished joins)."""
  step = int(jax.device_get(state.step))
  manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                             data=ocp.args.JsonSave(data_state),
                                             run=ocp.args.JsonSave(record)), force=True)


@jax.jit
def _all_finite(tree) -> jax.Array:
  leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
            if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(leaves)) if leaves else jnp.bool_(True)


def all_finite(state: TrainState) -> bool:
  """True when every float of the params and the optimiser state is finite."""
  return bool(jax.device_get(_all_finite((state.params, state.opt_state))))


def restore_latest(manager: ocp.CheckpointManager, abstract: TrainState, record: dict):
  """The newest checkpoint that restores, walking back past broken ones (module docstring).

  Args:
    manager: the run's manager.
    abstract: the state's ShapeDtypeStructs with shardings (restored leaves land there).
    record: this run's run_identity.run_record.

  Returns:
    (state, data_state, step), or None when there is no checkpoint.

  Raises:
    RunChangedError: the newest readable run record differs in a run-altering field.
    UnreadableCheckpointsError: checkpoints exist but none restores.
  """
  failures = []
  for step in sorted(manager.all_steps(), reverse=True):
    try:
      saved = manager.restore(step, args=ocp.args.Composite(run=ocp.args.JsonRestore()))["run"]
    except Exception as e:  # noqa: BLE001 -- any failure means "this step is unusable"
      failures.append(_unusable(manager, step, "its run record", e))
      continue
    check_resume(saved, record, step, manager.directory)
    try:
      out = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), data=ocp.args.JsonRestore()))
    except Exception as e:  # noqa: BLE001
      failures.append(_unusable(manager, step, "its state", e))
      continue
    _move_aside(manager, [s for s, _ in failures])
    return out["state"], out["data"], step
  if failures:
    raise UnreadableCheckpointsError(
      f"{manager.directory}: no checkpoint restores ("
      + "; ".join(message for _, message in failures) + "). Nothing was deleted; move the "
      "directory aside, or pass --config.stages.<stage>.train.restart=True to start from "
      "config.init")
  return None


def _unusable(manager, step: int, what: str, error: Exception) -> tuple[int, str]:
  message = f"step {step}: {what} does not restore ({type(error).__name__}: {str(error)[:300]})"
  logging.warning("%s under %s", message, manager.directory)
  print(f"WARNING: checkpoint {message}; trying the one before it", flush=True)
  return step, message


def _move_aside(manager: ocp.CheckpointManager, steps: list[int]) -> None:
  """Moves broken steps to `<checkpoints>.broken/<step>-<time>` so they can be saved again."""
  if not steps:
    return
  if jax.process_index() == 0:
    directory = str(manager.directory)
    for step in steps:
      target = os.path.join(f"{directory}.broken", f"{step}-{time.strftime('%Y%m%dT%H%M%S')}")
      os.makedirs(os.path.dirname(target), exist_ok=True)
      shutil.move(os.path.join(directory, str(step)), target)
      print(f"WARNING: moved the unreadable checkpoint step {step} to {target}", flush=True)
  manager.reload()


def move_run_aside(stage_dir: str) -> str | None:
  """Moves everything of a previous run in `stage_dir` (checkpoints, logs, export, evaluation
  files) to `stage_dir/replaced-<time>-<pid>/` (train.restart); returns that directory, or None
  when there was nothing to move. The lock file and earlier replaced-* directories stay."""
  present = [n for n in sorted(os.listdir(stage_dir))
             if n != workdir_lib.LOCK_FILE and not n.startswith("replaced-")]
  if not present:
    return None
  target = os.path.join(stage_dir, f"replaced-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
  os.makedirs(target)
  for name in present:
    os.rename(os.path.join(stage_dir, name), os.path.join(target, name))
  return target
