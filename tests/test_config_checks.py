"""check_stage_config: every shipped recipe passes; each bad size or rate is a ValueError naming
its field, raised by recipe.from_config before anything is built."""

import types

import pytest

from gr2jax import recipe, recipes, stage_registry
from gr2jax.config_checks import check_stage_config

STAGE_CONFIGS = [(n, v) for n in ("sft", "ar_rl", "cft", "opd", "rl")
                 for v in ("", "smoke", "qwen3_8b", "qwen3_0_6b")]


@pytest.mark.parametrize("name,variant", STAGE_CONFIGS + [("eval", "")])
def test_shipped_recipes_pass(name, variant):
  recipe.from_config(recipes.config(variant, name))


@pytest.mark.parametrize("field,value,message", [
  ("stages.sft.train.steps", 0, r"stages.sft.train.steps=0 must be >= 1"),
  ("stages.sft.train.steps", -5, r"stages.sft.train.steps=-5"),
  ("stages.sft.train.micro_batches", 0, r"stages.sft.train.micro_batches=0"),
  ("stages.sft.train.micro_batches", 3, r"stages.sft.train.micro_batches=3 must be a divisor "
                                        r"of the 32 rows"),
  ("stages.sft.train.save_every", 0, r"stages.sft.train.save_every=0"),
  ("stages.sft.train.keep", 0, r"stages.sft.train.keep=0"),
  ("stages.sft.train.batch_size", 0, r"stages.sft.train.batch_size=0"),
  ("stages.sft.train.prepare_chunk", -1, r"stages.sft.train.prepare_chunk=-1"),
  ("stages.sft.optimizer.learning_rate", float("nan"),
   r"stages.sft.optimizer.learning_rate=nan must be finite"),
  ("stages.sft.optimizer.learning_rate", -1e-3,
   r"stages.sft.optimizer.learning_rate=-0.001 must be > 0"),
  ("stages.sft.optimizer.learning_rate", 0.0, r"stages.sft.optimizer.learning_rate=0.0"),
  ("stages.sft.optimizer.clip_norm", float("inf"), r"stages.sft.optimizer.clip_norm=inf"),
  ("eval.batch_size", 0, r"eval.batch_size=0"),
  ("eval.batch_size", -8, r"eval.batch_size=-8"),
  ("decode.eval_tau", 0.0, r"decode.eval_tau=0.0"),
  ("stages.ar_rl.rl.group_size", 0, r"stages.ar_rl.rl.group_size=0 must be >= 2"),
  ("stages.ar_rl.rl.group_size", 1, r"stages.ar_rl.rl.group_size=1"),
  ("stages.rl.train.micro_batches", 3,
   r"rows per step \(stages.rl.train.batch_size=4 x group_size=8\)"),
  ("stages.opd.opd.group_size", 0, r"stages.opd.opd.group_size=0"),
  ("stages.rl.rl.temperature", 0.0, r"stages.rl.rl.temperature=0.0"),
  ("stages.ar_rl.rl.temperature", -1.0, r"stages.ar_rl.rl.temperature=-1.0"),
  ("stages.rl.rl.rollout_tau", 0.0, r"stages.rl.rl.rollout_tau=0.0"),
  ("stages.rl.rl.rollout_tau", 1.5, r"stages.rl.rl.rollout_tau=1.5"),
  ("decode.block_size", 0, r"decode.block_size=0"),
  ("decode.max_steps_per_block", 0, r"decode.max_steps_per_block=0"),
])
def test_bad_field_is_named(field, value, message):
  config = recipes.config("", "table2")
  *path, name = field.split(".")
  target = config
  for part in path:
    target = target[part]
  with target.ignore_type():
    target[name] = value
  with pytest.raises(ValueError, match=message):
    recipe.from_config(config)


@pytest.mark.parametrize("value,message", [
  (0, "rerank.batch_size=0"), (2.5, "rerank.batch_size must be an int, got float 2.5")])
def test_bad_rerank_batch_size_is_named(value, message):
  config = recipes.config("", "rerank")  # what experiments/configs/rerank.py returns
  with config.rerank.ignore_type():
    config.rerank.batch_size = value
  with pytest.raises(ValueError, match=message):
    recipe.from_config(config)


def test_a_config_without_a_section_is_checked_for_what_it_has():
  check_stage_config(types.SimpleNamespace(train=types.SimpleNamespace(steps=3)))
  with pytest.raises(ValueError, match="train.steps=0"):
    check_stage_config(types.SimpleNamespace(train=types.SimpleNamespace(steps=0)))


@pytest.mark.parametrize("variant", ["", "smoke"])
def test_table2_stage_views_pass(variant):
  r = recipe.from_config(recipes.config(variant, "table2"))
  for name in stage_registry.names():
    check_stage_config(recipe.stage_config(r, name, "/tmp/workdir"))
