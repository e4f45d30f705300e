"""Every config file is a view of every recipe (gr2jax/recipes.py) and resolves, and so is every
training stage's `--config=<stage>.py` (experiments/configs/stage.py); the qwen3_8b stages build
their model, optimiser state and shardings abstractly (no parameter allocated)."""

import glob
import os

import jax
import pytest

from experiments import run
from gr2jax import recipe as recipe_lib
from gr2jax import recipes, stage_registry
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import optim
from gr2jax.train import state as state_lib

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs")
# The config files (stage.py as each training stage's <stage>.py), by the name run.py takes.
NAMES = sorted([*(os.path.basename(p) for p in glob.glob(os.path.join(CONFIG_DIR, "*.py"))
                  if os.path.basename(p) != "stage.py"),
                *(f"{stage}.py" for stage in stage_registry.names())])
VARIANTS = ["", "smoke", *recipes.RECIPES, "qwen3_0_6b,smoke"]


@pytest.mark.parametrize("name", NAMES)
def test_config_loads_and_resolves(name):
  for variant in VARIANTS:
    config = run.load_config(f"{name}:{variant}")
    assert config.stage in run.STAGES, f"{name} names an unknown stage {config.stage!r}"
    config.to_dict()  # every field_reference resolves
    assert recipe_lib.from_config(config).name == (variant.split(",")[0].replace("smoke", "")
                                                   or "tiny")
  with pytest.raises(ValueError, match="unknown variant"):
    run.load_config(f"{name}:nope")


def test_a_training_stage_is_stage_py_with_its_name():
  for stage in stage_registry.names():
    assert run.load_config(f"{stage}.py").stage == stage
    assert run.load_config(f"stage.py:{stage}:qwen3_8b").to_dict() == (
      recipes.config("qwen3_8b", stage).to_dict())
  with pytest.raises(ValueError, match=r"'nope' is not a training stage; expected "
                                       r"stage.py:STAGE\[:VARIANT\]"):
    run.load_config("stage.py:nope")


@pytest.mark.parametrize("name", ["sft", "cft", "opd", "rl"])
def test_qwen3_8b_variant_builds_abstractly(name):
  config = run.load_config(f"{name}.py:qwen3_8b")
  stage = config.stages[name]
  model = ModelConfig.qwen3_8b(param_dtype=config.model.param_dtype, remat=config.model.remat,
                               attention_chunk_bytes=config.model.attention_chunk_bytes)
  optimizer = optim.make_optimizer(stage.optimizer)
  abstract = state_lib.abstract_state(abstract_params(model), optimizer)
  assert abstract.params["embed"].dtype == jax.numpy.bfloat16
  moments = [x for x in jax.tree.leaves(abstract.opt_state) if x.ndim]
  assert moments and all(x.dtype == jax.numpy.float32 for x in moments)  # fp32 moments
  mesh = mesh_lib.make_mesh(fsdp=4, tp=2)
  shardings = state_lib.state_shardings(model, abstract, mesh)
  assert shardings.params["layers"]["q"].spec[1] == "fsdp"
  assert stage.train.batch_size % stage.train.micro_batches == 0
