"""Every config file is a view of every recipe (gr2jax/recipes.py) and resolves; the
qwen3_8b stages build their model, optimiser state and shardings abstractly (no parameter
allocated)."""

import glob
import importlib
import os
import sys

import jax
import pytest

from experiments import run
from gr2jax import recipe as recipe_lib
from gr2jax import recipes
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import optim
from gr2jax.train import state as state_lib

CONFIG_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "configs")
sys.path.insert(0, CONFIG_DIR)  # the config files, imported by name

NAMES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(CONFIG_DIR, "*.py")))
VARIANTS = ["", "smoke", *recipes.RECIPES, "qwen3_0_6b,smoke"]


@pytest.mark.parametrize("name", NAMES)
def test_config_loads_and_resolves(name):
  module = importlib.import_module(name)
  for variant in VARIANTS:
    config = module.get_config(variant)
    assert config.stage in run.STAGES, f"{name}.py names an unknown stage {config.stage!r}"
    config.to_dict()  # every field_reference resolves
    assert recipe_lib.from_config(config).name == (variant.split(",")[0].replace("smoke", "")
                                                   or "tiny")
  with pytest.raises(ValueError, match="unknown variant"):
    module.get_config("nope")


@pytest.mark.parametrize("name", ["sft", "cft", "opd", "rl"])
def test_qwen3_8b_variant_builds_abstractly(name):
  config = importlib.import_module(name).get_config("qwen3_8b")
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
