"""The training loop: resume after SIGKILL, fallback past a broken checkpoint, NaN stops the run,
final export + evaluation files; the run's integrity: one run per stage directory,
nothing non-finite saved or exported, a resume that refuses a changed run, a finished rerun that
does nothing, sizes validated, exports that record their kind and data build."""

import dataclasses
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from gr2jax import exports, load
from gr2jax.train import loop, optim, run_checkpoints, stages
from gr2jax.train import state as state_lib
from gr2jax.workdir import InUseError
from tests.train import toy_policy
from tests.train.toy import toy_config, toy_context, toy_tokenizer

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STEPS = 8


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("tok"))
  toy_tokenizer(out)
  return out


@pytest.fixture(scope="module")
def tok(tok_dir):
  from gr2jax.data import tokenizer as tokenizer_lib
  return tokenizer_lib.load_tokenizer(tok_dir)


def _toy_run(workdir, tok_dir, steps=STEPS):
  return subprocess.Popen([sys.executable, "-m", "tests.train.toy_run", workdir, tok_dir,
                           str(steps)], cwd=REPO, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True)


def _exported(workdir):
  return exports.restore(os.path.join(workdir, "sft", "export"))[1]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, tok_dir):
  workdir = str(tmp_path_factory.mktemp("full"))
  proc = _toy_run(workdir, tok_dir)
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out
  return workdir


@pytest.mark.slow
def test_resume_after_sigkill_ends_with_the_same_params(tmp_path, tok_dir, uninterrupted):
  workdir = str(tmp_path)
  proc = _toy_run(workdir, tok_dir)
  ckpt_dir = os.path.join(workdir, "sft", "checkpoints")
  deadline = time.time() + 600
  while time.time() < deadline and not os.path.isdir(os.path.join(ckpt_dir, "4")):
    time.sleep(0.05)
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  assert not os.path.exists(os.path.join(workdir, "sft", "export")), "killed before the end"
  proc = _toy_run(workdir, tok_dir)
  out, _ = proc.communicate(timeout=600)
  assert proc.returncode == 0, out
  assert "resuming from checkpoint step" in out
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               _exported(workdir), _exported(uninterrupted))


def test_final_export_and_evaluation_files(uninterrupted):
  stage_dir = os.path.join(uninterrupted, "sft")
  result = json.load(open(os.path.join(stage_dir, "eval_final.json")))
  assert result["step"] == STEPS and result["num"] == 8
  rows = [json.loads(line) for line in open(os.path.join(stage_dir, "eval_final.jsonl"))]
  assert len(rows) == 8 and {"user", "response", "kind", "ranking", "target_rank"} <= set(rows[0])
  metrics = [json.loads(line) for line in open(os.path.join(stage_dir, "logs", "metrics.jsonl"))]
  assert [m["step"] for m in metrics if "train/loss" in m] == list(range(1, STEPS + 1))
  assert glob.glob(os.path.join(stage_dir, "logs", "events.out.tfevents.*"))
  assert sorted(int(s) for s in os.listdir(os.path.join(stage_dir, "checkpoints"))) == [2, 4, 6, 8]


def _copy_run(uninterrupted, workdir, what=("checkpoints",)):
  """W/sft/<what> of the uninterrupted run copied into workdir/sft (a run to resume)."""
  for name in what:
    shutil.copytree(os.path.join(uninterrupted, "sft", name), os.path.join(workdir, "sft", name))
  return os.path.join(workdir, "sft", "checkpoints")


def _truncate_state(ckpt_dir, step):
  for path in glob.glob(os.path.join(ckpt_dir, str(step), "state", "**", "*"), recursive=True):
    if os.path.isfile(path):
      open(path, "w").close()


@pytest.mark.slow
def test_broken_latest_checkpoint_is_moved_aside_and_the_run_saves_it_again(
    tmp_path, uninterrupted, tok, capsys):
  """Class 3: the run falls back to step 6, trains to 8 and saves step 8 again (no
  StepAlreadyExistsError); the broken step 8 is kept under run_checkpoints.broken/; the export
  equals the uninterrupted run's."""
  workdir = str(tmp_path)
  ckpt_dir = _copy_run(uninterrupted, workdir)
  _truncate_state(ckpt_dir, STEPS)
  config = toy_config(steps=STEPS, save_every=2)
  loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  out = capsys.readouterr().out
  assert "step 8: its state does not restore" in out and "resuming from checkpoint step 6" in out
  assert sorted(int(s) for s in os.listdir(ckpt_dir)) == [2, 4, 6, 8]
  assert [e.split("-")[0] for e in os.listdir(ckpt_dir + ".broken")] == ["8"]
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, atol=1e-6),
               _exported(workdir), _exported(uninterrupted))


def test_no_readable_checkpoint_is_an_error_that_deletes_nothing(tmp_path, uninterrupted, tok):
  workdir = str(tmp_path)
  ckpt_dir = _copy_run(uninterrupted, workdir)
  for step in (2, 4, 6, 8):
    shutil.rmtree(os.path.join(ckpt_dir, str(step), "run"))  # a state restore fails slowly
  config = toy_config(steps=STEPS, save_every=2)
  with pytest.raises(run_checkpoints.UnreadableCheckpointsError,
                     match="no checkpoint restores .*step 8: its run record.*Nothing was deleted"):
    loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  assert sorted(int(s) for s in os.listdir(ckpt_dir)) == [2, 4, 6, 8]
  assert not os.path.exists(os.path.join(workdir, "sft", "export"))


def _edit(config, **fields):
  """The view with `section__name=value` fields changed (its blocks are frozen: replaced)."""
  for field, value in fields.items():
    section, name = field.split("__")
    config = dataclasses.replace(config, **{section: getattr(config, section).replace(
      **{name: value})})
  return config


@pytest.mark.parametrize("change,named", [
  (dict(optimizer__learning_rate=5e-3), "optimizer.learning_rate: 0.002 (checkpoint) -> 0.005"),
  (dict(optimizer__clip_norm=0.0), "optimizer.clip_norm: 1.0 (checkpoint) -> 0.0"),
  (dict(train__batch_size=4), "train.batch_size: 8 (checkpoint) -> 4"),
  (dict(train__steps=4), "train.steps: 4 is below the checkpoint's step 8"),
  (dict(train__seed=1), "train.seed: 0 (checkpoint) -> 1"),
])
def test_resume_refuses_a_changed_run(tmp_path, uninterrupted, tok, change, named):
  """Class 4: the checkpoints record the run; a change that alters it is refused, naming the
  field; nothing is deleted and logs/config.txt is not rewritten."""
  workdir = str(tmp_path)
  ckpt_dir = _copy_run(uninterrupted, workdir, ("checkpoints", "logs"))
  config_txt = open(os.path.join(workdir, "sft", "logs", "config.txt")).read()
  config = _edit(toy_config(steps=STEPS, save_every=2), **change)
  with pytest.raises(run_checkpoints.RunChangedError, match=re.escape(named)) as e:
    loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  assert ".train.restart=True" in str(e.value)
  assert sorted(int(s) for s in os.listdir(ckpt_dir)) == [2, 4, 6, 8]
  assert open(os.path.join(workdir, "sft", "logs", "config.txt")).read() == config_txt


def _other_init(uninterrupted):
  return dataclasses.replace(toy_config(steps=2, save_every=2),
                             init=os.path.join(uninterrupted, "sft", "export"))


def test_resume_refuses_another_init(tmp_path, uninterrupted, tok):
  workdir = str(tmp_path)
  _copy_run(uninterrupted, workdir, ("checkpoints", "logs"))
  config = _other_init(uninterrupted)
  with pytest.raises(run_checkpoints.RunChangedError, match="init: 'preset:tiny' .* -> '/"):
    loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))


@pytest.mark.slow
def test_restart_moves_the_previous_run_aside(tmp_path, uninterrupted, tok, capsys):
  workdir = str(tmp_path)
  ckpt_dir = _copy_run(uninterrupted, workdir, ("checkpoints", "logs"))
  config = _other_init(uninterrupted)
  config = dataclasses.replace(config, train=config.train.replace(restart=True))
  loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  out = capsys.readouterr().out
  moved = [e for e in os.listdir(os.path.join(workdir, "sft")) if e.startswith("replaced-")]
  assert len(moved) == 1 and "moved the previous run's files to" in out
  assert sorted(os.listdir(os.path.join(workdir, "sft", moved[0], "checkpoints"))) == \
    ["2", "4", "6", "8"]
  assert sorted(os.listdir(ckpt_dir)) == ["2"]
  assert exports.load_metadata(os.path.join(workdir, "sft", "export"))["run"][
    "config"]["init"] == config.init


def test_a_config_identical_rerun_of_a_finished_run_does_nothing(tmp_path, uninterrupted, tok,
                                                                 capsys):
  workdir = str(tmp_path)
  shutil.copytree(os.path.join(uninterrupted, "sft"), os.path.join(workdir, "sft"))
  files = lambda: {p: (os.stat(p).st_mtime_ns, os.path.getsize(p)) for p in glob.glob(
    os.path.join(workdir, "**"), recursive=True) if os.path.isfile(p)}
  before = files()
  config = toy_config(steps=STEPS, save_every=2)
  result = loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  assert "already finished at step 8 with this config" in capsys.readouterr().out
  assert result == json.load(open(os.path.join(workdir, "sft", "eval_final.json")))
  assert files() == before  # no checkpoint, export, log or evaluation file written


def test_a_second_run_of_the_stage_is_refused(tmp_path, tok):
  """Class 1: the stage directory is locked for the whole run."""
  workdir = str(tmp_path)
  holder = subprocess.Popen(
    [sys.executable, "-c", "import sys, time; from gr2jax.workdir import lock_workdir\n"
     "with lock_workdir(sys.argv[1]):\n  print('locked', flush=True); time.sleep(60)",
     os.path.join(workdir, "sft")], cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    assert holder.stdout.readline().strip() == "locked"
    config = toy_config(steps=2)
    with pytest.raises(InUseError, match=f"in use by pid {holder.pid}"):
      loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  finally:
    holder.kill()
    holder.wait()
  assert not os.path.exists(os.path.join(workdir, "sft", "checkpoints"))


def test_non_finite_update_is_never_saved_or_exported(tmp_path, tok, monkeypatch, capsys):
  """Class 2: an update that makes the params non-finite (lr 1e39 is inf in float32) stops the
  run before the save; no checkpoint holds it, no export is written. The progress bar's line is
  ended first, so the refusal printed after it is a line of its own."""
  monkeypatch.setenv("GR2JAX_PROGRESS", "1")
  workdir = str(tmp_path)
  config = toy_config(steps=1, save_every=1)
  config = dataclasses.replace(config, optimizer=config.optimizer.replace(
    learning_rate=1e39, clip_norm=0.0, warmup_steps=0))
  with pytest.raises(FloatingPointError, match="non-finite params .* after step 1, not saved.*"
                                               "No checkpoint was saved") as raised:
    loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))
  err = capsys.readouterr().err  # the raise's frames (and so any bar left open) still alive
  assert raised.tb is not None and "sft:" in err and err.endswith("\n"), repr(err[-200:])
  assert os.listdir(os.path.join(workdir, "sft", "checkpoints")) == []
  assert not os.path.exists(os.path.join(workdir, "sft", "export"))


def test_nan_loss_stops_the_run_and_keeps_the_last_finite_checkpoint(tmp_path, tok):
  workdir = str(tmp_path)
  config = toy_config(steps=STEPS, save_every=1)
  config = dataclasses.replace(config, optimizer=config.optimizer.replace(
    learning_rate=1e30, clip_norm=0.0, warmup_steps=0))  # diverges within a few steps
  ctx = toy_context(config, tok, workdir)
  with pytest.raises(FloatingPointError, match="non-finite .* last finite checkpoint"):
    loop.train(config, workdir, stages.stage("sft"), ctx)
  manager = run_checkpoints.make_manager(os.path.join(workdir, "sft", "checkpoints"), keep=5)
  kept = manager.all_steps()
  assert kept and not os.path.exists(os.path.join(workdir, "sft", "export"))
  model_config, params = loop.model_from_init("preset:tiny", tok, config.train)
  optimizer = optim.make_optimizer(config.optimizer)
  abstract = state_lib.abstract_state(jax.eval_shape(lambda: params), optimizer)
  restored = manager.restore(max(kept), args=ocp.args.Composite(
    state=ocp.args.StandardRestore(abstract)))["state"]
  assert run_checkpoints.all_finite(restored)
  del model_config


def test_bad_sizes_are_refused_before_anything_is_built(tmp_path, tok):
  """Class 6: steps=0 used to export the untrained init, keep=0 to keep no checkpoint; both are
  a ValueError when the settings are built (gr2jax/settings.py), so no view the loop could be
  given holds them and no stage directory is made."""
  for field, value in (("steps", 0), ("keep", 0), ("micro_batches", 0)):
    with pytest.raises(ValueError, match=f"train.{field}={value}"):
      toy_config(**{field: value})
  assert not os.path.exists(os.path.join(str(tmp_path), "sft"))


def test_ar_stage_refuses_a_diffusion_init(tmp_path, uninterrupted, tok):
  """Class 5: sft / ar_rl on a diffusion checkpoint used to train AR losses on it."""
  from gr2jax.data.prompts import MASK_TOKEN
  from gr2jax.diffusion import convert

  workdir = str(tmp_path)
  model_config, params = load.load_model(os.path.join(uninterrupted, "sft",
                                                                  "export"))
  diffusion = os.path.join(workdir, "diffusion")
  exports.save(diffusion, convert.to_diffusion(
    model_config, 4, int(tok.convert_tokens_to_ids(MASK_TOKEN))), params)
  config = dataclasses.replace(toy_config(steps=2), init=diffusion)
  with pytest.raises(ValueError, match=r"\[sft\] is an AR stage but init=.* is a block-diffusion "
                                       r"model \(block_size=4\)"):
    loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))


def test_export_records_stage_kind_and_data_build(uninterrupted, tok):
  """Class 5: the export says what it is and which data build fed it; eval / rerank refuse
  another build (check_data_build), naming both."""
  import dataclasses

  from tests.train.toy import PROMPT

  export = os.path.join(uninterrupted, "sft", "export")
  metadata = exports.load_metadata(export)
  assert metadata["stage"] == "sft" and metadata["kind"] == "ar" and metadata["step"] == STEPS
  assert metadata["data_build"] == exports.data_build_record(tok, PROMPT)
  lr = toy_config(steps=STEPS).optimizer.learning_rate  # the tiny recipe's SFT lr
  assert metadata["run"]["config"]["optimizer"]["learning_rate"] == lr == 2e-3
  exports.check_data_build(export, exports.data_build_record(tok, PROMPT))
  other = exports.data_build_record(tok, dataclasses.replace(PROMPT, evidence="raw"))
  with pytest.raises(ValueError, match="another data build .*prompt.evidence 'flags' vs 'raw'"):
    exports.check_data_build(export, other)
  other = dict(exports.data_build_record(tok, PROMPT), vocab_sha256="0" * 64, vocab=7)
  with pytest.raises(ValueError, match=r"tokenizer vocab_sha256 [0-9a-f]{16} \(vocab \d+\) vs "
                                       r"0{16} \(vocab 7\)"):
    exports.check_data_build(export, other)


def test_prepare_chunk_must_split_over_the_batch_shards(tmp_path, tok):
  from gr2jax.train import mesh as mesh_lib

  config = toy_config("ar_rl", batch_size=2, prepare_chunk=3)
  mesh = mesh_lib.make_mesh(fsdp=2, devices=jax.devices()[:2])
  with pytest.raises(ValueError, match=r"train.prepare_chunk=3 is not a multiple .* \(2\)"):
    loop.train(config, str(tmp_path), stages.stage("ar_rl"),
               toy_context(config, tok, str(tmp_path), mesh))


@pytest.mark.parametrize("stage", ["ar_rl", "opd", "rl"])
def test_each_on_policy_stage_samples_at_its_temperature_and_tau(tmp_path, tok, stage):
  """Each on-policy stage samples (and scores) at its own temperature; RL and OPD commit at
  their own rollout_tau (the decode spec is the evaluations')."""
  config = toy_config(stage)
  taus = dict(rollout_tau=0.7) if stage != "ar_rl" else {}
  config = dataclasses.replace(config, settings=dataclasses.replace(
    config.settings, temperature=0.5, **taus))
  model = toy_policy.DIFFUSION if stage != "ar_rl" else toy_policy.AR
  context = dataclasses.replace(toy_context(config, tok, str(tmp_path)), model_config=model)
  rollout = stages._rollout(context)
  assert rollout.temperature == 0.5 and rollout.spec == config.decode
  assert getattr(rollout, "tau", None) == taus.get("rollout_tau")


@pytest.mark.slow  # the same path by default: tests/test_reproduce.py's HF-layout run (AR RL and
#                   RL from their upstream exports, these reward / group checks) and test.sh's smoke
def test_ar_rl_stage_runs_from_the_sft_export(tmp_path, uninterrupted, tok):
  """Two GRPO steps with real rollouts from the toy SFT export: rewards, groups and the update."""
  workdir = str(tmp_path)
  config = toy_config("ar_rl", steps=2, batch_size=2, save_every=2)
  config = dataclasses.replace(
    config, init=os.path.join(uninterrupted, "sft", "export"), settings=dataclasses.replace(
      config.settings, group_size=4, eps_low=0.2, eps_high=0.28, alpha=0.2),
    optimizer=config.optimizer.replace(learning_rate=1e-4))
  result = loop.train(config, workdir, stages.stage("ar_rl"), toy_context(config, tok, workdir))
  metrics = [json.loads(line) for line in
             open(os.path.join(workdir, "ar_rl", "logs", "metrics.jsonl"))]
  train_rows = [m for m in metrics if "train/reward" in m]
  assert len(train_rows) == 2
  for m in train_rows:
    assert -1.0 <= m["train/reward"] <= 1.2 and 0 <= m["train/kept_groups"] <= 1
  assert result["num"] == 8


@pytest.mark.slow
def test_diffusion_stages_chain_from_the_ar_export(tmp_path, uninterrupted, tok):
  """CFT (converted to B=4) -> OPD (AR teacher) -> RL, each a couple of real steps through the
  one loop, each ending with the one evaluation (diffusion decoding)."""
  workdir = str(tmp_path)
  ar_export = os.path.join(uninterrupted, "sft", "export")
  results = {}
  for stage, init, extra in (
      ("cft", ar_export, dict(cft=dict(eps=1e-3, complementary=True, rate_power=1.0))),
      ("opd", os.path.join(workdir, "cft", "export"),
       dict(opd=dict(teacher=ar_export, group_size=2, teacher_dtype="bfloat16"))),
      ("rl", os.path.join(workdir, "opd", "export"),
       dict(rl=dict(group_size=2, eps_low=0.2, eps_high=0.2, alpha=0.2)))):
    config = toy_config(stage, steps=2, batch_size=2 if stage != "cft" else 8, save_every=2)
    (fields,) = extra.values()
    config = dataclasses.replace(config, init=init, settings=dataclasses.replace(
      config.settings, **fields), decode=dataclasses.replace(
      config.decode, block_size=4, max_steps_per_block=4))
    results[stage] = loop.train(config, workdir, stages.stage(stage),
                                toy_context(config, tok, workdir))
    exported = exports.load_config(os.path.join(workdir, stage, "export"))
    assert exported.block_size == 4 and exported.mask_token_id is not None
  for stage, result in results.items():
    assert result["num"] == 8 and result["mean_nfe"] > 0, stage
