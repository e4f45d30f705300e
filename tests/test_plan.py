"""experiments/plan.py on the tiny preset: the code path of the 8B plan, in seconds.

The 8B plan itself (`python experiments/plan.py`, ~25 min) is not a test; its output is
docs/plan_qwen3_8b.md. Here: a real train step (CFT: the two-stream layout) compiled on the
(4, 2) fsdp x tp mesh with memory_analysis, the FLOP formula against cost_analysis on one-trip
configs, the micro-batch fit, and the report.
"""

import dataclasses

import jax.numpy as jnp
import pytest

from experiments import plan
from gr2jax import stage_registry
from gr2jax.train import cft
from gr2jax.train import mesh as mesh_lib
from tests import aot

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests


def test_flop_formula_matches_cost_analysis_on_one_trip_configs():
  rows = plan.verify_flops(("sft", "cft"))
  assert [r["loss"] for r in rows] == ["sft", "cft"]
  for r in rows:  # matmuls exactly; the rest (softmax, norms, RoPE, Adam-free grads) < 2%
    assert 1.0 <= r["ratio"] < 1.02, r


def test_tiny_cft_step_compiles_on_fsdp_x_tp_and_reports_memory():
  s = plan.PRESETS["tiny"]
  stage = plan.train_stages(s)["cft"]
  mesh = mesh_lib.make_mesh(1, 4, 2)
  point = plan.compile_train_step(stage, mesh, micro_rows=4)
  assert point["micro_batches"] == stage.rows // 4
  mem = point["memory"]
  assert mem["argument"] > 0 and mem["temp"] > 0
  assert mem["total"] == mem["argument"] + mem["output"] - mem["alias"] + mem["temp"]
  # The donated state aliases its output: what a device holds is far below arg + out.
  assert mem["alias"] > 0.9 * mem["output"]


def test_work_counts_the_layouts():
  s = plan.PRESETS["tiny"]
  stages = plan.train_stages(s)
  p, r = s.prompt_len, s.response_len
  assert stages["sft"].work.tokens == p + r
  assert stages["sft"].work.pairs == (p + r) * (p + r + 1) // 2
  assert stages["cft"].work.tokens == p + 3 * r  # prompt | clean | two noisy streams
  assert stages["opd"].work.tokens == p + (1 + s.rounds) * r  # every replay round packed
  # A noisy block sees the prompt, earlier clean blocks and its own block: fewer pairs than dense.
  assert stages["cft"].work.pairs < stages["cft"].work.dense_pairs
  assert stages["rl"].rows == s.batch_size["rl"] * s.group["rl"]


def test_fit_micro_rows_uses_the_memory_line():
  points = [{"micro_rows": 8, "memory": {"total": 30e9}},
            {"micro_rows": 16, "memory": {"total": 40e9}}]
  # 10 GB per 8 rows: 32 rows -> 60 GB fits 72 GB; 64 rows -> 100 GB does not.
  assert plan.fit_micro_rows(points, 64, 8, 72e9) == (32, 60e9, False)
  assert plan.fit_micro_rows(points, 64, 8, 40e9) == (16, 40e9, True)
  assert plan.fit_micro_rows(points, 64, 8, 20e9) == (None, 30e9, True)
  # Only divisors of the step's rows: 48 rows -> 8, 16, 24 (not 32).
  assert plan.fit_micro_rows(points, 48, 8, 72e9)[0] == 24
  # One compiled point judges only micro-batches up to it (nothing is known above).
  assert plan.fit_micro_rows(points[1:], 64, 8, 72e9) == (16, 40e9, True)
  assert plan.fit_micro_rows(points[1:], 64, 8, 20e9) == (None, 40e9, True)


def test_micro_points_start_at_the_stage_configs_micro_batch():
  s = dataclasses.replace(plan.PRESETS["tiny"], micro_batches={"sft": 2, "opd": 4})
  stages = plan.train_stages(s)
  assert plan.micro_points(stages["sft"], s, 8, 2) == [8, 16]  # 16 rows / 2, then the double
  assert plan.micro_points(stages["cft"], s, 8, 2) == [16, 8]  # no setting: all rows, then half
  assert plan.micro_points(stages["opd"], s, 8, 1) == [8]  # 4 rows raised to the 8 batch shards
  big, small = plan.PRESETS["qwen3_8b"], plan.PRESETS["qwen3_0_6b"]
  opd = dataclasses.replace(stages["opd"], rows=big.rows("opd"))  # the 8B step's rows
  assert plan.micro_points(opd, big, 8, 1) == [16]  # 512 / 32
  assert plan.micro_points(opd, small, 1, 1) == [2]  # one chip, the 8B configs' per-device rows
  assert plan.rollout_rows(small, "rl") == plan.rollout_rows(big, "rl") // plan.DEVICES_8B


def test_markdown_and_doc_block(tmp_path):
  fit = {"micro_rows": 16, "micro_batches": 2, "predicted_total": 40e9, "compiled": True}
  none = {"micro_rows": None, "micro_batches": None, "predicted_total": 90e9, "compiled": True}
  mem = {"total": 30 * 2**30, "argument": 10 * 2**30, "temp": 20 * 2**30}
  result = {"preset": "tiny", "params": 1e6, "jax": "x", "mfu": 0.4, "peak_flops": 989e12,
            "reserve": 0.1, "wall_s": 60.0, "cards": {"80GB": 80e9, "141GB": 141e9}, "rows": [
              {"kind": "train", "stage": "sft", "mesh": "8x1", "rows": 32, "tokens_per_row": 64,
               "points": [{"micro_rows": 16, "memory": mem}], "fit_80GB": fit, "fit_141GB": none,
               "model_flops": 2e12, "step_s": 1.5, "prepare_s": 0.0, "steps": 10,
               "stage_h": 0.01},
              {"kind": "decode", "stage": "ar_decode", "mesh": "8x1", "rows": 16,
               "prompt_len": 48, "new_tokens": 16, "memory": mem, "rows_per_shard_80GB": 3,
               "rows_per_shard_141GB": 6, "forwards": 17, "seconds": 0.5}],
            "flop_check": [{"loss": "sft", "analytic": 1.0, "cost_analysis": 1.004,
                            "ratio": 1.004}]}
  table = plan.markdown(result)
  assert "| sft | 8x1 | 32 x 64 | 16: 30.0 (10.0 / 20.0) | 16 x 2 | **no** (1 row/shard: 83.8 " \
    "GiB)" in table
  assert "| ar_decode | 8x1 | 16 x (48 + 16) |" in table and "| sft | 1 | 1.004 | 1.004 |" in table
  doc = tmp_path / "plan.md"
  doc.write_text("# Findings\n\nhand-written\n")
  plan.update_doc(str(doc), "table one\n")
  plan.update_doc(str(doc), "table two\n")
  text = doc.read_text()
  assert text.startswith("# Findings\n\nhand-written\n")
  assert "table two" in text and "table one" not in text and text.count("<!-- plan:begin -->") == 1


def test_presets_take_teacher_dtype_and_rollout_calls_from_the_stage_configs():
  big, tiny = plan.PRESETS["qwen3_8b"], plan.PRESETS["tiny"]
  assert big.teacher_dtype == plan.stage_config("opd", "qwen3_8b").opd.teacher_dtype == "bfloat16"
  for stage in ("ar_rl", "opd", "rl"):
    chunk = plan.stage_config(stage, "qwen3_8b").train.prepare_chunk
    assert 0 < chunk < big.rows(stage) and plan.rollout_rows(big, stage) == chunk
    assert plan.rollout_rows(tiny, stage) == tiny.rows(stage)  # tiny configs: all at once
  assert plan.train_stages(tiny)["opd"].batch(2)["teacher_log_probs"][1] == jnp.float32
  half = dataclasses.replace(tiny, teacher_dtype="bfloat16")
  assert plan.train_stages(half)["opd"].batch(2)["teacher_log_probs"][1] == jnp.bfloat16


def test_self_distillation_plans_cfts_layout_and_a_slow_decode_per_prompt():
  """OPD's 'self' objective: one row per prompt (no group), CFT's loss and two-stream layout, no
  teacher forward, and its targets' decode at one token per forward (not the plan's fast-decode
  assumption); its step compiles."""
  tiny = plan.PRESETS["tiny"]
  own = dataclasses.replace(tiny.views["opd"].settings, objective="self", certainty=2.0)
  assert stage_registry.spec("opd").rows_per_prompt(own) == 1
  s = dataclasses.replace(tiny, views={**tiny.views, "opd": dataclasses.replace(
    tiny.views["opd"], settings=own)}, group={**tiny.group, "opd": 1},
    batch_size={**tiny.batch_size, "opd": plan.TINY_ROWS})
  stages = plan.train_stages(s)
  opd = stages["opd"]
  assert set(opd.batch(2)) == set(cft.FIELDS) and opd.work == stages["cft"].work
  assert opd.prepare == () and opd.rollout == (s.diffusion(), s.block_size, 1.0)
  slow = plan.decode_seconds(s.diffusion(), 4, s.prompt_len, s.response_len, s.block_size, 1, 1,
                             plan.Settings(), forwards_per_token=1.0)
  assert slow["forwards"] == s.response_len + 1  # the prefill, then one per token
  point = plan.compile_train_step(opd, mesh_lib.make_mesh(1, 4, 2), micro_rows=4)
  assert point["memory"]["total"] > 0


def test_decoder_compiles_at_the_configs_rollout_call():
  s = dataclasses.replace(plan.PRESETS["tiny"], prepare_chunk={"opd": 8, "rl": 8})
  row = plan.plan_decoder("diffusion_decode", s, mesh_lib.make_mesh(1, 8, 1), 8, 1,
                          plan.Settings())
  assert row["rows"] == 8 and row["memory"]["total"] > 0
  assert row["rows_per_shard_80GB"] > 0


def test_run_plan_refuses_unknown_stages():
  with pytest.raises(ValueError, match="unknown stages"):
    plan.run_plan("tiny", ["8x1"], ["sft", "nope"], verify=False)


def test_merge_plans_keeps_the_rows_not_compiled_again():
  keys = {"preset": "qwen3_8b", "target": "tpu_v5p", "topology": "2x2x2"}
  row = lambda stage, v: {"stage": stage, "mesh": "8x1", "v": v}
  old = {**keys, "rows": [row("opd", 1), row("sft", 1)], "wall_s": 10.0}
  new = {**keys, "attention": "reference", "rows": [row("sft", 2), row("rl", 2)], "wall_s": 5.0}
  merged = plan.merge_plans(old, new)
  assert [(r["stage"], r["v"]) for r in merged["rows"]] == [("sft", 2), ("opd", 1), ("rl", 2)]
  assert merged["wall_s"] == 15.0 and merged["attention"] == "reference"
  with pytest.raises(ValueError, match="--append: the saved plan has attention='splash'"):
    plan.merge_plans({**old, "attention": "splash"}, new)


def test_run_plan_compiles_with_the_recipes_xla_flags_from_the_start(monkeypatch):
  tiny = dataclasses.replace(plan.PRESETS["tiny"],
                             xla_flags=("--xla_cpu_enable_fast_math=false",))
  monkeypatch.setitem(plan.PRESETS, "tiny", tiny)
  result = plan.run_plan("tiny", ["8x1"], ["ar_decode"], verify=False)
  assert result["recipe_options"] == {"xla_cpu_enable_fast_math": False}
  (row,) = result["rows"]
  assert row["options"]["xla_cpu_enable_fast_math"] is False and row["failures"] == []
  assert "XLA options from the recipe's xla_flags (every compile): " \
    "`--xla_cpu_enable_fast_math=false`." in plan.markdown(result)


def test_bad_layouts_and_a_target_without_its_compile_only_package_are_named():
  plan.check_flags(["8x1", "4x2"], "cpu")
  for layouts in (["8"], ["8x"], ["0x8"], ["4x2", "ax1"], []):
    with pytest.raises(ValueError, match="--layouts=.*FSDPxTP with positive sizes"):
      plan.check_flags(layouts, "cpu")
  if aot.installed("jax_plugins.xla_cuda12"):  # the compile-only packages (tests/aot.py)
    plan.check_flags(["8x1"], "h100")
  missing = lambda name: None  # noqa: E731 -- find_spec of an environment without them
  with pytest.raises(ValueError, match=r"--target=h100 .*jax-cuda12-plugin \(not installed\): "
                                       r"pip install -r requirements-aot.txt"):
    plan.check_flags(["8x1"], "h100", find_spec=missing)
  with pytest.raises(ValueError, match="--target=tpu_v5e .*libtpu"):
    plan.check_flags(["1x1"], "tpu_v5e", find_spec=missing)
