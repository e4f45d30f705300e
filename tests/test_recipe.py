"""gr2jax/recipe.py: every stage of every recipe reads one data build, prompt and decode spec;
paths and the chain are derived once; the library never reaches into experiments/; a stage run
without its upstream names what is missing in one line."""

import ast
import dataclasses
import glob
import os
import subprocess
import sys

import pytest

from gr2jax import recipe as recipe_lib
from gr2jax import recipes, stage_registry
from gr2jax.data import lengths as lengths_lib
from gr2jax.decoding.spec import DecodeSpec

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGE_FILES = ("data", "convert", "sft", "ar_rl", "cft", "opd", "rl", "eval", "rerank", "serve",
               "table2", "table3", "table4", "fig6")


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A directory that passes as an HF dir for the config checks (no weights are read)."""
  d = tmp_path_factory.mktemp("hf")
  (d / "config.json").write_text("{}")
  return str(d)


def _config(file: str, variant: str = ""):
  """What `experiments/run.py --config=<file>.py:<variant>` loads (a training stage's file is
  experiments/configs/stage.py)."""
  from experiments import run

  return run.load_config(f"{file}.py:{variant}")


def _recipe(file: str, variant: str, hf_dir: str) -> recipe_lib.Recipe:
  config = _config(file, variant)
  if config.recipe != "tiny":
    config.hf_dir = hf_dir
  return recipe_lib.from_config(config)


@pytest.mark.parametrize("variant", ["", "smoke", *recipes.HF_SCALES, "qwen3_8b,smoke"])
def test_every_stage_reads_one_data_build_prompt_and_decode_spec(variant, hf_dir):
  """For each recipe: the stage views reached through every config file (cft.py:qwen3_8b is the
  CFT stage of qwen3_8b) share the data build, the prompt and the decode spec."""
  table = _recipe("table2", variant, hf_dir)
  data = recipe_lib.data_config(table).to_dict()
  for file in STAGE_FILES:
    r = _recipe(file, variant, hf_dir)
    assert dataclasses.replace(r, data=table.data) == table, file
    assert recipe_lib.data_config(r).to_dict() == data
  for stage in stage_registry.names():
    view = recipe_lib.stage_config(_recipe(stage, variant, hf_dir), stage, "W")
    assert view.data.to_dict() == data, stage
    assert view.data.prompt.to_dict() == data["prompt"], stage
    assert view.decode == table.decode, stage  # the one DecodeSpec, whole
  for name in ("table3", "table4", "fig6"):
    view = recipe_lib.tables_config(table, name, "W")
    assert view.data.to_dict() == data and view.decode == table.decode
  assert recipe_lib.evaluation_config(table).data.to_dict() == data
  assert recipe_lib.evaluation_config(table).decode == table.decode
  if table.name != "tiny":  # the paper's prompt (GR2, arXiv 2602.07774), the HF tokenizer
    assert data["prompt"]["style"] == "chat" and data["prompt"]["answer_format"] == "sid"
    assert data["prompt"]["history_items"] == 20 and data["tokenizer_base"] == hf_dir


def test_chain_paths_and_inits(hf_dir):
  tiny = _recipe("table2", "", hf_dir)
  assert recipe_lib.chain(tiny) == stage_registry.names()
  assert recipe_lib.init_of(tiny, "sft", "W") == "preset:tiny_deep"
  assert recipe_lib.init_of(tiny, "opd", "W") == os.path.join("W", "cft", "export")
  assert recipe_lib.stage_config(tiny, "opd", "W").settings.teacher == os.path.join("W", "ar_rl",
                                                                                "export")
  assert recipe_lib.upstream(tiny, "cft") == ("sft", "ar_rl")
  big = _recipe("table2", "qwen3_8b", hf_dir)
  assert recipe_lib.chain(big)[0] == recipe_lib.CONVERT
  assert recipe_lib.init_of(big, "sft", "W") == os.path.join("W", "convert", "export")
  assert recipe_lib.upstream(big, "sft") == ("convert",)
  with pytest.raises(ValueError, match="not a step"):
    recipe_lib.upstream(tiny, "convert")


def test_an_llm_teacher_is_the_chains_first_step_and_the_data_builds_traces(hf_dir):
  """teacher.hf_dir set: the teacher step runs first and every stage's data build reads its
  traces (W/teacher/traces.jsonl, {workdir} resolved by the pipeline); the teacher itself reads
  the build without traces; traces given twice are refused."""
  from gr2jax.data import pipeline

  config = _config("table2", "qwen3_8b")
  config.hf_dir, config.teacher.hf_dir = hf_dir, "/models/Qwen3-32B"
  r = recipe_lib.from_config(config)
  assert recipe_lib.chain(r)[:2] == (recipe_lib.TEACHER, recipe_lib.CONVERT)
  assert recipe_lib.upstream(r, "sft") == (recipe_lib.TEACHER, recipe_lib.CONVERT)
  assert recipe_lib.data_config(r, traces=False).teacher_traces == ""
  for stage in stage_registry.names():
    data = recipe_lib.stage_config(r, stage, "W").data
    assert pipeline.resolve_workdir(data, "W").teacher_traces == os.path.join(
      "W", "teacher", "traces.jsonl")
  spec = recipe_lib.teacher_spec(r)
  assert (spec.hf_dir, spec.prompt, spec.mesh) == ("/models/Qwen3-32B", "chat", (1, -1, 1))
  assert recipe_lib.teacher_spec(_recipe("table2", "", hf_dir)).prompt == "data"  # tiny: own
  config.data.teacher_traces = "traces.jsonl"
  with pytest.raises(ValueError, match="both set"):
    recipe_lib.from_config(config)


def test_hf_recipe_needs_an_hf_dir(tmp_path):
  config = _config("cft", "qwen3_4b")
  r = recipe_lib.from_config(config)  # the settings are readable (the AOT plan reads them)
  with pytest.raises(ValueError, match="--config.hf_dir"):
    recipe_lib.stage_config(r, "cft", "W")
  config.hf_dir = str(tmp_path)
  with pytest.raises(FileNotFoundError, match="no config.json"):
    recipe_lib.from_config(config)
  tiny = _config("cft")
  tiny.data.tokenizer_base = str(tmp_path)
  with pytest.raises(ValueError, match="hf_dir"):
    recipe_lib.from_config(tiny)
  assert isinstance(recipe_lib.from_config(_config("sft")).decode,
                    DecodeSpec)


def test_lengths_round_up_the_builds_longest():
  assert lengths_lib.static_lengths({"static_lengths": {"prompt": 57, "response": 36}}) == (64, 48)
  assert lengths_lib.static_lengths({"static_lengths": {"prompt": 64, "response": 0}}) == (64, 16)


def _imports(path: str) -> list[str]:
  tree = ast.parse(open(path).read(), path)
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names += [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.append(node.module)
  return names


def test_library_never_imports_or_loads_experiments():
  files = glob.glob(os.path.join(REPO, "gr2jax", "**", "*.py"), recursive=True)
  assert len(files) > 40
  for path in files:
    bad = [n for n in _imports(path) if n.split(".")[0] in ("experiments", "weights_conversion")]
    assert not bad, f"{path} imports {bad}"
    tree = ast.parse(open(path).read())
    parts = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
             and n.value in ("experiments", "configs", "weights_conversion")]
    assert not parts, f"{path} builds a path into {parts}"
    assert "sys.path" not in open(path).read(), f"{path} edits sys.path"


def test_stage_without_upstream_names_it_in_one_line(tmp_path):
  result = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", "run.py"), "--config=cft.py",
     f"--workdir={tmp_path}", "--config.stages.cft.train.steps=3"],
    capture_output=True, text=True, cwd=REPO, timeout=120,
    env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode != 0
  assert "Traceback" not in result.stderr
  lines = [line for line in result.stderr.splitlines() if "needs" in line]
  assert len(lines) == 1, result.stderr
  line = lines[0]
  assert line.startswith("cft needs sft, ar_rl done first") and "--config.upstream=run" in line
  for step in ("sft", "ar_rl"):  # the exact commands, with the same overrides
    assert f"--config={step}.py" in line
  assert line.count("--config.stages.cft.train.steps=3") == 2
  assert not os.path.exists(tmp_path / "cft")


def test_xla_flags_are_the_recipes_and_checked(hf_dir):
  assert _recipe("sft", "", hf_dir).xla_flags == ()
  for name in recipes.HF_SCALES:  # the measured H100 Triton tiling failure (gr2jax/recipes.py)
    assert _recipe("rl", name, hf_dir).xla_flags == ("--xla_gpu_enable_triton_gemm=false",)
  assert recipe_lib.parse_xla_flags(["--xla_gpu_enable_triton_gemm=false", "--xla_dump_to=/d"]) \
    == {"xla_gpu_enable_triton_gemm": "false", "xla_dump_to": "/d"}
  for bad, match in ((["xla_gpu_enable_triton_gemm=false"], "expected '--xla_<name>=<value>'"),
                     (["--xla_a=1", "--xla_a=2"], "twice")):
    with pytest.raises(ValueError, match=match):
      recipe_lib.parse_xla_flags(bad)
  config = _config("sft")
  config.xla_flags = ("--triton=off",)
  with pytest.raises(ValueError, match="xla_flags entry '--triton=off'"):
    recipe_lib.from_config(config)


# ---- every setting is checked when the recipe is typed (gr2jax/settings.py) -------------------

STAGE_CONFIGS = [(n, v) for n in ("sft", "ar_rl", "cft", "opd", "rl")
                 for v in ("", "smoke", "qwen3_8b", "qwen3_0_6b")]


@pytest.mark.parametrize("name,variant", STAGE_CONFIGS + [("eval", "")])
def test_shipped_recipes_type(name, variant):
  recipe_lib.from_config(recipes.config(variant, name))


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
    recipe_lib.from_config(config)


def test_table3_must_decode_under_the_recipes_own_commit_order():
  config = recipes.config("", "table2")
  config.table.commit_orders = ("confidence",)  # the tiny recipe decodes 'distinct'
  with pytest.raises(ValueError, match=r"^table\.commit_orders=\('confidence',\) must hold "
                     r"decode\.commit_order='distinct'"):
    recipe_lib.from_config(config)
  config.decode.commit_order = "confidence"
  assert recipe_lib.from_config(config).table.commit_orders == ("confidence",)
  config.table.commit_orders = ()  # the default: the recipe's own order alone
  r = recipe_lib.from_config(config)
  assert recipe_lib.tables_config(r, "table3", "W").commit_orders == ("confidence",)


def test_a_block_it_does_not_declare_is_named():
  config = recipes.config("", "table2")
  with config.stages.sft.train.ignore_type():
    config.stages.sft.train.unlock()
    config.stages.sft.train.stepz = 3
  with pytest.raises(ValueError, match=r"stages.sft.train.stepz is not a setting"):
    recipe_lib.from_config(config)
