"""Run checkpoints (gr2jax/train/run_checkpoints.py): the resume check on run records
(gr2jax/run_identity.py, tests/test_run_identity.py), the walk back past a broken step (moved
aside, saved again), no silent restart when none restores, the finite check, restart moving a run
aside. Each on a two-leaf state: no model compile."""

import glob
import json
import os

import jax
import jax.numpy as jnp
import optax
import pytest

from gr2jax import run_identity
from gr2jax import workdir as workdir_lib
from gr2jax.train import run_checkpoints
from gr2jax.train import state as state_lib
from tests.test_run_identity import config_of, record_of


def _state(value: float = 1.0):
  params = {"w": jnp.full((4, 2), value), "norm": jnp.ones((2,))}
  return state_lib.create_state(params, optax.adam(1e-3), 0)


def _abstract(state):
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                      state)


def _saved_run(directory, steps=(2, 4), record=None):
  manager = run_checkpoints.make_manager(directory, keep=5, async_save=False)
  record = record_of(config_of()) if record is None else record
  for step in steps:
    state = _state(float(step)).replace(step=jnp.asarray(step, jnp.int32))
    run_checkpoints.save(manager, state, {"epoch": 0, "index": step}, record)
  return manager, record


def _truncate(directory, step, item="state"):
  for path in glob.glob(os.path.join(directory, str(step), item, "**", "*"), recursive=True):
    if os.path.isfile(path):
      open(path, "w").close()


def test_resume_below_the_saved_step_is_refused():
  with pytest.raises(run_checkpoints.RunChangedError, match="train.steps: 3 is below the "
                                                        "checkpoint's step 4"):
    run_checkpoints.check_resume(record_of(config_of()), record_of(config_of(steps=3)), 4, "D")


def test_broken_newest_step_is_moved_aside_and_saved_again(tmp_path, capsys):
  """the fallback used to leave the broken step in place, so saving it again
  raised StepAlreadyExistsError on every rerun."""
  directory = str(tmp_path / "checkpoints")
  manager, record = _saved_run(directory)
  _truncate(directory, 4)
  fresh = run_checkpoints.make_manager(directory, keep=5, async_save=False)
  state, data_state, step = run_checkpoints.restore_latest(fresh, _abstract(_state()), record)
  assert step == 2 and data_state["index"] == 2 and float(state.params["w"][0, 0]) == 2.0
  assert "step 4: its state does not restore" in capsys.readouterr().out
  assert fresh.all_steps() == [2] and os.listdir(directory + ".broken")[0].startswith("4-")
  run_checkpoints.save(fresh, state.replace(step=jnp.asarray(4, jnp.int32)), data_state, record)
  assert run_checkpoints.make_manager(directory, keep=5).all_steps() == [2, 4]


def test_unreadable_run_record_is_a_broken_step(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _, record = _saved_run(directory)
  _truncate(directory, 4, "run")
  fresh = run_checkpoints.make_manager(directory, keep=5, async_save=False)
  assert run_checkpoints.restore_latest(fresh, _abstract(_state()), record)[2] == 2


def test_no_step_restores_is_an_error_and_nothing_is_deleted(tmp_path):
  directory = str(tmp_path / "checkpoints")
  _, record = _saved_run(directory)
  _truncate(directory, 2)
  _truncate(directory, 4)
  fresh = run_checkpoints.make_manager(directory, keep=5, async_save=False)
  with pytest.raises(run_checkpoints.UnreadableCheckpointsError,
                     match="step 4: its state .*step 2: its state.*Nothing was deleted"):
    run_checkpoints.restore_latest(fresh, _abstract(_state()), record)
  assert sorted(os.listdir(directory)) == ["2", "4"]
  assert not os.path.exists(directory + ".broken")


def test_a_changed_run_is_refused_not_skipped(tmp_path):
  """A changed optimizer (clip_norm 0 changes the optimizer-state structure) used to make every
  step 'unreadable', restart from init and delete the valid checkpoints."""
  directory = str(tmp_path / "checkpoints")
  _saved_run(directory)
  changed = config_of()
  changed.optimizer.clip_norm = 0.0
  fresh = run_checkpoints.make_manager(directory, keep=5, async_save=False)
  with pytest.raises(run_checkpoints.RunChangedError,
                     match=r"optimizer.clip_norm: 1.0 \(checkpoint\) -> 0.0 \(this run\)"):
    run_checkpoints.restore_latest(fresh, _abstract(_state()), record_of(changed))
  assert sorted(os.listdir(directory)) == ["2", "4"]


def test_all_finite_sees_params_and_optimizer_state():
  state = _state()
  assert run_checkpoints.all_finite(state)
  assert not run_checkpoints.all_finite(state.replace(params={"w": jnp.full((4, 2), jnp.nan),
                                                          "norm": jnp.ones((2,))}))
  mu = jax.tree.map(lambda x: x.at[...].set(jnp.inf) if x.ndim else x, state.opt_state)
  assert not run_checkpoints.all_finite(state.replace(opt_state=mu))


def test_move_run_aside_keeps_the_previous_run(tmp_path):
  stage = str(tmp_path)
  assert run_checkpoints.move_run_aside(stage) is None
  os.makedirs(os.path.join(stage, "checkpoints", "2"))
  os.makedirs(os.path.join(stage, "logs"))
  os.makedirs(os.path.join(stage, "export"))
  for name in ("eval_final.json", ".lock"):
    open(os.path.join(stage, name), "w").close()
  moved = run_checkpoints.move_run_aside(stage)
  assert sorted(os.listdir(moved)) == ["checkpoints", "eval_final.json", "export", "logs"]
  assert os.listdir(os.path.join(moved, "checkpoints")) == ["2"]
  assert sorted(os.listdir(stage)) == [".lock", os.path.basename(moved)]
  assert os.path.dirname(moved) == stage


def test_a_moved_checkout_resumes_and_another_data_dir_is_refused(tmp_path, monkeypatch):
  """The tiny recipe's SFT record made with the shipped data of a checkout at one path resumes
  with the checkout at another (a clone, a move), and as an older record that wrote the path
  absolute with the checkout where it was; a data_dir of the user's is refused naming the
  field."""
  from gr2jax import recipe, recipes

  def record(root, data_dir=None):
    monkeypatch.setattr(workdir_lib, "CHECKOUT_DIR", str(root))
    c = recipes.config("", "sft")
    c.data.data_dir = data_dir or str(root / "data" / "amazon_beauty")
    return record_of(recipe.stage_config(recipe.from_config(c), "sft", "W"), workdir="W")

  saved = record(tmp_path / "clone_a")
  assert saved["config"]["data"]["data_dir"] == "{checkout}/data/amazon_beauty"
  run_checkpoints.check_resume(saved, record(tmp_path / "clone_b"), 2, "W/sft/checkpoints")
  old = json.loads(json.dumps(saved).replace("{checkout}", str(tmp_path / "clone_b")))
  run_checkpoints.check_resume(old, record(tmp_path / "clone_b"), 2, "W/sft/checkpoints")
  mine = str(tmp_path / "my_data")
  with pytest.raises(run_checkpoints.RunChangedError, match=(
      r"(?s)other settings:\n  data\.data_dir: '\{checkout\}/data/amazon_beauty' \(checkpoint\) "
      f"-> '{mine}' \\(this run\\)\nRerun")):
    run_checkpoints.check_resume(saved, record(tmp_path / "clone_b", mine), 2, "W/sft/checkpoints")


def test_a_record_holding_the_retired_cft_fields_off_is_this_runs_record():
  """Every CFT record written while cft.pivot_align and cft.answer_pair existed holds them off:
  it resumes and keeps its digest under today's recipe, which has neither; either on is a
  change."""
  from gr2jax import recipe, recipes

  new = record_of(recipe.stage_config(recipes.get("tiny"), "cft", "W"))
  assert not {"pivot_align", "answer_pair"} & set(new["config"]["cft"])
  old = json.loads(json.dumps(new))
  old["config"]["cft"].update(pivot_align=False, answer_pair=False)
  assert run_identity.changed_fields(old, new) == []
  assert run_identity.result_fields(old) == run_identity.result_fields(new)
  run_checkpoints.check_resume(old, new, 2, "W/cft/checkpoints")
  old["config"]["cft"]["pivot_align"] = True
  assert run_identity.changed_fields(old, new) == [("cft.pivot_align", True, "<absent>")]
