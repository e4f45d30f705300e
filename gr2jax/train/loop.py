"""The one training loop every stage runs: resume or initialise, step, log, save, evaluate, export.

Layout under the run's workdir:
  workdir/data-.../, tokenizer-.../, tfds-.../   the data build (cached, shared by stages)
  workdir/<stage>/checkpoints/<step>/             orbax run checkpoints (state + iterator)
  workdir/<stage>/export/                         final params, gr2jax/exports.py format
  workdir/<stage>/logs/                           metrics.jsonl, TensorBoard events, config.txt
  workdir/<stage>/eval_<step>.json, eval_final.json, eval_final.jsonl (per example)

The config is a view of a checked recipe (every setting checked when the recipe was typed:
gr2jax/settings.py); the stage directory is locked for the whole run (a second run of the stage gets
`InUseError`). A stage starts from its own newest readable checkpoint, else from `config.init` (a
preset or the previous stage's export); a checkpoint written with other run-altering settings is
refused (run_checkpoints.py), and `train.restart=True` moves the previous run aside first. An AR
stage refuses a diffusion init. A non-finite loss, or a non-finite state about to be saved or
exported, stops the run with an error; every checkpoint on disk is finite (the last finite state is
kept). SIGTERM / SIGINT save a checkpoint, then exit. A rerun of a finished run with the same record
does nothing and says so. The export records the stage, its kind, the data build and the run record
(checkpoint.py gr2jax_metadata.json).
"""

import contextlib
import dataclasses
import functools
import json
import os
import time
from collections.abc import Callable

import jax
import numpy as np

from gr2jax import exports, files, load, run_identity
from gr2jax import workdir as workdir_lib
from gr2jax.data import build_rendering, pipeline, prompts
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle, evaluation, prompt_io
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.diffusion import convert
from gr2jax.model import params as params_lib
from gr2jax.model import sharding as model_sharding
from gr2jax.model.config import ModelConfig
from gr2jax.progress import progress
from gr2jax.recipe import EvaluationView, StageView
from gr2jax.train import inputs, optim, probe, run_checkpoints
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import state as state_lib
from gr2jax.train import step as step_lib
from gr2jax.train.writer import MetricsWriter


@dataclasses.dataclass
class Context:
  """What a stage's builders get: the run's model, data and settings.

  Attributes:
    config: the run's view of its recipe (gr2jax/recipe.py: a stage's, or an evaluation's).
    model_config: the model being trained.
    tokenizer: the data build's tokenizer.
    train: the training split; eval: the evaluation split.
    prompt_len, response_len: static P and R.
    mesh: the training mesh.
    workdir: the run's workdir.
    data_build: checkpoint.data_build_record of the data build (tokenizer, prompt); train()
      needs it (recorded in the run checkpoints and the export).
    summary: the data build's pipeline.run summary: the export's inference bundle is copied
      from it (decoding/bundle.py, export_data_build); a hand-made Context without one exports
      without a bundle.
  """

  config: StageView | EvaluationView
  model_config: ModelConfig
  tokenizer: object
  train: prompt_io.SplitData
  eval: prompt_io.SplitData
  prompt_len: int
  response_len: int
  mesh: object
  workdir: str
  data_build: dict | None = None
  summary: dict | None = None


@dataclasses.dataclass(frozen=True)
class Stage:
  """A training stage: its loss and an optional host-side batch preparation (rollouts).

  Attributes:
    name: the stage's directory under the workdir.
    make_loss: Context -> step.Loss (the loss (params, batch, key) -> (sum, weight, aux) and
      the batch fields it reads; train/step.py).
    make_prepare: Context -> prepare(params, batch, key) -> (batch, stats), or None
      (the batch it gets holds config.train.batch_size training rows: prompts, for rollouts).
    diffusion: the stage trains a block-diffusion model (an AR init is converted to
      config.decode.block_size); False: an AR model (a diffusion init is refused).
  """

  name: str
  make_loss: Callable
  make_prepare: Callable | None = None
  diffusion: bool = False


def model_from_init(init: str, tokenizer, stage_cfg, block_size: int = 0
                    ) -> tuple[ModelConfig, dict]:
  """`preset:NAME` (fresh params sized to the tokenizer) or a checkpoint / HF directory; with
  block_size > 0 an AR model is converted to block diffusion (diffusion/convert.py, mask token
  <|mask|> of the tokenizer; the weights are unchanged)."""
  config, params = _load_init(init, tokenizer, stage_cfg)
  if block_size and config.mask_token_id is None:
    config = convert.to_diffusion(config, block_size, tokenizer_lib.mask_token_id(tokenizer))
  elif block_size and config.block_size != block_size:
    raise ValueError(f"init={init!r} is a diffusion model with block_size={config.block_size}, "
                     f"the config asks for {block_size}")
  return config, params


def _load_init(init: str, tokenizer, stage_cfg) -> tuple[ModelConfig, dict]:
  if init.startswith("preset:"):
    name = init.split(":", 1)[1]
    vocab = lengths_lib.round_up(len(tokenizer), 128)
    eos = tuple(tokenizer.convert_tokens_to_ids([t]) [0] for t in ("<|im_end|>", "<|endoftext|>"))
    config = ModelConfig.preset(name, f"init='{init}': preset", vocab_size=vocab,
                                eos_token_ids=eos, pad_token_id=int(tokenizer.pad_token_id))
    return config, params_lib.init_params(config, jax.random.key(stage_cfg.seed))
  _check_init_dir(init)
  return load.load_model(init)


def _check_init_dir(init: str) -> None:
  if not os.path.isdir(init):
    raise FileNotFoundError(f"init={init!r} is neither 'preset:NAME' nor a checkpoint "
                            "directory (did the previous stage finish? its export is "
                            "<workdir>/<stage>/export)")


def init_digest(init: str) -> str:
  """What a run record keeps of config.init: a preset's name (its params follow from the seed
  and the tokenizer, both recorded), else the directory's content digest."""
  if init.startswith("preset:"):
    return init
  _check_init_dir(init)
  return exports.content_digest(init)


def load_context(config: StageView | EvaluationView, workdir: str,
                 model_config: ModelConfig | None = None) -> Context:
  """The data build (cached), tokenizer, splits, static lengths (data/lengths.py) and mesh of a
  run."""
  summary = pipeline.run(config.data, workdir)
  paths = summary["paths"]
  tokenizer = tokenizer_lib.load_tokenizer(paths["tokenizer"])
  train = prompt_io.load_split(paths["tfds"], "train", tokenizer, limit=config.train.limit)
  eval_data = prompt_io.load_split(paths["tfds"], config.eval.split, tokenizer,
                                limit=config.eval.limit)
  p, r = lengths_lib.static_lengths(summary)
  mesh = mesh_lib.make_mesh(config.mesh.data, config.mesh.fsdp, config.mesh.tp)
  data_build = exports.data_build_record(tokenizer, prompts.prompt_config(config.data))
  return Context(config, model_config, tokenizer, train, eval_data, p, r, mesh, workdir,
                 data_build, summary)


def _model_config_for_training(config: ModelConfig, cfg: StageView) -> ModelConfig:
  return dataclasses.replace(config, remat=cfg.model.remat,
                             attention_chunk_bytes=cfg.model.attention_chunk_bytes,
                             param_dtype=cfg.model.param_dtype or config.param_dtype)


def run_evaluation(ctx: Context, params, step: int, name: str, out_dir: str,
                   model_id: str = "") -> dict:
  """The one evaluation on ctx.eval at the run's decode spec; writes out_dir/eval_<name>.json
  (+ .jsonl per example). With `model_id` (an export's params digest) it goes through the
  evaluation cache of the workdir (evaluation.evaluate_cached), so a later evaluation of the same
  export with the same settings (a Table 2 row) reuses it."""
  cfg = ctx.config
  policy = policy_lib.make_policy(ctx.model_config, cfg.decode, ctx.response_len)
  jsonl = os.path.join(out_dir, f"eval_{name}.jsonl")

  def run(out_path):
    reranker = reranker_lib.Reranker.of(policy, params, ctx.tokenizer, ctx.prompt_len)
    return evaluation.evaluate(reranker, ctx.eval, batch_size=cfg.eval.batch_size,
                               out_path=out_path, desc=f"eval {name}")

  if model_id and ctx.eval.source:  # hand-made splits (no source) are not cached
    key = evaluation.cache_key(model_id, policy, ctx.eval, batch_size=cfg.eval.batch_size,
                               prompt_len=ctx.prompt_len)
    result, rows = evaluation.evaluate_cached(evaluation.cache_dir(ctx.workdir),
                                              f"{cfg.stage}_{cfg.eval.split}", key, run)
    if jax.process_index() == 0:
      files.atomic_write(jsonl, "".join(json.dumps(r) + "\n" for r in rows))
  else:
    result = run(jsonl)
  result["step"] = step
  if jax.process_index() == 0:
    files.atomic_write(os.path.join(out_dir, f"eval_{name}.json"), json.dumps(result, indent=1))
  print(evaluation.format_result(f"[{cfg.stage} step {step}] {cfg.eval.split}", result),
        flush=True)
  return result



def train(config: StageView, workdir: str, stage: Stage, ctx: Context | None = None) -> dict:
  """Runs (or resumes) one training stage to config.train.steps; returns the final evaluation.

  Args:
    config: the stage's view of its recipe (gr2jax/recipe.stage_config).
    workdir: the run's workdir.
    stage: the stage (gr2jax/train/stages.py).
    ctx: the data context; default load_context(config, workdir) (the data build).

  Raises:
    ValueError: an AR stage given a diffusion init.
    gr2jax.workdir.InUseError: another live run holds the stage directory.
    run_checkpoints.RunChangedError: the checkpoints were written with other settings.
    run_checkpoints.UnreadableCheckpointsError: checkpoints exist but none restores.
    FloatingPointError: a non-finite loss or state (the last finite checkpoint is kept).
  """
  stage_dir = os.path.join(workdir, stage.name)
  os.makedirs(stage_dir, exist_ok=True)
  lock = (workdir_lib.lock_workdir(stage_dir) if jax.process_index() == 0
          else contextlib.nullcontext())
  with lock:
    return _train(config, workdir, stage, ctx, stage_dir)


def finished_result(stage_dir: str, record: dict) -> dict | None:
  """The final evaluation of a finished run of `record` in `stage_dir` (its export records the
  same run, and eval_final.json, written after that export, its last step), else None."""
  export, final = os.path.join(stage_dir, "export"), os.path.join(stage_dir, "eval_final.json")
  written = os.path.join(export, exports.METADATA_FILE)
  if not (os.path.isfile(written) and os.path.isfile(final)
          and os.stat(final).st_mtime_ns >= os.stat(written).st_mtime_ns):
    return None
  metadata = exports.load_metadata(export)
  with open(final) as f:
    result = json.load(f)
  steps = record["config"]["train"]["steps"]
  if metadata.get("run") != record or result.get("step") != steps:
    return None
  return result


def export_metadata(config: StageView, stage: Stage, step: int, data_build: dict,
                    record: dict) -> dict:
  """What a stage's export records beside its params: the stage, its kind, the step, the data
  build (tokenizer and prompt), the run record, and the recipe's data build config and decode
  spec, so the export can be used (gr2jax.rerank, the server) with no other argument."""
  return {"stage": stage.name, "kind": "diffusion" if stage.diffusion else "ar", "step": step,
          "data_build": data_build, "run": record, "data_config": config.data.to_dict(),
          "decode": dataclasses.asdict(config.decode)}


def export_data_build(ctx: Context) -> tuple[dict, Callable | None]:
  """What a stage's export records of its data build and writes beside its params so that it
  re-ranks alone: ctx.data_build with the digest of the build's semantic IDs
  (exports.data_build_record; the run record keeps ctx.data_build without it, as every run
  recorded before the field) and the build's inference bundle (decoding/bundle.write of
  build_rendering.load_rendering, exports.save's write_more); for a hand-made Context without a
  summary, ctx.data_build and no bundle."""
  if ctx.summary is None:
    return ctx.data_build, None
  rendering = build_rendering.load_rendering(ctx.summary, ctx.config.data)
  data_build = exports.data_build_record(ctx.tokenizer, rendering.prompt,
                                         rendering.catalogue.sids)
  return data_build, functools.partial(bundle.write, summary=ctx.summary, rendering=rendering)


def _check_stage_kind(stage: Stage, config: StageView, model_config: ModelConfig) -> None:
  if not stage.diffusion and model_config.mask_token_id is not None:
    raise ValueError(f"[{stage.name}] is an AR stage but init={config.init!r} is a block-diffusion "
                     f"model (block_size={model_config.block_size}); start it from an AR "
                     "checkpoint (a preset, an sft / ar_rl export or a converted HF model)")


def _stop_non_finite(stage: Stage, manager, what: str):
  manager.wait_until_finished()
  last = manager.latest_step()
  kept = (f"The last finite checkpoint (step {last}) is kept under {manager.directory}"
          if last is not None else "No checkpoint was saved; a rerun starts from config.init")
  raise FloatingPointError(f"[{stage.name}] {what}; stopped. {kept}")


def _settings_text(config) -> str:
  """A view's settings, one `path: value` line each (logs/config.txt)."""
  def lines(tree, prefix):
    for key, value in tree.items():
      if isinstance(value, dict):
        yield from lines(value, f"{prefix}{key}.")
      else:
        yield f"{prefix}{key}: {value}\n"
  return "".join(lines(json.loads(json.dumps(config.to_dict(), default=lambda v: v.to_dict())),
                       ""))


def _train(config: StageView, workdir: str, stage: Stage, ctx: Context | None,
           stage_dir: str) -> dict:
  tcfg = config.train
  ctx = load_context(config, workdir) if ctx is None else ctx
  if ctx.data_build is None:
    raise ValueError("loop.train: ctx.data_build is None (loop.load_context records the data "
                     "build; a hand-made Context must set it)")
  record = run_identity.run_record(config, workdir=workdir, data_build=ctx.data_build,
                                   init_sha256=init_digest(config.init),
                                   lengths=(ctx.prompt_len, ctx.response_len))
  finished = finished_result(stage_dir, record)
  if finished is not None:
    print(f"[{stage.name}] already finished at step {finished['step']} with this config "
          f"({os.path.join(stage_dir, 'export')}); nothing to do", flush=True)
    return finished
  if tcfg.restart:
    moved = run_checkpoints.move_run_aside(stage_dir)
    if moved:
      print(f"[{stage.name}] train.restart: moved the previous run's files to {moved}",
            flush=True)
  model_config, init_params = model_from_init(
    config.init, ctx.tokenizer, tcfg, config.decode.block_size if stage.diffusion else 0)
  _check_stage_kind(stage, config, model_config)
  model_config = _model_config_for_training(model_config, config)
  ctx.model_config = model_config
  for field in ("batch_size", "prepare_chunk"):
    if getattr(tcfg, field) % mesh_lib.batch_size_multiple(ctx.mesh):
      raise ValueError(f"train.{field}={getattr(tcfg, field)} is not a multiple of the mesh's "
                       f"batch axes ({mesh_lib.batch_size_multiple(ctx.mesh)})")

  optimizer = optim.make_optimizer(config.optimizer)
  abstract = state_lib.abstract_state(params_lib.abstract_params(model_config), optimizer)
  shardings = state_lib.state_shardings(model_config, abstract, ctx.mesh)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          abstract, shardings)
  manager = run_checkpoints.make_manager(os.path.join(stage_dir, "checkpoints"), keep=tcfg.keep,
                                     async_save=tcfg.async_save)
  iterator = inputs.BatchIterator(
    ctx.train, batch_size=tcfg.batch_size, seed=tcfg.seed, prompt_len=ctx.prompt_len,
    response_len=ctx.response_len, pad_id=model_config.pad_token_id,
    lambda_r=config.data.lambda_r, lambda_o=config.data.lambda_o)
  restored = run_checkpoints.restore_latest(manager, abstract, record)
  if restored is None:
    params = jax.tree.map(lambda x, sh: jax.device_put(x.astype(sh.dtype), sh.sharding),
                          init_params, abstract.params)
    state = jax.jit(lambda p: state_lib.create_state(p, optimizer, tcfg.seed),
                    out_shardings=shardings)(params)
    print(f"[{stage.name}] starting from {config.init}", flush=True)
  else:
    state, data_state, at = restored
    iterator.set_state(data_state)
    print(f"[{stage.name}] resuming from checkpoint step {at}", flush=True)
  del init_params

  writer = MetricsWriter(os.path.join(stage_dir, "logs"))
  writer.write_text("config", f"{_settings_text(config)}model: {model_config}\n"
                              f"P={ctx.prompt_len} R={ctx.response_len}\ndevices: {jax.devices()}"
                              f"\nmesh: {ctx.mesh}")
  loss_fn = stage.make_loss(ctx)
  prepare = stage.make_prepare(ctx) if stage.make_prepare else None
  batch_sharding = mesh_lib.batch_sharding(ctx.mesh)
  with jax.set_mesh(ctx.mesh):
    train_step = step_lib.make_train_step(loss_fn, optimizer, micro_batches=tcfg.micro_batches,
                                          state_shardings=shardings,
                                          batch_sharding=batch_sharding)
  start_step = int(jax.device_get(state.step))
  held_out = (probe.make_probe(ctx, stage, loss_fn, probe.load(ctx, tcfg.probe_prompts))
              if tcfg.probe_prompts else None)

  def run_probe(at: int) -> None:  # the stage's objective on held-out prompts (train/probe.py)
    if held_out is not None:
      writer.write(at, held_out(state.params), prefix="probe/")

  if start_step == 0:
    run_probe(0)
  tokens_seen, t_start = 0, time.perf_counter()
  # The bar closes (its line ended) before a refusal raised inside is printed after it.
  with progress(tcfg.steps, initial=start_step, desc=stage.name) as bar, \
       run_checkpoints.StopFlag() as stop:
    while int(jax.device_get(state.step)) < tcfg.steps and not stop:
      step_now = int(jax.device_get(state.step))
      batch = next(iterator)
      stats = {}
      if prepare is not None:
        key = jax.random.fold_in(jax.random.fold_in(state.key, step_now), 1 << 20)
        batch, stats = prepare(state.params, batch, key)
      # SFT / CFT train on [prompt | response]; an on-policy stage counts its sampled tokens.
      tokens_seen += (batch.response_tokens.size if prepare is not None else
                      batch.prompt_tokens.size + batch.response_tokens.size)
      batch = model_sharding.global_arrays(batch.select(loss_fn.fields), batch_sharding)
      with jax.set_mesh(ctx.mesh):
        state, metrics = train_step(state, batch)
      metrics = jax.device_get(metrics)
      if not np.isfinite(metrics["loss"]) or not np.isfinite(metrics["grad_norm"]):
        _stop_non_finite(stage, manager, f"non-finite loss {metrics['loss']} / grad norm "
                                         f"{metrics['grad_norm']} at step {step_now}")
      elapsed = time.perf_counter() - t_start
      metrics = {**metrics, **stats, "tokens_per_s": tokens_seen / max(elapsed, 1e-9),
                 "learning_rate": optim.learning_rate_schedule(config.optimizer)(step_now)}
      writer.write(step_now + 1, metrics, prefix="train/")
      bar.set_postfix(loss=f"{float(metrics['loss']):.4f}",
                      tok_s=f"{metrics['tokens_per_s']:.0f}",
                      **{k: f"{v:.3f}" for k, v in stats.items() if k in ("reward", "valid_rate")})
      bar.update(1)
      done = step_now + 1
      if stop or done % tcfg.save_every == 0 or done == tcfg.steps:
        if not run_checkpoints.all_finite(state):
          _stop_non_finite(stage, manager, f"non-finite params / optimizer state after step "
                                           f"{done}, not saved")
        run_checkpoints.save(manager, state, iterator.get_state(), record)
      if tcfg.probe_every and done % tcfg.probe_every == 0 and done < tcfg.steps:
        run_probe(done)
      if tcfg.eval_every and done % tcfg.eval_every == 0 and done < tcfg.steps:
        result = run_evaluation(ctx, state.params, done, str(done), stage_dir)
        writer.write(done, {k: v for k, v in result.items() if isinstance(v, float)}, "eval/")
  manager.wait_until_finished()
  if stop:
    raise SystemExit(f"[{stage.name}] stopped by signal {stop.signum} at step "
                     f"{int(jax.device_get(state.step))}; checkpoint saved, rerun to resume")
  if not run_checkpoints.all_finite(state):
    _stop_non_finite(stage, manager, "non-finite params / optimizer state at the export")
  run_probe(int(jax.device_get(state.step)))
  export = os.path.join(stage_dir, "export")
  params = model_sharding.host_arrays(state.params)  # a collective: every process gathers
  final_step = int(jax.device_get(state.step))
  export_config = dataclasses.replace(model_config, remat="none", attention_chunk_bytes=0)
  if jax.process_index() == 0:
    data_build, write_bundle = export_data_build(ctx)
    exports.save(export, export_config, params, metadata=export_metadata(
      config, stage, final_step, data_build, record), write_more=write_bundle)
  del params
  # The final evaluation is the export's (its config, keyed by its params digest): a later
  # evaluation of the export with the same settings, e.g. its Table 2 row, reuses it.
  single = jax.process_count() == 1
  ctx.model_config = export_config
  result = run_evaluation(ctx, state.params, final_step, "final", stage_dir,
                          model_id=evaluation.export_id(export) if single else "")
  writer.write(int(jax.device_get(state.step)),
               {k: v for k, v in result.items() if isinstance(v, float)}, "eval/")
  writer.close()
  return result
