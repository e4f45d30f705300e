"""gr2jax/recipes.py: the smoke variant bounds every step, the teacher included."""

import pytest

from gr2jax import recipe as recipe_lib
from gr2jax import recipes


@pytest.mark.parametrize("variant", ["smoke", "qwen3_0_6b,smoke", "qwen3_8b,smoke"])
def test_the_smoke_teacher_is_one_batch_of_a_few_users(variant):
  """All users at an HF recipe's 512 tokens was ~9 h on 2 CPU cores: the smoke's teacher step is
  one batch of 8 users, at most 2 attempts and 128 tokens each, with a valid spec."""
  c = recipes.config(variant, "teacher")
  full = recipes.config(variant.replace("smoke", "").strip(",") or "tiny", "teacher").teacher
  t = c.teacher
  assert (t.num_users, t.batch_size) == (8, 8) and full.num_users in (0, 1000)
  assert t.attempts == min(full.attempts, 2) and t.max_new_tokens == min(full.max_new_tokens, 128)
  assert t.restart is False and c.data.strict_traces is True and c.table.remeasure is False
  recipe_lib.teacher_spec(recipe_lib.from_config(c))  # the spec checks its fields


def test_a_new_recipe_is_a_function_in_recipes(monkeypatch):
  """README, "How to extend": a function that edits the tiny recipe, under its name in
  RECIPES; every view then takes it, with ',smoke' too."""
  def toy(c):
    c.stages.cft.train.steps = 7

  monkeypatch.setitem(recipes.RECIPES, "toy", toy)
  c = recipes.config("toy,smoke", "cft")
  assert c.recipe == "toy" and c.stages.cft.train.steps == 2  # smoke shrinks after the recipe
  r = recipes.get("toy")
  assert r.name == "toy" and r.stages["cft"].train.steps == 7
  with pytest.raises(ValueError, match="unknown variant 'toys'"):
    recipes.config("toys")


@pytest.mark.parametrize("variant", ["", "smoke", "qwen3_8b"])
def test_every_setting_is_one_declared_documented_field(variant):
  """One settings style: every leaf of every config (each stage's, the tools' blocks included)
  is exactly one field declared on the schema (gr2jax/settings.py), with a one-line doc."""
  from experiments import run
  from gr2jax import settings

  for stage in run.STAGES:
    c = recipes.config(variant, stage)
    leaves = set(_leaves(c.to_dict()))
    lines = recipes.describe(c)
    described = [line.split(" = ")[0] for line in lines]
    assert len(described) == len(set(described)) and set(described) == leaves, stage
    for _, cls in recipes.schema(c):
      documented, total = settings.count_fields(cls)
      assert documented == total, cls


def _leaves(tree: dict, prefix: str = ""):
  for key, value in tree.items():
    if isinstance(value, dict):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield prefix + key
