"""Tests for experiments/run.py: config resolution, locked configs, unknown stages, and the
README's `--config=eval.py` command run end to end on a tiny export."""

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from gr2jax import recipes

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(REPO, "experiments", "run.py")


@pytest.fixture(scope="module")
def run_module():
  """experiments/run.py as one module object (its absl flags may be defined only once per
  process, and tests/experiments/test_configs.py imports it as `experiments.run`)."""
  from experiments import run
  return run


def test_bare_config_name_resolves_to_configs_dir(run_module):
  argv = run_module.resolve_config_arg(["run.py", "--config=data.py", "--workdir=w"])
  assert argv[1] == "--config=" + os.path.join(REPO, "experiments", "configs", "data.py")
  assert argv[2] == "--workdir=w"


def test_a_training_stage_resolves_to_stage_py_with_its_name(run_module):
  """`<stage>.py` of any registered stage, bare or under a directory (an upstream command built
  from `--config=experiments/configs/rl.py`), is stage.py with the stage in its config string."""
  stage_py = os.path.join(REPO, "experiments", "configs", "stage.py")
  assert run_module.resolve_config("cft.py") == f"{stage_py}:cft"
  assert run_module.resolve_config("cft.py:qwen3_8b,smoke") == f"{stage_py}:cft:qwen3_8b,smoke"
  assert run_module.resolve_config("experiments/configs/rl.py:smoke") == f"{stage_py}:rl:smoke"
  assert run_module.resolve_config("stage.py:opd") == f"{stage_py}:opd"
  assert run_module.resolve_config("nope.py:smoke") == "nope.py:smoke"  # refused by parse_flags
  assert not os.path.exists(os.path.join(REPO, "experiments", "configs", "cft.py"))


def test_upstream_commands_name_each_steps_file_as_the_user_would(run_module):
  for typed, want in (("--config=rl.py:smoke", "--config=opd.py:smoke"),
                      ("--config=stage.py:rl:smoke", "--config=opd.py:smoke"),
                      ("--config=configs/rl.py", "--config=configs/opd.py")):
    argv = ["experiments/run.py", typed, "--workdir=W", "--config.eval.limit=4"]
    assert run_module.upstream_commands(argv, ["opd"]) == (
      f"python experiments/run.py {want} --workdir=W --config.eval.limit=4")


def test_existing_path_and_other_args_unchanged(run_module, tmp_path):
  path = tmp_path / "mine.py"
  path.write_text("")
  argv = ["run.py", f"--config={path}", "--config.data.seed=3"]
  assert run_module.resolve_config_arg(argv) == argv


def _refusal(result: subprocess.CompletedProcess) -> str:
  """The refusal's line: the last of stderr (JAX and its plugins may log platform notes, e.g. a
  compile-only CUDA plugin finding no driver, before it)."""
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
  return result.stderr.strip().splitlines()[-1]


def _run(*args):
  return subprocess.run(
      [sys.executable, RUN, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_config_typo_is_an_error(tmp_path):
  result = _run("--config=data.py", "--config.data.max_histroy=3", f"--workdir={tmp_path}")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert "--config.data.max_histroy: data has no field 'max_histroy'; its fields: " in (
    result.stderr) and "max_history" in result.stderr


def test_a_misspelt_config_variant_is_one_line_naming_the_known_ones(tmp_path):
  """The recipe's refusal (recipes.parse_variant), not ml_collections' quoted traceback under
  absl's 'FATAL Flags parsing error' (cli.parse_flags); nothing is made in the workdir."""
  result = _run("--config=cft.py:tinyy", f"--workdir={tmp_path / 'W'}")
  assert result.returncode == 1 and result.stdout == ""
  assert _refusal(result) == (  # the flag as typed, not the file it resolved to
    "--config=cft.py:tinyy: unknown variant 'tinyy'; expected RECIPE[,smoke] with RECIPE in "
    "['tiny', 'qwen3_0_6b', 'qwen3_1_7b', 'qwen3_4b', 'qwen3_8b'], or 'smoke'")
  assert not (tmp_path / "W").exists()


def test_a_config_that_is_no_file_and_no_stage_is_one_line_naming_both(tmp_path):
  result = _run("--config=cfft.py", f"--workdir={tmp_path / 'W'}")
  line = _refusal(result)
  assert line.startswith("--config=cfft.py: no such config file (a path, one of "
                         "experiments/configs/ convert.py, data.py,")
  assert line.endswith("or <stage>.py of a training stage: sft, ar_rl, cft, opd, rl)")
  assert not (tmp_path / "W").exists()


def test_help_names_every_training_stage_and_every_setting():
  result = _run("--config=cft.py:qwen3_8b", "--help")  # the README's; absl prints the help
  assert "Traceback" not in result.stderr, result.stderr[-2000:]
  text = " ".join(result.stdout.split())
  assert "--config: Stage config PATH[:VARIANT]" in text
  assert "(sft.py, ar_rl.py, cft.py, opd.py, rl.py: experiments/configs/stage.py:<stage>)" in text
  # each setting from the schema: its path, this config's value, bounds and doc
  count = len(recipes.describe(recipes.config("qwen3_8b", "cft")))
  assert count > 200  # every block's settings, the stages', the tables' and the tools'
  assert (f"Settings of --config=cft.py:qwen3_8b ({count}; override any with "
          "--config.<path>=<value>)") in text
  assert ("stages.opd.opd.teacher_dtype = 'bfloat16' (one of ('float32', 'bfloat16')) storage "
          "of the cached teacher log-probs") in text
  assert "stages.cft.train.steps = 860 (int >= 1) optimiser steps" in text


def test_unknown_stage_is_an_error(tmp_path):
  config = tmp_path / "bad.py"
  config.write_text(
      "import ml_collections\n\n"
      "def get_config():\n  return ml_collections.ConfigDict({'stage': 'nope'})\n")
  result = _run(f"--config={config}", f"--workdir={tmp_path}")
  assert result.returncode != 0
  assert "nope" in result.stderr


def test_merge_xla_flags_appends_the_recipes_and_refuses_a_conflict(run_module):
  merge = run_module.merge_xla_flags
  flag = "--xla_gpu_enable_triton_gemm=false"
  assert merge("", [flag]) == flag
  assert merge("--xla_force_host_platform_device_count=8", [flag]) == (
    f"--xla_force_host_platform_device_count=8 {flag}")
  assert merge(f" {flag} ", [flag]) == flag and merge("--xla_a=1", []) == "--xla_a=1"
  with pytest.raises(ValueError, match="XLA_FLAGS sets --xla_gpu_enable_triton_gemm=true, the "
                                       "recipe's xla_flags --xla_gpu_enable_triton_gemm=false"):
    merge("--xla_gpu_enable_triton_gemm", [flag])


def test_xla_flags_after_the_backend_started_are_an_error(run_module, monkeypatch):
  import jax

  jax.devices()  # the backend has started (with conftest's XLA_FLAGS)
  current = os.environ.get("XLA_FLAGS", "")
  monkeypatch.setenv("XLA_FLAGS", current)
  run_module.apply_xla_flags([])  # nothing new: fine
  with pytest.raises(RuntimeError, match="backend has already started"):
    run_module.apply_xla_flags(["--xla_gpu_enable_triton_gemm=false"])
  assert os.environ["XLA_FLAGS"] == current


def test_the_gpu_flag_is_set_before_the_cpu_backend_starts_and_accepted():
  # XLA parses every platform's flags (it aborts on an unknown one): a qwen3_* recipe's GPU
  # flag is harmless on a CPU-only run.
  code = ("from experiments import run; import os, jax; "
          "run.apply_xla_flags(['--xla_gpu_enable_triton_gemm=false']); "
          "print(os.environ['XLA_FLAGS']); print(float(jax.numpy.ones(3).sum()))")
  result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                          timeout=120, env={**os.environ, "XLA_FLAGS": "", "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 0, result.stderr[-2000:]
  assert result.stdout.split("\n")[:2] == ["--xla_gpu_enable_triton_gemm=false", "3.0"]


def test_a_workdir_that_is_a_file_is_one_line(run_module, tmp_path):
  path = tmp_path / "a_file"
  path.write_text("")
  with pytest.raises(SystemExit, match=f"--workdir={path}: exists and is not a directory"):
    run_module.check_workdir(str(path))
  run_module.check_workdir(str(tmp_path / "new" / "W"))
  assert (tmp_path / "new" / "W").is_dir()


def test_an_unknown_override_names_the_flag_and_the_fields(run_module):
  argv = run_module.resolve_config_arg(["run.py", "--config=teacher.py", "--config.data.seed=3",
                                        "--config.teacher.out_dir=x"])
  message = run_module.unknown_override(argv)
  assert message.startswith("--config.teacher.out_dir: teacher has no field 'out_dir'; its "
                            "fields: attempts, batch_size, hf_dir,")
  argv[-1] = "--config.tacher.hf_dir=x"
  assert run_module.unknown_override(argv).startswith(
    "--config.tacher: the config has no field 'tacher'; its fields: data, decode,")


def test_a_missing_eval_checkpoint_names_the_flag_and_the_path(run_module, tmp_path):
  import ml_collections
  from absl import app

  evaluate = ml_collections.ConfigDict({"ckpt": "{workdir}/cft/export"})
  with pytest.raises(app.UsageError) as e:
    run_module.eval_checkpoint(evaluate, str(tmp_path))
  assert str(e.value) == (f"--config.evaluate.ckpt: {tmp_path}/cft/export does not exist (pass a "
                          "gr2jax export or an HF Qwen3 directory)")
  (tmp_path / "cft").mkdir()
  (tmp_path / "cft" / "export").write_text("")
  with pytest.raises(app.UsageError, match="cft/export is not a directory"):
    run_module.eval_checkpoint(evaluate, str(tmp_path))
  (tmp_path / "cft" / "export").unlink()
  (tmp_path / "cft" / "export").mkdir()
  assert run_module.eval_checkpoint(evaluate, str(tmp_path)) == f"{tmp_path}/cft/export"


def test_an_eval_checkpoint_path_with_braces_is_filled_literally(run_module, tmp_path):
  """A workdir named run{1} and a '{checkout}' copied from a run record: IndexError / KeyError
  tracebacks from str.format before workdir.fill_path."""
  import ml_collections

  workdir = tmp_path / "run{1}"
  (workdir / "cft" / "export{0}").mkdir(parents=True)
  evaluate = ml_collections.ConfigDict({"ckpt": "{workdir}/cft/export{0}"})
  assert run_module.eval_checkpoint(evaluate, str(workdir)) == f"{workdir}/cft/export{{0}}"
  evaluate.ckpt = "{checkout}/experiments"
  assert run_module.eval_checkpoint(evaluate, str(workdir)).endswith("/experiments")


def test_eval_py_with_a_missing_checkpoint_is_one_line_before_the_data_loads(tmp_path):
  """No data build is made and no stage is blamed: the line names the flag and the path."""
  missing = tmp_path / "W" / "cft" / "export"
  result = _run("--config=eval.py", f"--workdir={tmp_path / 'W'}",
                f"--config.evaluate.ckpt={missing}")
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
    f"--config.evaluate.ckpt: {missing} does not exist (pass a gr2jax export or an HF Qwen3 "
    "directory)")
  assert os.listdir(tmp_path / "W") == []


def _data_overrides(data_dir) -> dict[str, object]:
  """{field: value} of a small synthetic data build (tests/data/test_pipeline.py's: 160 users,
  300 items, a SID file), each a `--config.<field>=<value>` of the command line."""
  from tests.data.test_pipeline import _config

  small = _config(data_dir, data_dir / "sids.npy")
  fields = ("data_dir", "sids_file", "eval_subset_size", "accept_position_leak", "rejection",
            "embedding_dim", "tokenizer_vocab_size", "tokenizer_sample")
  return {f"data.{f}": small[f] for f in fields}


def _tiny_export(config, workdir: str, path: str) -> None:
  """A fresh tiny block-diffusion model of the data build of `config` (built here, in
  `workdir`), saved at `path` with its data build recorded, as a stage exports it."""
  from gr2jax import exports, recipe
  from gr2jax.data import pipeline, prompts
  from gr2jax.data import tokenizer as tokenizer_lib
  from gr2jax.train import loop

  r = recipe.from_config(config)
  data = recipe.data_config(r)
  summary = pipeline.run(data, workdir)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  view = recipe.stage_config(r, "cft", workdir)
  model_config, params = loop.model_from_init("preset:tiny", tok, view.train,
                                              r.decode.block_size)
  exports.save(path, model_config, params, metadata={
    "data_build": exports.data_build_record(tok, prompts.prompt_config(data))})


def test_eval_py_runs_as_the_readme_writes_it(tmp_path):
  """`python experiments/run.py --config=eval.py --workdir=W --config.evaluate.ckpt=W/cft/export`
  (README) on a tiny random diffusion export of a small data build (built first, reused by the
  command): the evaluation's result is printed and written next to the checkpoint."""
  from gr2jax import recipes
  from gr2jax.data import rqvae
  from tests.data.test_pipeline import NUM_ITEMS, _write_dataset

  data_dir = tmp_path / "beauty"
  data_dir.mkdir()
  _write_dataset(data_dir)
  codes = np.random.default_rng(0).integers(0, 16, size=(NUM_ITEMS, 3))
  rqvae.save_sids(data_dir / "sids.npy", rqvae.semantic_ids(codes))
  overrides = {**_data_overrides(data_dir), "eval.limit": 4, "eval.batch_size": 4}
  config = recipes.config("", "eval")
  for field, value in overrides.items():
    section, name = field.split(".")
    config[section][name] = value
  _tiny_export(config, str(tmp_path / "W"), str(tmp_path / "W" / "cft" / "export"))

  env = {**os.environ, "XLA_FLAGS": "--xla_backend_optimization_level=0",  # one device
         "GR2JAX_PROGRESS": "0"}
  result = subprocess.run(
    [sys.executable, RUN, "--config=eval.py", "--workdir=W", "--config.evaluate.ckpt=W/cft/export",
     *[f"--config.{field}={value}" for field, value in overrides.items()]],
    capture_output=True, text=True, cwd=tmp_path, env=env, timeout=600)
  assert result.returncode == 0, result.stderr[-4000:]
  written = glob.glob(str(tmp_path / "W" / "cft" / "export" / "eval_test_1615_tau*.json"))
  assert len(written) == 1, os.listdir(tmp_path / "W" / "cft" / "export")
  saved = json.load(open(written[0]))
  assert saved["num"] == 4 and 0 <= saved["R@1"] <= 1
  printed = json.loads(result.stdout[result.stdout.rindex("\n{\n") + 1:])  # the last lines
  assert printed["num"] == 4 and printed["R@1"] == saved["R@1"]
