"""The training loop: resume after SIGKILL, fallback past a broken checkpoint, NaN stops the run,
final export + evaluation files."""

import glob
import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from gr2jax import checkpoint as model_checkpoint
from gr2jax.train import checkpoints, loop, stages
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
  return model_checkpoint.restore(os.path.join(workdir, "sft", "export"))[1]


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


def test_broken_latest_checkpoint_falls_back(tmp_path, uninterrupted, tok, capsys):
  import shutil

  workdir = str(tmp_path)
  shutil.copytree(os.path.join(uninterrupted, "sft", "checkpoints"),
                  os.path.join(workdir, "ckpts"))
  for path in glob.glob(os.path.join(workdir, "ckpts", "8", "state", "**", "*"),
                        recursive=True):
    if os.path.isfile(path):
      open(path, "w").close()  # truncate every file of the newest step
  config = toy_config(steps=STEPS)
  ctx = toy_context(config, tok, workdir)
  manager = checkpoints.make_manager(os.path.join(workdir, "ckpts"), keep=5, async_save=False)
  model_config, params = loop.model_from_init("preset:tiny", tok, config.train)
  from gr2jax.train import optim
  from gr2jax.train import state as state_lib
  optimizer = optim.make_optimizer(config.optimizer)
  abstract = state_lib.abstract_state(jax.eval_shape(lambda: params), optimizer)
  _, data_state, step = checkpoints.restore_latest(manager, abstract)
  assert step == 6 and data_state["index"] >= 0
  assert "step 8 is unreadable" in capsys.readouterr().out
  del ctx, model_config


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(tmp_path, tok):
  workdir = str(tmp_path)
  config = toy_config(steps=STEPS, save_every=1)
  config.optimizer.learning_rate = 1e30  # diverges within a few steps
  config.optimizer.clip_norm = 0.0
  config.optimizer.warmup_steps = 0
  ctx = toy_context(config, tok, workdir)
  with pytest.raises(FloatingPointError, match="non-finite loss .* last good checkpoint"):
    loop.train(config, workdir, stages.STAGES["sft"], ctx)
  kept = os.listdir(os.path.join(workdir, "sft", "checkpoints"))
  assert kept and not os.path.exists(os.path.join(workdir, "sft", "export"))


def test_prepare_chunk_must_split_over_the_batch_shards(tmp_path, tok):
  from gr2jax.train import mesh as mesh_lib

  config = toy_config("ar_rl", batch_size=2, prepare_chunk=3)
  mesh = mesh_lib.make_mesh(fsdp=2, devices=jax.devices()[:2])
  with pytest.raises(ValueError, match=r"train.prepare_chunk=3 is not a multiple .* \(2\)"):
    loop.train(config, str(tmp_path), stages.STAGES["ar_rl"],
               toy_context(config, tok, str(tmp_path), mesh))


def test_ar_rl_stage_runs_from_the_sft_export(tmp_path, uninterrupted, tok):
  """Two GRPO steps with real rollouts from the toy SFT export: rewards, groups and the update."""
  workdir = str(tmp_path)
  config = toy_config("ar_rl", steps=2, batch_size=2, save_every=2)
  from ml_collections import ConfigDict
  config.rl = ConfigDict(dict(group_size=4, temperature=1.0, eps_low=0.2, eps_high=0.28,
                              alpha=0.2))
  config.init = os.path.join(uninterrupted, "sft", "export")
  config.optimizer.learning_rate = 1e-4
  result = loop.train(config, workdir, stages.STAGES["ar_rl"], toy_context(config, tok, workdir))
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
  from ml_collections import ConfigDict

  workdir = str(tmp_path)
  ar_export = os.path.join(uninterrupted, "sft", "export")
  results = {}
  for stage, init, extra in (
      ("cft", ar_export, dict(cft=dict(eps=1e-3, complementary=True))),
      ("opd", os.path.join(workdir, "cft", "export"),
       dict(opd=dict(teacher=ar_export, group_size=2, teacher_dtype="bfloat16"))),
      ("rl", os.path.join(workdir, "opd", "export"),
       dict(rl=dict(group_size=2, eps_low=0.2, eps_high=0.2, alpha=0.2)))):
    config = toy_config(stage, steps=2, batch_size=2 if stage != "cft" else 8, save_every=2)
    config.init = init
    config.block_size = 4
    config.diffusion.max_steps_per_block = 4
    for k, v in extra.items():
      config[k] = ConfigDict(v)
    results[stage] = loop.train(config, workdir, stages.STAGES[stage],
                                toy_context(config, tok, workdir))
    exported = model_checkpoint.load_config(os.path.join(workdir, stage, "export"))
    assert exported.block_size == 4 and exported.mask_token_id is not None
  for stage, result in results.items():
    assert result["num"] == 8 and result["mean_nfe"] > 0, stage
