"""Tests for gr2jax/data/build_settings.py: the data build's and the teacher's blocks are the
recipes' (defaults, every recipe's values, records), bad values name their path, every field is
documented, the module stays light, and the data build's cache keys are the same whether it is
handed a ConfigDict or DataSettings."""

import subprocess
import sys

import pytest

from gr2jax import recipes, settings
from gr2jax.data import build_settings, llm_teacher, pipeline, prompts, rqvae
from gr2jax.data.build_settings import DataSettings, TeacherSettings

RECIPES = ("tiny", "qwen3_8b", "smoke")


def test_defaults_are_the_tiny_recipe():
  tiny = recipes.config("tiny")
  assert settings.defaults(DataSettings) == tiny.data.to_dict()
  assert settings.defaults(TeacherSettings) == tiny.teacher.to_dict()
  assert DataSettings().to_dict() == tiny.data.to_dict()


@pytest.mark.parametrize("variant", RECIPES)
def test_every_recipe_reads_back_with_the_same_dict(variant):
  config = recipes.config(variant)
  data = DataSettings.of(config.data.to_dict(), "data.")
  teacher = TeacherSettings.of(config.teacher.to_dict(), "teacher.")
  assert data.to_dict() == config.data.to_dict()
  assert teacher.to_dict() == config.teacher.to_dict()
  assert build_settings.data_settings(config.data) == data
  assert build_settings.data_settings(data) is data


@pytest.mark.parametrize("path, value, message", [
  ("rqvae.epochs", 0, r"data\.rqvae\.epochs=0 must be >= 1"),
  ("prompt.style", "x", r"data\.prompt\.style='x' not in \('chat', 'terse'\)"),
  ("prompt.fields", ("sid", "price"), r"data\.prompt\.fields\[1\]='price' not in"),
  ("retriever.decay", 1.5, r"data\.retriever\.decay=1\.5 must be in \[0\.0, 1\.0\]"),
  ("num_candidates", 1, r"data\.num_candidates=1 must be >= 2"),
  ("negative_pool", "popular", r"data\.negative_pool='popular' not in"),
  ("misspelt", 1, r"data\.misspelt is not a setting"),
])
def test_a_bad_data_value_names_its_path(path, value, message):
  values = recipes.config("tiny").data.to_dict()
  *blocks, name = path.split(".")
  block = values
  for b in blocks:
    block = block[b]
  block[name] = value
  with pytest.raises(ValueError, match=message):
    DataSettings.of(values, "data.")


def test_cross_field_rules():
  with pytest.raises(ValueError, match=r"data\.pool_size=5 must be >= data\.num_candidates - 1"):
    DataSettings(negative_pool="topk", pool_size=5)
  DataSettings(negative_pool="catalogue", pool_size=5)  # the pool size is topk's only
  with pytest.raises(ValueError, match=r"teacher\.attempts=2 with temperature 0: greedy"):
    TeacherSettings(temperature=0.0, attempts=2)
  with pytest.raises(ValueError, match=r"teacher\.top_p=0\.0 must be in \(0\.0, 1\.0\]"):
    TeacherSettings(top_p=0.0)


def test_every_field_is_documented():
  for cls in (DataSettings, TeacherSettings, rqvae.RQVAEConfig, prompts.PromptConfig,
              llm_teacher.TeacherSpec):
    documented, total = settings.count_fields(cls)
    assert documented == total > 0, cls.__name__


def test_the_consumers_classes_extend_the_blocks():
  data = DataSettings.of(recipes.config("qwen3_8b").data.to_dict(), "data.")
  rq = pipeline.rqvae_config(data)
  assert rq.to_dict() == {**data.rqvae.to_dict(), "hidden": (512, 256, 128),
                          "optimizer": "adam", "reset_fraction": 0.7}
  hash(rq)  # a jit static argument
  pc = prompts.prompt_config(data, answer_format="slot")
  assert pc.to_dict() == {**data.prompt.to_dict(), "answer_format": "slot",
                          "evidence_levels": 5}
  spec = llm_teacher.TeacherSpec(**TeacherSettings().to_dict(), mesh=(1, -1, 1))
  assert spec.to_dict() == {**TeacherSettings().to_dict(), "mesh": (1, -1, 1)}
  with pytest.raises(ValueError, match=r"teacher\.mesh=\(1, 1\) must be \(data, fsdp, tp\)"):
    spec.replace(mesh=(1, 1))


@pytest.mark.parametrize("variant", RECIPES)
def test_the_build_step_keys_are_the_same_for_a_configdict_and_data_settings(variant):
  config = recipes.config(variant).data
  data = DataSettings.of(config.to_dict(), "data.")
  parents = ("raw-key", "traces-digest", "sids-key")
  for key in (lambda c: pipeline._examples_key(c, parents[0]),
              lambda c: pipeline._embeddings_key(c, parents[0]),
              lambda c: pipeline._rqvae_key(c, parents[0]),
              lambda c: pipeline._tokenizer_key(c, *parents),
              lambda c: pipeline._tfds_key(c, *parents)):
    assert key(config) == key(data)
  assert pipeline.rqvae_config(config) == pipeline.rqvae_config(data)
  assert prompts.prompt_config(config) == prompts.prompt_config(data)


def test_resolve_workdir_gives_data_settings():
  config = recipes.config("tiny").data
  config.teacher_traces = "{workdir}/teacher/traces.jsonl"
  resolved = pipeline.resolve_workdir(config, "W")
  assert isinstance(resolved, DataSettings) and resolved.teacher_traces == "W/teacher/traces.jsonl"
  assert config.teacher_traces == "{workdir}/teacher/traces.jsonl"  # the caller's is untouched


def test_the_module_is_light():
  heavy = ("jax", "flax", "optax", "tensorflow", "tensorflow_datasets", "sklearn", "scipy",
           "transformers", "ml_collections")
  code = ("import sys, gr2jax.data.build_settings; "
          f"print(sorted(m for m in sys.modules if m.split('.')[0] in {heavy!r}))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
