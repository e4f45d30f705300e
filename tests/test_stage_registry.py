"""gr2jax/stage_registry.py: one declaration per training stage, from which the chain, the views,
the size checks, the recipes' loops and run.py's entries are derived.

1. The recipes' digests and config paths are pinned: the values below were computed before the
   registry replaced the hand-written tables, so existing workdirs and committed results keep
   matching. Changing a recipe on purpose changes them: recompute with `_digests()` and say why
   in the commit. Retiring a field at its default (cft.pivot_align, cft.answer_pair: listed in
   run_identity.ADDED_AT_DEFAULT) changes the ConfigDict's digest and no step digest.
2. A new stage is its declaration (stage_registry.STAGES), its settings class, its trainer
   (a loss builder registered where it is defined, train/stages.py `@trainer`) and its values
   per scale (recipes.py STAGE_VALUES): the toy stage below touches exactly those four and
   nothing else (README "How to extend"): no config file (experiments/run.py takes
   `--config=toy.py`), no shapes in experiments/plan.py (its presets derive them), no test pin
   (the pinned config paths below are the existing stages'; a new stage's are its settings
   class's fields).
"""

import dataclasses
import importlib
import json
import os

import pytest

from gr2jax import chain, files, recipe, recipes, run_identity, settings, stage_registry
from gr2jax import workdir as workdir_lib
from gr2jax.train import stages as train_stages

DIGESTS = {  # {variant: (the ConfigDict's digest, {step: its chain digest})}
  "tiny": ("1aea704a63156e6f", {
    "sft": "546696ecc6bdc320", "ar_rl": "106c2c97a5398953", "cft": "b27f55b13e296068",
    "opd": "d19eb85a950e9ba6", "rl": "694ae470c28f1a25"}),
  "smoke": ("0de52e9bfcdd213d", {
    "sft": "7e4b57c25866249f", "ar_rl": "42b5ad2cdb39ab90", "cft": "a706b6ab4d3aef57",
    "opd": "797521b7d11efc7b", "rl": "078e9e8810ec2897"}),
  "qwen3_8b": ("e1739a3695391740", {
    "convert": "c4f86e79238cdee7", "sft": "8d618b854d321391", "ar_rl": "3ac3cb6c86cee152",
    "cft": "776081a8795d1bb0", "opd": "18c28d3abd1a1335", "rl": "87b9cd8fe226ad08"}),
}
TRAIN = ("async_save", "batch_size", "eval_every", "keep", "limit", "micro_batches",
         "prepare_chunk", "probe_every", "probe_prompts", "restart", "save_every", "seed",
         "steps")
OPTIMIZER = ("b1", "b2", "clip_norm", "end_lr_factor", "eps", "learning_rate", "schedule",
             "total_steps", "warmup_steps", "weight_decay")
BLOCKS = {  # stage: (its block, the block's fields): --config.stages.<stage>.<block>.<field>
  "sft": ("", ()),
  "ar_rl": ("rl", ("alpha", "eps_high", "eps_low", "group_size", "speed_weight", "temperature",
                   "valid_weight")),
  "cft": ("cft", ("complementary", "eps", "rate_power")),
  "opd": ("opd", ("certainty", "context", "group_size", "objective", "rollout_tau",
                  "teacher_dtype", "temperature")),
  "rl": ("rl", ("alpha", "eps_high", "eps_low", "group_size", "rollout_tau", "speed_weight",
                "temperature", "valid_weight")),
}


def _flat(tree: dict, prefix: str = "") -> list[str]:
  out = []
  for key, value in tree.items():
    out += _flat(value, f"{prefix}{key}.") if isinstance(value, dict) else [prefix + key]
  return out


def _digests(variant: str, workdir: str) -> tuple[str, dict]:
  """(digest of the recipe's ConfigDict, its paths portable; run_identity.step_digests)."""
  c = recipes.config(variant, "table2")
  if variant.startswith("qwen3"):
    c.hf_dir = os.path.join(workdir, "hf")
  config = workdir_lib.portable(json.loads(json.dumps(c.to_dict(), default=str)), workdir)
  return files.json_digest(config), run_identity.step_digests(recipe.from_config(c), workdir)


@pytest.mark.parametrize("variant", list(DIGESTS))
def test_recipe_digests_are_pinned(variant, tmp_path):
  (tmp_path / "hf").mkdir()
  (tmp_path / "hf" / "config.json").write_text("{}")
  assert _digests(variant, str(tmp_path)) == DIGESTS[variant]


def _block(stage: str) -> tuple[str, tuple[str, ...]]:
  """(block, its fields) of a stage: BLOCKS' pin for the stages pinned there; for any other (a
  new stage) its declaration's block and its settings class's fields (the derived ones, those
  with a default, left out)."""
  if stage in BLOCKS:
    return BLOCKS[stage]
  spec = stage_registry.spec(stage)
  fields = () if spec.settings is None else tuple(
    name for name, _ in settings.declared(spec.settings))
  return spec.block, fields


def _check_stage_config_paths() -> None:
  paths = {p for p in _flat(recipes.config("tiny", "table2").to_dict()) if p.startswith("stages.")}
  want = set()
  for stage in stage_registry.names():
    block, fields = _block(stage)
    want |= {f"stages.{stage}.train.{f}" for f in TRAIN}
    want |= {f"stages.{stage}.optimizer.{f}" for f in OPTIMIZER}
    want |= {f"stages.{stage}.{block}.{f}" for f in fields}
  assert paths == want


def test_stage_config_paths_are_pinned():
  assert set(BLOCKS) == set(stage_registry.names())  # every stage of today pinned
  _check_stage_config_paths()


def _check_every_stage_has_a_trainer_values_and_a_config() -> None:
  from experiments import run

  names = stage_registry.names()
  assert set(train_stages.TRAINERS) == set(names) == set(recipes.STAGE_VALUES)
  for name in names:
    assert run.load_config(f"{name}.py").stage == name  # experiments/configs/stage.py
    spec = stage_registry.spec(name)
    assert spec.init is None or spec.init in names[:names.index(name)]
    assert train_stages.stage(name).diffusion == spec.diffusion


def test_every_stage_has_a_trainer_values_and_a_config():
  _check_every_stage_has_a_trainer_values_and_a_config()


def test_a_trainer_registers_once_for_a_declared_stage(monkeypatch):
  monkeypatch.setattr(train_stages, "TRAINERS", dict(train_stages.TRAINERS))
  with pytest.raises(ValueError, match="'cft' has a trainer already"):
    train_stages.trainer("cft")(train_stages._sft_loss)
  with pytest.raises(ValueError, match="'nope' is not a training stage"):
    train_stages.trainer("nope")(train_stages._sft_loss)
  del train_stages.TRAINERS["cft"]
  with pytest.raises(ValueError, match=r"stage 'cft' has no trainer: register its loss builder "
                                       r"with @trainer\('cft'\)"):
    train_stages.stage("cft")


def test_settings_check_their_fields_at_construction():
  with pytest.raises(ValueError, match=r"^rl.group_size=1 must be >= 2"):
    stage_registry.ARRLSettings(group_size=1)
  with pytest.raises(ValueError, match=r"^rl.speed_weight=-1.0 must be >= 0"):
    stage_registry.ARRLSettings(speed_weight=-1.0)
  with pytest.raises(ValueError, match=r"^cft.eps=1.0 must be in \[0.0, 1.0\)"):
    stage_registry.CFTSettings(eps=1.0)
  with pytest.raises(TypeError, match="cft.complementary must be a bool"):
    stage_registry.CFTSettings(complementary=1)
  with pytest.raises(ValueError, match=r"^stages.rl.rl.eps_low=2 must be in"):
    stage_registry.RLSettings.of({"eps_low": 2}, "stages.rl.rl.")


def test_rollout_settings_are_read_from_the_typed_block():
  r = recipes.get("tiny")
  rl = recipe.stage_config(r, "rl", "W").settings
  assert rl.rollout() == {"temperature": rl.temperature, "tau": rl.rollout_tau}
  assert recipe.stage_config(r, "ar_rl", "W").settings.rollout() == {"temperature": 1.0}
  opd = recipe.stage_config(r, "opd", "W").settings
  assert opd.rollout() == {"temperature": 1.0, "tau": 0.9}
  assert recipe.stage_config(r, "cft", "W").settings.rollout() == {}
  assert not hasattr(r.decode, "rollout_tau") and not hasattr(r.decode, "temperature")


# ---- a toy stage: the four places a new stage takes ------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class ToySettings(stage_registry.StageBlock):
  """The toy stage's own block: SFT's loss on `copies` rows per training row."""
  copies: int = settings.integer(2, doc="rows per training row", minimum=1)


def _toy_loss(ctx):
  """The toy stage's loss builder: SFT's loss."""
  return train_stages._sft_loss(ctx)


def _toy() -> object:
  return recipes._stage("toy", 3, 4, 3, 1e-3, 1)


def _toy_hf(s, lr_factor: float, divisor: int) -> None:
  del divisor
  s.optimizer.learning_rate = 1e-6 * lr_factor


@pytest.fixture
def toy_stage(monkeypatch):
  """The toy stage added after SFT, through the registries only."""
  entry = stage_registry.StageSpec("toy", init="sft", diffusion=False, block="toy",
                                   settings=ToySettings, rows_field="copies")
  registry = dict(stage_registry.STAGES)
  ordered = {"sft": registry.pop("sft"), "toy": entry, **registry}
  monkeypatch.setattr(stage_registry, "STAGES", ordered)  # 1. its declaration
  monkeypatch.setattr(train_stages, "TRAINERS", dict(train_stages.TRAINERS))
  train_stages.trainer("toy")(_toy_loss)  # 2. its trainer: `@trainer("toy")` on its loss builder
  monkeypatch.setitem(recipes.STAGE_VALUES, "toy",  # 3. its values per scale
                      recipes.StageValues(_toy, _toy_hf, smoke_rows=1))
  return entry  # 4. its settings class: ToySettings above


def test_a_toy_stage_is_its_registry_entry_settings_trainer_and_values(toy_stage, tmp_path):
  r = recipes.get("smoke")
  assert recipe.chain(r) == ("sft", "toy", "ar_rl", "cft", "opd", "rl")
  view = recipe.stage_config(r, "toy", str(tmp_path))
  assert view.settings == ToySettings(copies=1)  # the smoke value
  assert view.init == recipe.export(str(tmp_path), "sft") and view.replay_shrink is None
  assert view.to_dict()["toy"] == {"copies": 1}
  assert recipe.stage_config(recipes.get("qwen3_8b", hf_dir=_hf(tmp_path)), "toy",
                             "W").settings == ToySettings(copies=2)
  assert train_stages.stage("toy").make_loss is _toy_loss
  assert train_stages.stage("toy").make_prepare is None
  _check_every_stage_has_a_trainer_values_and_a_config()  # `--config=toy.py` without a file
  _check_stage_config_paths()  # no pin to add: the toy's paths are its settings class's
  from experiments import run

  assert run.load_config("toy.py:smoke").stages.toy.toy.copies == 1
  assert list(run_identity.step_digests(r, str(tmp_path))) == list(recipe.chain(r))
  c = recipes.config("", "table2")
  c.stages.toy.toy.copies = 0
  with pytest.raises(ValueError, match=r"stages.toy.toy.copies=0 must be >= 1"):
    recipe.from_config(c)
  c.stages.toy.toy.copies = 3  # 4 rows x 3 copies in 1 micro-batch, then in 5
  recipe.from_config(c)
  c.stages.toy.train.micro_batches = 5
  with pytest.raises(ValueError, match=r"12 rows per step .*x copies=3"):
    recipe.from_config(c)


def test_the_plan_gives_the_toy_stage_its_shapes(toy_stage, monkeypatch):
  """experiments/plan.py, loaded with the toy stage registered, plans it with no edit: its tiny
  preset's shapes from the recipe's values (copies 2: 8 prompts x 2 = 16 rows, as every stage's)
  and its loss as its trainer builds it."""
  from experiments import plan

  importlib.reload(plan)  # its stages and presets are read from the registry as it loads
  try:
    s = plan.PRESETS["tiny"]
    assert (s.batch_size["toy"], s.group["toy"], s.steps["toy"], s.rows("toy")) == (8, 2, 10, 16)
    assert plan.STAGES[:2] == ("sft", "toy") and "toy" not in plan.ON_POLICY
    stages = plan.train_stages(s)
    toy = stages["toy"]
    assert toy.rows == 16 and toy.config == s.model and toy.rollout is None
    assert toy.batch(16) == stages["sft"].batch(16)  # SFT's loss: SFT's fields
  finally:
    monkeypatch.undo()
    importlib.reload(plan)


def _hf(tmp_path) -> str:
  (tmp_path / "hf").mkdir(exist_ok=True)
  (tmp_path / "hf" / "config.json").write_text("{}")
  return str(tmp_path / "hf")


@pytest.mark.integration
def test_the_toy_stage_trains_in_a_tiny_chain(toy_stage, tmp_path):
  """The smoke recipe's data build, SFT and the toy stage, run by the chain."""
  c = recipes.config("smoke", "table2")
  c.data.users = 600
  c.data.eval_subset_size = 48
  c.eval.limit = 16
  c.eval.batch_size = 8
  for name in ("sft", "toy"):  # a multiple of the tests' 8 host devices
    c.stages[name].train.batch_size = 8
  r = recipe.from_config(c)
  chain.run_chain(r, str(tmp_path), upto="toy")
  meta = json.loads((tmp_path / "toy" / "export" / "gr2jax_metadata.json").read_text())
  assert meta["stage"] == "toy" and meta["kind"] == "ar"
