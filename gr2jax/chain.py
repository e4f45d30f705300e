"""The step runner: a recipe's steps in order, each reused by digest (every stage run and the
Table 2 chain go through it; the Table 2 report is gr2jax/apps/table2.py).

Steps (gr2jax/recipe.chain): [teacher: an LLM writes the SFT traces (teacher.hf_dir set; the
data build then trains on them)] -> [convert: the HF checkpoint with the project's tokens added]
-> sft -> ar_rl -> cft -> opd -> rl, each under W/<step>/, each on the recipe's data build
(built, or reused from W's cache, first). A step's digest (gr2jax/run_identity.py step_digests)
covers what changes its result: its view of the recipe (recipe.stage_config, less how often it
saves or evaluates; for convert, the HF directory and dtype; for teacher, its spec and data
build), with paths inside W written relative to W and paths inside the checkout (the shipped
data) relative to the checkout (gr2jax/workdir.portable), chained with every step before it (the
first: the data build's config). So the same command from another directory, with W spelt
relative or absolute, on a moved or copied W, or from another clone or a moved checkout, reuses
every finished step. A step recorded before paths inside the checkout were written that way is
reused in place (its digest of those paths as they were), and its done.json rewritten the
current way.

W/<step>/started.json and done.json record the digest, the view and the upstream digest. Every
step is decided before anything is written (`plan_chain`); nothing is ever deleted:
- done with this digest: reused, once verified (its export's completion record and params
  digest; the teacher's traces): a broken one is redone, its output moved aside;
- a run of this digest moved aside earlier (W/<step>.<digest>): moved back and reused;
- a run with other settings: refused (StepChanged, naming the fields old -> new and the ways on:
  its settings, `--config.stages.<step>.train.restart=True` / `--config.teacher.restart=True`,
  which moves it to W/<step>.<its digest>, or a new workdir), unless the step absorbs the change
  (more training steps resume the run; another teacher num_users extends or cuts the sample);
- a run whose own settings match but whose upstream changed (or a changed convert step): moved
  aside the same way, then run;
- otherwise (fresh, or the same settings interrupted): run, resuming from its own checkpoints.
A single stage run (`--config=cft.py`) is `run_step`: its upstream steps must be done with the
same recipe, else `UpstreamMissing` names them and why (or, with upstream='run', they run first
under the same rules); an upstream step made with settings it cannot absorb is refused naming
the fields and the flags that set them back. A done step whose export lost only files of its
inference bundle (decoding/bundle.py) is not retrained: it is refused naming
weights_conversion/add_bundle.py's command, which writes the bundle again in seconds.
"""

import dataclasses
import json
import os
import time

from gr2jax import exports, files, run_identity, stage_registry
from gr2jax import recipe as recipe_lib
from gr2jax import workdir as workdir_lib
from gr2jax.data import llm_teacher, pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle
from gr2jax.hf import convert as hf_convert
from gr2jax.run_identity import DONE_FILE, STARTED_FILE
from gr2jax.train import loop, run_checkpoints, stages, teacher_stage


class StepError(Exception):
  """A step cannot go on as asked; the message names the step, what is wrong and the ways on
  (experiments/run.py prints it as one line, without a traceback)."""


class UpstreamMissing(StepError):
  """A step was asked for before the steps it reads were done with the same recipe.

  Attributes:
    step: the step asked for.
    missing: the upstream steps not done, in chain order.
    reasons: {step: why it does not count as done} for those that exist in some form.
  """

  def __init__(self, step: str, missing: list[str], reasons: dict[str, str] | None = None):
    self.step, self.missing, self.reasons = step, missing, reasons or {}
    why = "; ".join(f"{s}: {r}" for s, r in self.reasons.items())
    super().__init__(f"{step} needs {', '.join(missing)} done first with the same recipe"
                     + (f" ({why})" if why else ""))


class StepChanged(StepError):
  """A step's directory holds work made with other settings; nothing was touched."""


_OTHER_SETTINGS = "made with other settings"  # missing_upstream's reason
_TEACHER_ABSORBED = ("config.spec.num_users",)  # a larger sample extends, a smaller is a prefix


def _record(path: str) -> dict | None:
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def _read_digest(path: str) -> str | None:
  record = _record(path)
  return record["digest"] if record else None


def _output(step_dir: str, step: str) -> str:
  """What a step leaves for the steps after it: its export, or the teacher's traces."""
  return os.path.join(step_dir, llm_teacher.TRACES_FILE if step == recipe_lib.TEACHER
                      else "export")


def _broken(step_dir: str, step: str, done: dict) -> str | None:
  """Why a step directory whose done.json this run would reuse cannot be trusted, else None:
  its output's completion record (every file's size) or its params digest do not match."""
  output = _output(step_dir, step)
  reason = pipeline.incomplete(output)
  if reason == "missing":
    return f"{output} does not exist"
  if reason is not None:
    return f"{output}: {reason}"
  if done.get("params_sha256"):
    try:
      recorded = exports.load_metadata(output).get("params_sha256")
    except exports.CheckpointError as e:
      return str(e)
    if recorded != done["params_sha256"]:
      return (f"{output} holds params {str(recorded)[:16]}, done.json records "
              f"{done['params_sha256'][:16]}")
  return None


def _bundle_lost(step_dir: str, step: str, done: dict, workdir: str, whose: str) -> str | None:
  """The refusal of a done step whose export lost only files of its inference bundle
  (decoding/bundle.py: its params, config and metadata intact), naming the command that writes
  the bundle again in seconds (weights_conversion/add_bundle.py), where redoing the step would
  retrain it; None for any other damage. `whose`: how the message names the export."""
  output = _output(step_dir, step)
  damaged = pipeline.damaged_files(output) if step != recipe_lib.TEACHER else None
  if not damaged or not all(bundle.is_bundle_file(name) for name in damaged):
    return None
  try:
    metadata = exports.load_metadata(output)
  except exports.CheckpointError:
    return None
  if not metadata.get("data_config") or (
      done.get("params_sha256") and metadata.get("params_sha256") != done["params_sha256"]):
    return None
  return (f"{whose} {output} lost only files of its inference bundle "
          f"({'; '.join(damaged.values())}); its params are intact, so {step} needs no "
          f"retraining: write the bundle again with `{bundle.rebundle_command(output, workdir)}`, "
          "then rerun this command")


def _aside(workdir: str, step: str, key: str) -> str:
  """Where a step's run of digest `key` is kept once moved aside: W/<step>.<key>."""
  return f"{recipe_lib.stage_dir(workdir, step)}.{key}"


def _find_aside(workdir: str, step: str, keys: tuple[str, ...]) -> str | None:
  """A run of one of `keys` moved aside earlier, finished and intact (then reusable), else None."""
  for key in keys:
    path = _aside(workdir, step, key)
    done = _record(os.path.join(path, DONE_FILE))
    if done and done.get("digest") == key and _broken(path, step, done) is None:
      return path
  return None


def _restart_flag(step: str) -> str:
  return (f"--config.{step}.restart=True" if step == recipe_lib.TEACHER
          else f"--config.stages.{step}.train.restart=True")


def _restart(recipe: recipe_lib.Recipe, step: str) -> bool:
  if step == recipe_lib.TEACHER:
    return bool(recipe.teacher.restart)
  return step in recipe.stages and bool(recipe.stages[step].train.restart)


def _changes(step: str, saved: dict, current: dict) -> list[tuple[str, object, object]]:
  """(field, old, new) of the changes a step cannot absorb (training: all but the fields a
  resume may change, train.steps not below the recorded run's; teacher: all but num_users)."""
  fields = [(f, a, b) for f, a, b in run_identity.changed_fields(saved, current)
            if step != recipe_lib.TEACHER or f"config.{f}" not in _TEACHER_ABSORBED]
  if step in stage_registry.names():
    old, new = saved["config"]["train"]["steps"], current["config"]["train"]["steps"]
    if new < old:
      fields.append(("train.steps", old, new))
  return fields


def _change_lines(fields: list[tuple[str, object, object]]) -> list[str]:
  """'field: old -> new' of `_changes`."""
  return [f"{f}: {a!r} -> {b!r}" + (" (below the recorded run's)" if f == "train.steps"
                                     and isinstance(a, int) and isinstance(b, int) and b < a
                                     else "")
          for f, a, b in fields]


# a view's sections that are the recipe's blocks of the same name (--config.<section>.<field>)
_RECIPE_SECTIONS = ("data", "decode", "eval", "mesh", "model")


def _recorded_flags(step: str, fields: list[tuple[str, object, object]], workdir: str
                    ) -> list[str]:
  """The --config flags that set `fields` back to their recorded values, where the field is one
  of the recipe's (a path recorded "{workdir}/..." or "{checkout}/..." filled in)."""
  flags = []
  for field, old, _ in fields:
    section = field.split(".")[0]
    if section in _RECIPE_SECTIONS:
      flag = f"--config.{field}"
    elif section in ("train", "optimizer") and step in stage_registry.names():
      flag = f"--config.stages.{step}.{field}"
    else:
      continue
    value = workdir_lib.fill_path(old, workdir) if isinstance(old, str) else old
    flags.append(f"{flag}={value}")
  return flags


def _upstream_changed(recipe: recipe_lib.Recipe, step: str, upstream: str, workdir: str
                      ) -> str | None:
  """The one-line refusal of `step` whose upstream step's run under workdir was made with
  settings this recipe changes and that step cannot absorb (the suggested upstream command would
  be refused in turn), naming each field (recorded -> this run) and the ways on; None otherwise."""
  step_dir = recipe_lib.stage_dir(workdir, upstream)
  saved = _record(os.path.join(step_dir, DONE_FILE)) or _record(
    os.path.join(step_dir, STARTED_FILE))
  if not saved or "view" not in saved:
    return None
  fields = _changes(upstream, saved["view"], run_identity.step_view(recipe, upstream, workdir))
  if not fields:
    return None
  flags = _recorded_flags(upstream, fields, workdir)
  back = (f"rerun with its settings ({' '.join(flags)})" if len(flags) == len(fields)
          else "rerun with its settings")
  return (f"[chain] {step}: its upstream {upstream} ({step_dir}) was made with other settings "
          f"(recorded -> this run: {'; '.join(_change_lines(fields))}). Nothing was changed. To "
          f"go on: {back}, or run every step with these settings in a new workdir "
          "(--workdir=<a new directory> --config.upstream=run)")


@dataclasses.dataclass(frozen=True)
class _Plan:
  """What run_chain does with one step: 'reuse' (done with this digest), 'swap' (a run of this
  digest kept aside is moved back), 'run' (fresh, resumed, or absorbing a change), 'aside' (the
  previous run is moved aside first), 'redo' (done but broken: its output is moved aside)."""

  step: str
  action: str
  note: str = ""
  moved_from: str = ""


def _plan_step(recipe, step: str, keys: tuple[str, ...], upstream_keys: tuple[str, ...],
               workdir: str) -> _Plan:
  """The action for one step (module docstring), `keys` / `upstream_keys` its and its upstream's
  known digests (run_identity.known_digests); raises StepChanged for a refused change."""
  step_dir = recipe_lib.stage_dir(workdir, step)
  done = _record(os.path.join(step_dir, DONE_FILE))
  if done and done["digest"] in keys:
    broken = _broken(step_dir, step, done)
    lost = broken and _bundle_lost(step_dir, step, done, workdir, "its export")
    if lost:
      raise StepError(f"[chain] {step}: {lost}")
    note = (f"{_restart_flag(step)} moves only a run of other settings aside"
            if _restart(recipe, step) else "")
    return _Plan(step, "redo", broken) if broken else _Plan(step, "reuse", note)
  found = _find_aside(workdir, step, keys)
  if found:
    return _Plan(step, "swap", moved_from=found)
  saved = done or _record(os.path.join(step_dir, STARTED_FILE))
  if saved is None or saved["digest"] in keys:
    return _Plan(step, "run")
  if step == recipe_lib.CONVERT or _restart(recipe, step):
    return _Plan(step, "aside", "settings changed" if step == recipe_lib.CONVERT
                 else _restart_flag(step))
  if "view" not in saved:  # a record without settings: the loop / teacher check their own
    return _Plan(step, "run")
  changes = _changes(step, saved["view"], run_identity.step_view(recipe, step, workdir))
  if changes:
    raise StepChanged(
      f"[chain] {step}: {step_dir} holds a run made with other settings (recorded -> this "
      f"run):\n  " + "\n  ".join(_change_lines(changes)) + "\nNothing was changed. To go on: "
      f"rerun with its settings, pass {_restart_flag(step)} (moves it to "
      f"{_aside(workdir, step, saved['digest'])}, kept: a rerun with its settings moves it back), "
      "or use a new --workdir.")
  if saved.get("upstream") not in upstream_keys:
    return _Plan(step, "aside", "an earlier step changed")
  return _Plan(step, "run", "absorbing the change")


def plan_chain(recipe: recipe_lib.Recipe, workdir: str, steps) -> list[_Plan]:
  """What run_chain will do with each of `steps`, decided before anything is written.

  Raises:
    StepChanged: a step holds work made with settings it cannot absorb (names the fields).
  """
  known = run_identity.known_digests(recipe, workdir)
  plans, upstream = [], known["data"]
  for step in recipe_lib.chain(recipe):
    if step in steps:
      plans.append(_plan_step(recipe, step, known[step], upstream, workdir))
    upstream = known[step]
  return plans


def missing_upstream(recipe: recipe_lib.Recipe, step: str, workdir: str) -> dict[str, str]:
  """{step: why} of the steps before `step` not done (and intact) with this recipe under
  workdir; why is '' for a step never started.

  Raises:
    StepError: a done upstream step's export lost only files of its inference bundle (names
      weights_conversion/add_bundle.py's command, which repairs it without retraining).
  """
  known, missing = run_identity.known_digests(recipe, workdir), {}
  for s in recipe_lib.upstream(recipe, step):
    step_dir = recipe_lib.stage_dir(workdir, s)
    done = _record(os.path.join(step_dir, DONE_FILE))
    if done and done["digest"] in known[s]:
      broken = _broken(step_dir, s, done)
      lost = broken and _bundle_lost(step_dir, s, done, workdir, f"its upstream {s}'s export")
      if lost:
        raise StepError(f"[chain] {step}: {lost}")
      if broken:
        missing[s] = f"its done run is broken: {broken}"
      continue
    if _find_aside(workdir, s, known[s]):
      continue
    saved = done or _record(os.path.join(step_dir, STARTED_FILE))
    missing[s] = ("" if saved is None else "started, not finished" if saved["digest"] in known[s]
                  else _OTHER_SETTINGS)
  return missing


def _move(source: str, target: str) -> str:
  """Renames source to target (target + '-<n>' when taken); returns where it went."""
  final, n = target, 1
  while os.path.exists(final):
    final, n = f"{target}-{n}", n + 1
  os.rename(source, final)
  return final


def _convert(recipe: recipe_lib.Recipe, workdir: str) -> None:
  """The HF checkpoint converted with the data build's extended tokenizer's new tokens."""
  tok_dir = pipeline.run(recipe_lib.data_config(recipe), workdir)["paths"]["tokenizer"]
  hf_convert.convert(recipe.model.hf_dir, recipe_lib.export(workdir, recipe_lib.CONVERT),
                     recipe.model.param_dtype or None,
                     add_tokens_file=os.path.join(tok_dir, tokenizer_lib.ADDED_TOKENS_FILE),
                     tokenizer_dir=tok_dir)


def _build_data(recipe: recipe_lib.Recipe, step: str, workdir: str, timings: dict) -> None:
  """The data build `step` reads (the teacher's: without traces), timed once per run_chain as
  timings['data'] / ['teacher_data'], 'cached' when every one of its steps was."""
  name = "teacher_data" if step == recipe_lib.TEACHER else "data"
  if name in timings:
    return
  start = time.perf_counter()
  summary = pipeline.run(recipe_lib.data_config(recipe, traces=step != recipe_lib.TEACHER),
                         workdir)
  timings[name] = {"seconds": time.perf_counter() - start,
                   "how": "cached" if all(summary["cached"].values()) else "built"}


def _run_one(recipe, name: str, workdir: str, contexts: dict) -> None:
  if name == recipe_lib.CONVERT:
    _convert(recipe, workdir)
  elif name == recipe_lib.TEACHER:
    try:
      teacher_stage.run(recipe_lib.teacher_spec(recipe),
                        recipe_lib.data_config(recipe, traces=False), workdir)
    except llm_teacher.NoTracesError as e:
      raise StepError(f"[chain] teacher: {e}") from None
  else:
    config = recipe_lib.stage_config(recipe, name, workdir)
    config = dataclasses.replace(  # the chain moved a changed run aside itself (_plan_step)
      config, train=config.train.replace(restart=False))
    if config.train.limit not in contexts:  # one data build and eval split for all stages
      contexts[config.train.limit] = loop.load_context(config, workdir)
    ctx = dataclasses.replace(contexts[config.train.limit], config=config)
    try:
      loop.train(config, workdir, stages.stage(name), ctx)
    except run_checkpoints.RunChangedError as e:
      raise StepChanged(f"[chain] {name}: {e}") from None


def run_chain(recipe: recipe_lib.Recipe, workdir: str, upto: str | None = None) -> dict:
  """Runs every step (up to and including `upto`) not already done with the same digest chain.

  Each step is planned first (`plan_chain`, nothing written before every step is decided): a
  step done with its digest is verified and reused; a run of its digest kept aside is moved back;
  otherwise it runs (a fresh start, a resume of the same settings, or a change it absorbs: more
  training steps resume, a larger teacher sample extends it). A run made with other settings is
  refused (StepChanged), or with restart moved aside to W/<step>.<its digest>; a step whose
  upstream changed, or a convert step whose settings did, is moved aside the same way. A done
  step whose output is broken is redone (the broken output moved aside). Nothing is deleted.

  Returns:
    {step or 'data' / 'teacher_data': {'seconds': float, 'how': 'reused' | 'run' | 'cached' |
    'built'}}; a reused step's seconds are those of the run that made it.

  Raises:
    StepChanged: before anything ran (the message names the step and fields).
    StepError: the teacher accepted no user.
  """
  steps = recipe_lib.chain(recipe)
  steps = steps[:steps.index(upto) + 1] if upto else steps
  plans = plan_chain(recipe, workdir, steps)
  keys = run_identity.step_digests(recipe, workdir)
  upstream = run_identity.data_digest(recipe, workdir)
  timings, contexts = {}, {}
  for i, plan in enumerate(plans):
    name, key = plan.step, keys[plan.step]
    prefix = f"[chain {i + 1}/{len(plans)}] {name}"
    stage_dir = recipe_lib.stage_dir(workdir, name)
    done_file = os.path.join(stage_dir, DONE_FILE)
    if plan.action == "swap":
      parked = (_move(stage_dir, _aside(workdir, name, _read_digest(done_file)
                                        or _read_digest(os.path.join(stage_dir, STARTED_FILE))
                                        or "unrecorded"))
                if os.path.exists(stage_dir) else None)
      os.rename(plan.moved_from, stage_dir)
      print(f"{prefix}: reusing {stage_dir} (moved back from {plan.moved_from}"
            + (f"; the run that was there is now {parked}" if parked else "") + ")", flush=True)
    if plan.action in ("reuse", "swap"):
      if plan.action == "reuse":
        print(f"{prefix}: reusing {stage_dir}" + (f" ({plan.note})" if plan.note else ""),
              flush=True)
      done = _record(done_file)
      if done["digest"] != key:  # recorded before "{checkout}/...": written the current way
        done |= {"digest": key, "upstream": upstream,
                 "view": run_identity.step_view(recipe, name, workdir),
                 "data": run_identity.data_digest(recipe, workdir)}
        files.atomic_write(done_file, json.dumps(done))
      timings[name] = {"seconds": done["seconds"], "how": "reused"}
      upstream = key
      continue
    if plan.action == "aside":
      saved = _record(done_file) or _record(os.path.join(stage_dir, STARTED_FILE))
      moved = _move(stage_dir, _aside(workdir, name, saved["digest"]))
      print(f"{prefix}: {plan.note}: moved the previous run to {moved} (kept: a rerun with its "
            "settings moves it back)", flush=True)
    if plan.action == "redo":
      output = _output(stage_dir, name)
      stamp = time.strftime("%Y%m%dT%H%M%S")
      kept = (f"; moved it to {_move(output, f'{output}.broken-{stamp}')}"
              if os.path.exists(output) else "")
      print(f"{prefix}: its done run is broken ({plan.note}){kept}; redoing it", flush=True)
    print(f"{prefix}: running into {stage_dir}"
          + (f" ({plan.note})" if plan.action == "run" and plan.note else ""), flush=True)
    os.makedirs(stage_dir, exist_ok=True)
    record = {"digest": key, "upstream": upstream,
              "view": run_identity.step_view(recipe, name, workdir)}
    files.atomic_write(os.path.join(stage_dir, STARTED_FILE), json.dumps(record))
    _build_data(recipe, name, workdir, timings)
    start = time.perf_counter()
    _run_one(recipe, name, workdir, contexts)
    timings[name] = {"seconds": time.perf_counter() - start, "how": "run"}
    output = _output(stage_dir, name)
    pipeline.mark_complete(output)
    if name != recipe_lib.TEACHER:
      record["params_sha256"] = exports.load_metadata(output).get("params_sha256")
    record |= {"seconds": timings[name]["seconds"],
               "data": run_identity.data_digest(recipe, workdir)}
    files.atomic_write(done_file, json.dumps(record))
    upstream = key
  return timings


def run_step(recipe: recipe_lib.Recipe, step: str, workdir: str, upstream: str = "check"
             ) -> dict:
  """One step of the recipe (a single stage run); returns run_chain's timings.

  Args:
    upstream: 'check' (a missing upstream step raises UpstreamMissing) or 'run' (run them).

  Raises:
    UpstreamMissing: upstream='check' and an upstream step is not done with this recipe.
    StepChanged: see run_chain; with upstream='check', an upstream step made with settings
      this recipe changes and that step cannot absorb (one line naming each field, recorded ->
      this run, and the flags that set them back).
    StepError: an upstream export lost only its inference bundle (missing_upstream).
    ValueError: upstream is neither.
  """
  if upstream not in ("check", "run"):
    raise ValueError(f"upstream={upstream!r}: expected 'check' or 'run'")
  missing = missing_upstream(recipe, step, workdir)
  if missing and upstream == "check":
    for s, reason in missing.items():
      refusal = reason == _OTHER_SETTINGS and _upstream_changed(recipe, step, s, workdir)
      if refusal:
        raise StepChanged(refusal)
    raise UpstreamMissing(step, list(missing), {s: r for s, r in missing.items() if r})
  return run_chain(recipe, workdir, upto=step)
