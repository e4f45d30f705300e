"""gr2jax main: runs one stage of the Diffusion-GR2 recipe from a config file.

Usage:
  python experiments/run.py --config=data.py --workdir=workdir
  python experiments/run.py --config=experiments/configs/data.py --config.data.max_history=10
  python experiments/run.py --config=cft.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B --workdir=W
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B --workdir=W

`--config=PATH[:VARIANT]` takes a path, or a bare file name looked up in `experiments/configs/`
(data.py, teacher.py, convert.py, eval.py, rerank.py, serve.py, table2.py, table3.py, table4.py,
fig6.py). A training stage has no file of its own: `<stage>.py` for any stage registered in
gr2jax/stage_registry.py (sft.py, ar_rl.py, cft.py, opd.py, rl.py) is
`experiments/configs/stage.py:<stage>[:VARIANT]`, the one config file of every training stage
(resolve_config); refusals show the flag as typed. Every config file is a view of a recipe
(gr2jax/recipes.py): `get_config(variant)` returns the recipe `variant` as an
`ml_collections.ConfigDict` whose `stage` field names the stage to run (see STAGES); fields are
locked, so a typo in `--config.<field>=...` is an error, not a silently ignored override. A
stage whose upstream steps are not done in the workdir with the same recipe stops with one line
naming them and the commands that make them (`--config.upstream=run` runs them first).
Multi-host runs pass `--multihost` so `jax.distributed.initialize()` joins the job: run the same
command on every host; jax finds the coordinator, process count and index itself on SLURM, Open
MPI (mpirun) and Cloud TPU pods (JAX_COORDINATOR_ADDRESS=host:port overrides the coordinator).
The recipe's `xla_flags` (e.g. the qwen3_* recipes' `--xla_gpu_enable_triton_gemm=false`) are
merged into XLA_FLAGS first, before JAX starts its backend (apply_xla_flags).
"""

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

from gr2jax import stage_registry

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO_ROOT, "experiments", "configs")
STAGE_CONFIG = os.path.join(CONFIG_DIR, "stage.py")  # every training stage's config file

_WORKDIR = flags.DEFINE_string("workdir", "workdir", "Directory for every artefact of the run.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Call jax.distributed.initialize() (multi-host GPU/TPU jobs only).")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Stage config PATH[:VARIANT]: a path, a file name in experiments/configs/, "
    "or <stage>.py for a training stage of gr2jax/stage_registry.py ("
    + ", ".join(f"{name}.py" for name in stage_registry.names())
    + ": experiments/configs/stage.py:<stage>); VARIANT a recipe of gr2jax/recipes.py "
    "(qwen3_8b, smoke, qwen3_8b,smoke).", lock_config=True)


def merge_xla_flags(current: str, flags) -> str:
  """XLA_FLAGS `current` with the recipe's `flags` ('--name=value') appended where absent.

  Raises:
    ValueError: `current` sets one of the flags to another value (naming both).
  """
  from gr2jax import recipe

  wanted = recipe.parse_xla_flags(flags)
  have = {}
  for entry in current.split():
    name, _, value = entry.lstrip("-").partition("=")
    have[name] = value or "true"
  for name, value in wanted.items():
    if name in have and have[name] != value:
      raise ValueError(f"XLA_FLAGS sets --{name}={have[name]}, the recipe's xla_flags "
                       f"--{name}={value}: drop one (--config.xla_flags=... or XLA_FLAGS)")
  added = [f"--{name}={value}" for name, value in wanted.items() if name not in have]
  return " ".join([current.strip(), *added]).strip()


def apply_xla_flags(flags) -> None:
  """Merges the recipe's XLA flags into os.environ['XLA_FLAGS'] (merge_xla_flags); XLA reads
  them when JAX starts its backend.

  Raises:
    RuntimeError: JAX's backend already started without them (they would be ignored).
  """
  current = os.environ.get("XLA_FLAGS", "")
  merged = merge_xla_flags(current, flags)
  if merged == current.strip():
    return
  from jax._src import xla_bridge  # backends_are_initialized: what jax.distributed checks too

  if xla_bridge.backends_are_initialized():
    raise RuntimeError(f"the recipe's xla_flags {list(flags)} are not in XLA_FLAGS={current!r} "
                       "and JAX's backend has already started: set XLA_FLAGS before JAX starts")
  os.environ["XLA_FLAGS"] = merged


def _recipe(config):
  from gr2jax import recipe

  return recipe.from_config(config)


def _run_data(config, workdir):
  from gr2jax import recipe
  from gr2jax.data import pipeline

  return pipeline.run(recipe.data_config(_recipe(config)), workdir)


def _run_step(config, workdir):
  from gr2jax import chain

  if config.stage == "teacher" and not config.teacher.hf_dir:
    raise app.UsageError("teacher.py needs --config.teacher.hf_dir=<a local HF Qwen3 dir or a "
                         "gr2jax checkpoint> (without it the recipe uses the rule teacher)")
  return chain.run_step(_recipe(config), config.stage, workdir, config.upstream)


def eval_checkpoint(evaluate, workdir: str) -> str:
  """The directory --config.evaluate.ckpt names (`{workdir}` filled in), checked before anything
  loads: a missing one is a UsageError naming the flag and the path."""
  if not evaluate.ckpt:
    raise app.UsageError("eval.py needs --config.evaluate.ckpt=<checkpoint or HF dir>")
  from gr2jax import workdir as workdir_lib

  ckpt = workdir_lib.fill_path(evaluate.ckpt, workdir)
  if not os.path.isdir(ckpt):
    what = "is not a directory" if os.path.exists(ckpt) else "does not exist"
    raise app.UsageError(f"--config.evaluate.ckpt: {ckpt} {what} (pass a gr2jax export or an "
                         "HF Qwen3 directory)")
  return ckpt


def _run_eval(config, workdir):
  import json

  from gr2jax import exports, recipe
  from gr2jax.tool_settings import EvaluateSettings
  from gr2jax.train import loop

  e = EvaluateSettings.of(config.evaluate, "evaluate.")
  ckpt = eval_checkpoint(e, workdir)
  r = _recipe(config)
  view = recipe.evaluation_config(r)
  ctx = loop.load_context(view, workdir)
  exports.check_data_build(ckpt, ctx.data_build)  # the checkpoint's inputs are this build's
  block_size = r.decode.block_size if e.convert else 0
  ctx.model_config, params = loop.model_from_init(ckpt, ctx.tokenizer, None, block_size)
  name = (f"{view.eval.split}_tau{view.decode.eval_tau:g}"
          + (f"_B{block_size}" if block_size else ""))
  result = loop.run_evaluation(ctx, params, 0, name, e.out_dir or ckpt)
  print(json.dumps({k: v for k, v in result.items() if k != "counts"}, indent=1))
  return result


def _run_table2(config, workdir):
  """The chain and Table 2 (gr2jax/apps/table2.py), then the recipe's `table.then` tables."""
  from gr2jax import recipe
  from gr2jax.apps import table2, tables

  r = _recipe(config)
  md = table2.run(r, workdir)
  for name in r.table.then:
    getattr(tables, f"run_{name}")(recipe.tables_config(r, name, workdir), workdir)
  return md


def _run_rerank(config, workdir):
  from gr2jax.apps import rerank

  return rerank.run(_recipe(config), config.rerank, workdir)


def _run_serve(config, workdir):
  from gr2jax.apps.serve import server

  return server.run(_recipe(config), config.serve, workdir)


def _run_tables(config, workdir):
  from gr2jax import recipe
  from gr2jax.apps import tables

  view = recipe.tables_config(_recipe(config), config.stage, workdir)
  return getattr(tables, f"run_{config.stage}")(view, workdir)


STAGES = {
    "data": _run_data,
    "teacher": _run_step,
    "rerank": _run_rerank,
    "serve": _run_serve,
    "table3": _run_tables,
    "fig6": _run_tables,
    "table4": _run_tables,
    "table2": _run_table2,
    "convert": _run_step,
    "eval": _run_eval,
    **{name: _run_step for name in stage_registry.names()},  # the training stages
}


def _config_parts(value: str) -> tuple[str, str, str | None]:
  """(directory, config name, variant or None) of a `--config` value as typed: `DIR/NAME.py`,
  `DIR/NAME.py:VARIANT` or, for a training stage, `DIR/stage.py:NAME[:VARIANT]`."""
  path, sep, variant = value.partition(":")
  directory, name = os.path.split(path)
  name = name.removesuffix(".py")
  if name == "stage" and sep:
    name, sep, variant = variant.partition(":")
  return directory, name, variant if sep else None


def upstream_commands(argv: list[str], missing: list[str]) -> str:
  """The commands that make the missing upstream steps: this command line with its config file
  swapped for each step's `<step>.py` (same directory, variant and overrides)."""
  commands = []
  for step in missing:
    args = []
    for arg in argv:
      if arg.startswith("--config="):
        directory, _, variant = _config_parts(arg[len("--config="):])
        arg = ("--config=" + os.path.join(directory, f"{step}.py")
               + ("" if variant is None else f":{variant}"))
      args.append(arg)
    commands.append(" ".join(["python", *args]))
  return " && ".join(commands)


def resolve_config(value: str) -> str:
  """The config file and config string that `--config=value` loads (the module docstring):
  an existing path as it is; else a file of experiments/configs/; else, where the file name is
  `<stage>.py` of a training stage (gr2jax/stage_registry.py), experiments/configs/stage.py with
  the stage first in its config string; else `value` unchanged (parse_flags refuses it).

  Args:
    value: PATH[:VARIANT], as typed.

  Returns:
    PATH[:CONFIG_STRING] for ml_collections' config_flags.
  """
  path, sep, variant = value.partition(":")
  if os.path.exists(path):
    return value
  if os.path.exists(os.path.join(CONFIG_DIR, path)):
    return os.path.join(CONFIG_DIR, path) + sep + variant
  name = os.path.basename(path)
  if name.endswith(".py") and name[:-3] in stage_registry.STAGES:
    return f"{STAGE_CONFIG}:{name[:-3]}" + sep + variant
  return value


def resolve_config_arg(argv: list[str]) -> list[str]:
  """The command line with each `--config=VALUE` resolved (resolve_config); every other
  argument unchanged."""
  return [("--config=" + resolve_config(arg[len("--config="):])) if arg.startswith("--config=")
          else arg for arg in argv]


def quiet_libraries() -> None:
  """Library INFO logs (absl, orbax: thousands of lines per run) off unless --verbosity or
  --v was given; warnings and errors still show."""
  if not (flags.FLAGS["verbosity"].present or flags.FLAGS["v"].present):
    logging.set_verbosity(logging.WARNING)


def load_config(value: str):
  """The config `--config=value` names (PATH[:VARIANT] as typed, resolve_config), loaded as
  config_flags loads it, without the command line's overrides."""
  import importlib.util

  path, sep, config_string = resolve_config(value).partition(":")
  spec = importlib.util.spec_from_file_location("gr2jax_config_file", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(config_string) if sep else module.get_config()


def _config_of(argv: list[str]):
  """The config of argv's `--config=VALUE` (load_config)."""
  return load_config(next(a for a in argv if a.startswith("--config="))[len("--config="):])


def unknown_override(argv: list[str]) -> str:
  """The one-line error of a `--config.<field>=...` naming a field the config lacks: the flag and
  the fields that level has."""
  config = _config_of(argv)
  for arg in argv:
    if not arg.startswith("--config."):
      continue
    path = arg[len("--config."):].partition("=")[0].split(".")
    node = config
    for i, part in enumerate(path):
      if not hasattr(node, "keys") or part not in node:
        where = ".".join(path[:i]) or "the config"
        fields = sorted(node.keys()) if hasattr(node, "keys") else []
        return (f"--config.{'.'.join(path[:i + 1])}: {where} has no field {part!r}"
                + (f"; its fields: {', '.join(fields)}" if fields else ""))
      node = node[part]
  return "a --config.<field> override names no field of the config"


def as_typed(line: str) -> str:
  """`line` with each resolved `--config=...` of this command line (sys.argv, resolve_config_arg)
  shown as the user typed it."""
  for typed, resolved in zip(sys.argv, resolve_config_arg(sys.argv), strict=True):
    if typed != resolved:
      line = line.replace(resolved, typed)
  return line


HELP_FLAGS = {"--help", "-h", "-?", "--helpshort", "--helpfull"}


def add_settings_help(argv: list[str]) -> None:
  """--help: every setting of the config (`--config=...` as given, else the tiny recipe's
  table2.py) appended to the usage, one line each from the schema (gr2jax/settings.py): its
  path, value, bounds and doc, what `--config.<path>=` overrides."""
  from gr2jax import recipes

  given = [a for a in argv if a.startswith("--config=")]
  config = _config_of(given) if given else recipes.config()
  lines = recipes.describe(config)
  sys.modules["__main__"].__doc__ = (
    f"{__doc__}\nSettings of {as_typed(given[0]) if given else '--config=table2.py'} "
    f"({len(lines)}; "
    "override any with --config.<path>=<value>):\n  " + "\n  ".join(lines) + "\n")


def parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing with one-line refusals, each showing `--config` as typed (as_typed):
  a config file that does not exist names the files and stages it may be; a config variant the
  config file does not know is `--config=PATH:VARIANT: unknown variant ...` (cli.parse_flags);
  an override of a field the locked config lacks is one line naming the flag and the allowed
  fields (config_flags raises an AttributeError there)."""
  from gr2jax import cli

  if HELP_FLAGS & set(argv):
    add_settings_help(argv)
  for arg in argv:
    path = arg[len("--config="):].partition(":")[0] if arg.startswith("--config=") else None
    if path and not os.path.exists(path):
      files = sorted(f for f in os.listdir(CONFIG_DIR) if f.endswith(".py") and f != "stage.py")
      raise SystemExit(as_typed(
        f"{arg}: no such config file (a path, one of experiments/configs/ {', '.join(files)}, "
        f"or <stage>.py of a training stage: {', '.join(stage_registry.names())})"))
  try:
    return cli.parse_flags(argv)
  except SystemExit as e:  # a refusal's line (str); --help's exit status (int) as it is
    if not isinstance(e.code, str):
      raise
    raise SystemExit(as_typed(e.code)) from None
  except (AttributeError, KeyError):
    raise SystemExit(unknown_override(argv)) from None


def check_workdir(workdir: str) -> None:
  """Creates the workdir; an existing path that is not a directory is a one-line error."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise SystemExit(f"--workdir={workdir}: exists and is not a directory (a workdir holds every "
                     "artefact of a run: pass a directory, new or used before)")
  os.makedirs(workdir, exist_ok=True)


def main(argv):
  del argv
  quiet_libraries()
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=data.py or --config=cft.py (see "
                         "--help)")
  stage = config.get("stage")
  if stage not in STAGES:
    raise app.UsageError(f"config.stage={stage!r} is not a known stage; known: {sorted(STAGES)}")
  check_workdir(_WORKDIR.value)
  apply_xla_flags(config.xla_flags)
  if _MULTIHOST.value:
    import jax

    jax.distributed.initialize()
  logging.info("stage=%s workdir=%s", stage, os.path.abspath(_WORKDIR.value))
  start = time.perf_counter()
  from gr2jax.chain import StepError, UpstreamMissing

  try:
    STAGES[stage](config, _WORKDIR.value)
  except UpstreamMissing as e:  # one line, no traceback: what is missing and how to make it
    raise SystemExit(f"{e} under {_WORKDIR.value}: run {upstream_commands(sys.argv, e.missing)} "
                     "(or add --config.upstream=run to run them first)") from None
  except StepError as e:  # a refusal that names what is wrong and the ways on
    raise SystemExit(str(e)) from None
  logging.info("stage %s finished in %.1f s", stage, time.perf_counter() - start)


if __name__ == "__main__":
  from gr2jax import cli

  cli.run(main, argv=resolve_config_arg(sys.argv), flags_parser=parse_flags)
