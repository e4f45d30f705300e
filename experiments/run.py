"""gr2jax main: runs one stage of the Diffusion-GR2 recipe from a config file.

Usage:
  python experiments/run.py --config=data.py --workdir=workdir
  python experiments/run.py --config=experiments/configs/data.py --config.data.max_history=10

`--config` takes a path, or a bare file name looked up in `experiments/configs/`. Every config
file defines `get_config()` returning an `ml_collections.ConfigDict` whose `stage` field names the
stage to run (see STAGES); fields are locked, so a typo in `--config.<field>=...` is an error, not a
silently ignored override. Multi-host runs pass `--multihost` so `jax.distributed.initialize()`
joins the job.
"""

import os
import sys
import time

from absl import app, flags, logging
from ml_collections import config_flags

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_DIR = os.path.join(REPO_ROOT, "experiments", "configs")
if REPO_ROOT not in sys.path:
  sys.path.insert(0, REPO_ROOT)

_WORKDIR = flags.DEFINE_string("workdir", "workdir", "Directory for every artefact of the run.")
_MULTIHOST = flags.DEFINE_bool(
    "multihost", False, "Call jax.distributed.initialize() (multi-host GPU/TPU jobs only).")
_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Stage config: a path or a file name in experiments/configs/.",
    lock_config=True)


def _run_data(config, workdir):
  from gr2jax.data import pipeline

  return pipeline.run(config.data, workdir)


def _run_training(config, workdir):
  from gr2jax.train import loop, stages

  loop.resolve_workdir_paths(config, workdir)
  return loop.train(config, workdir, stages.STAGES[config.stage])


def _run_eval(config, workdir):
  import json

  from gr2jax import checkpoint
  from gr2jax.train import config_checks, loop

  if not config.eval.ckpt:
    raise app.UsageError("eval.py needs --config.eval.ckpt=<checkpoint or HF dir>")
  config_checks.check_stage_config(config)
  ckpt = config.eval.ckpt.format(workdir=workdir)
  ctx = loop.load_context(config, workdir)
  checkpoint.check_data_build(ckpt, ctx.data_build)  # the checkpoint's inputs are this build's
  ctx.model_config, params = loop.model_from_init(ckpt, ctx.tokenizer, None,
                                                  config.eval.block_size)
  out_dir = config.eval.out_dir or ckpt
  name = f"{config.eval.split}_tau{config.eval.tau:g}"
  if config.eval.block_size:
    name += f"_B{config.eval.block_size}"
  result = loop.run_evaluation(ctx, params, 0, name, out_dir)
  print(json.dumps({k: v for k, v in result.items() if k != "counts"}, indent=1))
  return result


def _run_teacher(config, workdir):
  from gr2jax.data import llm_teacher

  spec = llm_teacher.TeacherSpec(**{**config.teacher.to_dict(),
                                    "mesh": tuple(config.teacher.mesh)})
  return llm_teacher.run(spec, config.data, workdir)


def _run_table2(config, workdir):
  from gr2jax import reproduce

  sys.path.insert(0, CONFIG_DIR)  # reproduce imports each stage's config file
  return reproduce.run(config, workdir)


def _run_rerank(config, workdir):
  from gr2jax import rerank

  return rerank.run(config, workdir)


def _run_tables(config, workdir):
  from gr2jax import tables

  return getattr(tables, f"run_{config.stage}")(config, workdir)


STAGES = {
    "data": _run_data,
    "teacher": _run_teacher,
    "rerank": _run_rerank,
    "table3": _run_tables,
    "fig6": _run_tables,
    "table4": _run_tables,
    "table2": _run_table2,
    "sft": _run_training,
    "ar_rl": _run_training,
    "cft": _run_training,
    "opd": _run_training,
    "rl": _run_training,
    "eval": _run_eval,
}


def resolve_config_arg(argv: list[str]) -> list[str]:
  """Rewrites `--config=NAME` to `experiments/configs/NAME` when NAME is not an existing path.

  Args:
    argv: the command line.

  Returns:
    The command line with the config path resolved (unchanged when nothing matches).
  """
  out = []
  for arg in argv:
    if arg.startswith("--config="):
      value = arg[len("--config="):]
      path, sep, override = value.partition(":")
      if not os.path.exists(path) and os.path.exists(os.path.join(CONFIG_DIR, path)):
        arg = "--config=" + os.path.join(CONFIG_DIR, path) + sep + override
    out.append(arg)
  return out


def main(argv):
  del argv
  config = _CONFIG.value
  if config is None:
    raise app.UsageError("--config is required, e.g. --config=data.py (see experiments/configs/).")
  stage = config.get("stage")
  if stage not in STAGES:
    raise app.UsageError(f"config.stage={stage!r} is not a known stage; known: {sorted(STAGES)}")
  if _MULTIHOST.value:
    import jax

    jax.distributed.initialize()
  os.makedirs(_WORKDIR.value, exist_ok=True)
  logging.info("stage=%s workdir=%s", stage, os.path.abspath(_WORKDIR.value))
  start = time.perf_counter()
  STAGES[stage](config, _WORKDIR.value)
  logging.info("stage %s finished in %.1f s", stage, time.perf_counter() - start)


if __name__ == "__main__":
  app.run(main, argv=resolve_config_arg(sys.argv))
