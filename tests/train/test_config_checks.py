"""check_stage_config: every shipped stage config passes; each bad size or rate is a ValueError
naming its field (issue 16, class 6)."""

import importlib
import os
import sys

import pytest

from gr2jax.train.config_checks import check_stage_config

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs"))

STAGE_CONFIGS = [(n, v) for n in ("sft", "ar_rl", "cft", "opd", "rl") for v in ("", "qwen3_8b")]


@pytest.mark.parametrize("name,variant", STAGE_CONFIGS + [("eval", None), ("rerank", None)])
def test_shipped_configs_pass(name, variant):
  module = importlib.import_module(name)
  check_stage_config(module.get_config() if variant is None else module.get_config(variant))


@pytest.mark.parametrize("config_name,field,value,message", [
  ("sft", "train.steps", 0, "train.steps=0: must be >= 1"),
  ("sft", "train.steps", -5, "train.steps=-5"),
  ("sft", "train.micro_batches", 0, "train.micro_batches=0"),
  ("sft", "train.micro_batches", 3, r"train.micro_batches=3: must be a divisor of the 32 rows"),
  ("sft", "train.save_every", 0, "train.save_every=0"),
  ("sft", "train.keep", 0, "train.keep=0"),
  ("sft", "train.batch_size", 0, "train.batch_size=0"),
  ("sft", "train.prepare_chunk", -1, "train.prepare_chunk=-1"),
  ("sft", "optimizer.learning_rate", float("nan"), "optimizer.learning_rate=nan: must be a "
                                                   "finite number"),
  ("sft", "optimizer.learning_rate", -1e-3, r"optimizer.learning_rate=-0.001: must be in \(0"),
  ("sft", "optimizer.learning_rate", 0.0, "optimizer.learning_rate=0.0"),
  ("sft", "optimizer.clip_norm", float("inf"), "optimizer.clip_norm=inf"),
  ("sft", "eval.batch_size", 0, "eval.batch_size=0"),
  ("sft", "eval.batch_size", -8, "eval.batch_size=-8"),
  ("sft", "eval.tau", 0.0, "eval.tau=0.0"),
  ("ar_rl", "rl.group_size", 0, "rl.group_size=0: must be >= 2"),
  ("ar_rl", "rl.group_size", 1, "rl.group_size=1"),
  ("rl", "train.micro_batches", 3, r"rows per step \(train.batch_size=4 x group_size=8\)"),
  ("opd", "opd.group_size", 0, "opd.group_size=0"),
  ("cft", "block_size", 0, "block_size=0"),
  ("cft", "diffusion.max_steps_per_block", 0, "diffusion.max_steps_per_block=0"),
  ("rerank", "rerank.batch_size", 0, "rerank.batch_size=0"),
  ("rerank", "rerank.batch_size", 2.5, "rerank.batch_size=2.5: must be an integer"),
])
def test_bad_field_is_named(config_name, field, value, message):
  config = importlib.import_module(config_name).get_config()
  section, name = field.rsplit(".", 1) if "." in field else (None, field)
  with config.unlocked():
    target = config if section is None else config[section]
    with target.ignore_type():
      target[name] = value
  with pytest.raises(ValueError, match=message):
    check_stage_config(config)


def test_a_config_without_a_section_is_checked_for_what_it_has():
  import types

  check_stage_config(types.SimpleNamespace(train=types.SimpleNamespace(steps=3)))
  with pytest.raises(ValueError, match="train.steps=0"):
    check_stage_config(types.SimpleNamespace(train=types.SimpleNamespace(steps=0)))


@pytest.mark.parametrize("variant", ["", "smoke"])
def test_table2_stage_configs_pass(variant):
  from gr2jax import reproduce

  table = importlib.import_module("table2").get_config(variant)
  for name in reproduce.STAGE_ORDER:
    check_stage_config(reproduce.stage_config(table, name, "/tmp/workdir"))
