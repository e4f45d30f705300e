"""experiments/studies/bench_train.py's stage path on a 1-layer, 64-token model: every stage's real
loss runs in the one train step on synthetic rows, the token counts agree across stages, and the
replay section times both forwards. The benchmark itself (`python experiments/studies/bench_train.py
--stages=...`) is a script, not a test."""

import math

import jax
import numpy as np
import pytest

from experiments.studies import bench_train
from gr2jax.diffusion import replay
from gr2jax.model.config import ModelConfig
from gr2jax.train import mesh as mesh_lib

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

BASE = ModelConfig.tiny(vocab_size=64, num_layers=1, attention_chunk_bytes=8 << 20)
SHAPE = bench_train.Rows(rows=2, prompt_width=8, prompt_tokens=6, response_width=40,
                         response_tokens=35, rounds=3)


@pytest.fixture(scope="module")
def mesh():
  return mesh_lib.make_mesh(fsdp=1, devices=[jax.devices()[0]])


def test_step_map_fits_the_replay_and_uses_every_round():
  steps = bench_train.step_map(40, 32, 16)
  replay.check_rounds(steps[None], 16)
  assert steps[0] == steps[32] == -1
  assert set(steps[1:32].tolist()) == set(range(16))


def _check_counts(row):
  assert math.isfinite(row["loss"]) and row["step_s"] > 0 and row["compile_s"] > 0
  # Response tokens are counted the same way for every stage: rows x real response tokens.
  np.testing.assert_allclose(row["response_tokens_per_s"] * row["step_s"], 2 * 35, rtol=0.05)
  np.testing.assert_allclose(row["processed_tokens_per_s"] * row["step_s"],
                             2 * row["forward_len"], rtol=0.05)


def test_rl_step_replays_synthetic_trajectories(mesh):
  """The replay-based step (RL; OPD shares its batch and replay), in ~15 s."""
  (row,) = bench_train.bench_stage("rl", BASE, SHAPE, 2, 1, mesh)
  _check_counts(row)
  assert row["forward_len"] == 8 + (1 + 3) * 64 and row["rounds"] == 3 and row["block"] == 32


@pytest.mark.slow
def test_every_stage_times_its_real_loss_on_the_same_rows(mesh):
  rows = [row for name in bench_train.STAGE_NAMES
          for row in bench_train.bench_stage(name, BASE, SHAPE, 1, 1, mesh)]
  bench_train.add_ratios(rows)
  by = {r["stage"]: r for r in rows}
  # forward tokens per row: [P | M]; CFT P + 3 R; replay P + (1 + S) R with R = 64 (B = 32).
  assert [by[s]["forward_len"] for s in ("sft", "cft", "opd", "rl")] == [48, 200, 264, 264]
  for r in rows:
    _check_counts(r)
  assert by["sft"]["step_vs_sft"] == 1.0 and by["rl"]["rounds"] == 3 and by["cft"]["block"] == 32


def test_replay_section_compares_with_the_causal_forward():
  (row,) = bench_train.bench_replay(BASE, SHAPE, [2], steps=1)
  assert row["replay_len"] == 8 + 3 * 64 and row["causal_len"] == 48 and row["cost_ratio"] > 0
  assert row["token_ratio"] == round((8 + 3 * 64) / 48, 2)


def test_replay_section_times_both_attention_paths():
  """--attention=dense,per_block: the replay compiled over the dense mask and per noisy block in
  one process, each row naming its path, the per-block row with the speedup; equal losses."""
  rows = bench_train.bench_replay(BASE, SHAPE, [2], steps=1, paths=("dense", "per_block"))
  bench_train.add_speedups(rows, ("rounds",), "replay_ms")
  by = {r["attention"]: r for r in rows}
  assert set(by) == set(bench_train.ATTENTION_PATHS) and "speedup" not in by["dense"]
  assert by["per_block"]["speedup"] == round(by["dense"]["replay_ms"]
                                             / by["per_block"]["replay_ms"], 2)
  assert by["dense"]["replay_temp_mb"] != by["per_block"]["replay_temp_mb"]  # two traces
  assert bench_train.attention.STRUCTURED_TWO_STREAM  # restored
