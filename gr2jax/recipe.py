"""The recipe: one typed, frozen description of a reproduction, and every stage's view of it.

A recipe is the data build (the prompt included), the model (a preset, or a local HF Qwen3
directory whose `config.json` gives the dimensions), one decode spec (decoding/spec.DecodeSpec),
the mesh, the evaluation settings and each stage's training settings. gr2jax/recipes.py holds the
values of the named recipes (`tiny`, `qwen3_0_6b` ... `qwen3_8b`) as one
`ml_collections.ConfigDict` the command line overrides (`--config.stages.cft.train.steps=5`);
`from_config` turns it into a `Recipe` (`recipes.get(name)` does both), and everything a stage
reads is derived from that here, once:

  chain(recipe)              the steps in order: convert (HF recipes only), then the training
                             stages of gr2jax/stage_registry.py (sft, ar_rl, cft, opd, rl; the
                             data build runs first, inside every step)
  stage_dir / export         <workdir>/<step>/, <workdir>/<step>/export
  stage_config(recipe, ...)  the StageView the training loop reads for one stage: its init (its
                             registry init's export), its typed settings (the OPD teacher: the
                             AR RL export), the
                             decode spec (recipe.decode, whole), the data build, mesh, eval
  evaluation_config(recipe)  the EvaluationView of a standalone evaluation (`eval.py`)
  data_config(recipe)        the data build's config (with the HF tokenizer to extend, if any)
  tables_config(recipe, ...) the TablesView of Table 3 / Table 4 / Figure 6 (apps/tables.py)

The views are frozen dataclasses: a field read that a view does not have is an AttributeError,
and tests/test_views.py checks every such read in the code against the views' fields. Their
`to_dict()` is the run record's `config` (the chain's digests), as the ConfigDict views before.

So two stages of one recipe cannot disagree on the data build, the prompt or the decode spec.
The teacher traces are part of the data build (`data.teacher_traces`, a JSONL of LLM traces; the
rule teacher when empty): an LLM-teacher step writes that file before the chain's data build.
The library never reads experiments/: its config files are thin views of gr2jax/recipes.py.
"""

import dataclasses
import os
import re
import types
from collections.abc import Mapping

import ml_collections

from gr2jax import config_checks, stage_registry
from gr2jax.decoding.spec import DecodeSpec

CONVERT = "convert"  # the HF checkpoint converted with the project's tokens added
TEACHER = "teacher"  # the LLM-teacher step (teacher.hf_dir set): traces for the data build
TEACHER_TRACES = os.path.join("{workdir}", TEACHER, "traces.jsonl")  # its output (data/pipeline.py
#                                                   resolves {workdir})


@dataclasses.dataclass(frozen=True)
class ModelSpec:
  """The model a recipe starts from.

  Attributes:
    preset: a gr2jax ModelConfig preset trained from scratch (sized to the data build's
      tokenizer), used when hf_dir is ''.
    hf_dir: a local HF Qwen3 directory (config.json + weights + tokenizer); its tokenizer is
      extended with the project's tokens and the checkpoint converted with them added.
    remat: 'none' | 'full' (training).
    param_dtype: '' (the checkpoint's) | 'float32' | 'bfloat16' (training; fp32 Adam moments).
    attention_chunk_bytes: f32 attention scores per query chunk (training).
  """
  preset: str
  hf_dir: str
  remat: str
  param_dtype: str
  attention_chunk_bytes: int


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One reproduction (module docstring).

  Attributes:
    name: the recipe's name (gr2jax/recipes.py).
    data: the data build (experiments/configs/data.py fields; the prompt in data.prompt).
    model: the starting model.
    decode: how every evaluation and on-policy rollout of the recipe decodes.
    mesh: the device mesh (data, fsdp, tp; -1 = the remaining devices).
    eval: split, limit (first N users; 0 = all) and decode batch size of stage evaluations.
    stages: {stage: its training settings (train, optimizer, and its own block: rl, cft, opd)}.
    settings: {stage: its own block, typed (gr2jax/stage_registry.py; None: it has none)}.
    replay_shrink: OPD / RL replay step shrinkage (1 = exact; k merges k steps per round).
    table: Table 2's splits, diffusion_splits and results_dir.
    teacher: the LLM-teacher step's settings (teacher_spec; hf_dir '' = the rule teacher).
    xla_flags: XLA flags every compile of the run needs, as XLA_FLAGS entries '--name=value'
      (parse_xla_flags): experiments/run.py merges them into XLA_FLAGS before JAX starts its
      backend; experiments/plan.py compiles its targets with them.
  """
  name: str
  data: ml_collections.FrozenConfigDict
  model: ModelSpec
  decode: DecodeSpec
  mesh: ml_collections.FrozenConfigDict
  eval: ml_collections.FrozenConfigDict
  stages: Mapping[str, ml_collections.FrozenConfigDict]
  settings: Mapping[str, stage_registry.Settings | None]
  replay_shrink: int
  table: ml_collections.FrozenConfigDict
  teacher: ml_collections.FrozenConfigDict
  xla_flags: tuple[str, ...]


_XLA_FLAG = re.compile(r"--(xla_\w+)=(\S+)")


def parse_xla_flags(flags) -> dict[str, str]:
  """{name: value} of XLA_FLAGS entries '--name=value' (a recipe's xla_flags).

  Raises:
    ValueError: an entry of another form, or a flag given twice; the error names xla_flags
      (XLA aborts the process on a flag it does not know, so names are checked by XLA itself).
  """
  out = {}
  for flag in flags:
    match = _XLA_FLAG.fullmatch(flag)
    if match is None:
      raise ValueError(f"xla_flags entry {flag!r}: expected '--xla_<name>=<value>'")
    name, value = match.groups()
    if name in out:
      raise ValueError(f"xla_flags sets --{name} twice")
    out[name] = value
  return out


def from_config(config) -> Recipe:
  """The Recipe of a recipe ConfigDict (gr2jax/recipes.py).

  An HF recipe may lack hf_dir here (its training settings can still be read, e.g. by the AOT
  plan); data_config / init_of / stage_config then raise, naming --config.hf_dir.

  Raises:
    ValueError: data.tokenizer_base set (it is hf_dir's), data.teacher_traces set beside
      teacher.hf_dir (the teacher step writes them), a stage missing from config.stages,
      a bad size or rate (config_checks.py; the error names the field).
    FileNotFoundError: hf_dir without a config.json.
  """
  hf_dir = config.hf_dir
  if config.data.tokenizer_base:
    raise ValueError("data.tokenizer_base is derived from --config.hf_dir; set that instead")
  if hf_dir and not os.path.isfile(os.path.join(hf_dir, "config.json")):
    raise FileNotFoundError(f"--config.hf_dir={hf_dir}: no config.json there (expected a local "
                            "HF Qwen3 directory)")
  stages = stage_registry.names()
  missing = [s for s in stages if s not in config.stages]
  if missing:
    raise ValueError(f"recipe {config.recipe!r}: config.stages lacks {missing}")
  if config.teacher.hf_dir and config.data.teacher_traces:
    raise ValueError(f"data.teacher_traces={config.data.teacher_traces!r} and teacher.hf_dir="
                     f"{config.teacher.hf_dir!r} are both set: the teacher step writes the "
                     "traces; set one of them")
  settings = {}
  for s in stages:  # every size and rate, a ValueError naming the field
    spec = stage_registry.STAGES[s]
    block = config.stages[s][spec.block].to_dict() if spec.block else None
    settings[s] = stage_registry.settings_of(spec, block, f"stages.{s}.{spec.block}.")
    config_checks.check_stage_config(config.stages[s], f"stages.{s}.", s, settings[s])
  config_checks.check_stage_config(config)  # eval.*, and rerank.* in rerank.py's view
  parse_xla_flags(config.xla_flags)
  m = config.model
  return Recipe(
    name=config.recipe,
    data=ml_collections.FrozenConfigDict(config.data),
    model=ModelSpec(preset=m.preset if not hf_dir else "", hf_dir=hf_dir, remat=m.remat,
                    param_dtype=m.param_dtype, attention_chunk_bytes=m.attention_chunk_bytes),
    decode=DecodeSpec(**config.decode.to_dict()),
    mesh=ml_collections.FrozenConfigDict(config.mesh),
    eval=ml_collections.FrozenConfigDict(config.eval),
    stages=types.MappingProxyType({s: ml_collections.FrozenConfigDict(config.stages[s])
                                   for s in stages}),
    settings=types.MappingProxyType(settings),
    replay_shrink=config.replay_shrink,
    table=ml_collections.FrozenConfigDict(config.table),
    teacher=ml_collections.FrozenConfigDict(config.teacher),
    xla_flags=tuple(config.xla_flags))


def _editable(frozen: ml_collections.FrozenConfigDict) -> ml_collections.ConfigDict:
  """An unlocked ConfigDict copy of a frozen block (a view adds derived fields to it)."""
  c = frozen.as_configdict()
  c.unlock()
  return c


def chain(recipe: Recipe) -> tuple[str, ...]:
  """The recipe's steps in order (the data build runs inside each): the LLM teacher when
  teacher.hf_dir is set, the HF conversion for an HF recipe, then the training stages."""
  return (((TEACHER,) if recipe.teacher.hf_dir else ()) + ((CONVERT,) if _hf_dir(recipe) else ())
          + stage_registry.names())


def stage_dir(workdir: str, step: str) -> str:
  return os.path.join(workdir, step)


def export(workdir: str, step: str) -> str:
  """Where a step's model lands (gr2jax/exports.py format)."""
  return os.path.join(stage_dir(workdir, step), "export")


def upstream(recipe: Recipe, step: str) -> tuple[str, ...]:
  """The steps that must be done before `step`, in order."""
  steps = chain(recipe)
  if step not in steps:
    raise ValueError(f"{step!r} is not a step of recipe {recipe.name!r}: {steps}")
  return steps[:steps.index(step)]


def init_of(recipe: Recipe, stage: str, workdir: str) -> str:
  """A training stage's init: the previous step's export, or `preset:NAME` for the first."""
  init = stage_registry.spec(stage).init
  if init is not None:
    return export(workdir, init)
  return export(workdir, CONVERT) if _hf_dir(recipe) else f"preset:{recipe.model.preset}"


def _hf_dir(recipe: Recipe) -> str:
  if not recipe.model.preset and not recipe.model.hf_dir:
    raise ValueError(f"recipe {recipe.name!r} starts from a local HF Qwen3 checkpoint: pass "
                     "--config.hf_dir=DIR (config.json, weights, tokenizer.json)")
  return recipe.model.hf_dir


def data_config(recipe: Recipe, traces: bool = True) -> ml_collections.ConfigDict:
  """The data build's config: recipe.data with `tokenizer_base` = the HF directory whose
  tokenizer the build extends ('' = train the tiny BPE) and, when the recipe has an LLM teacher
  (teacher.hf_dir), `teacher_traces` = the teacher step's output (TEACHER_TRACES).

  Args:
    recipe: the recipe.
    traces: False gives the build the teacher itself reads (its training lists, no traces).
  """
  data = _editable(recipe.data)
  data.tokenizer_base = _hf_dir(recipe)
  if recipe.teacher.hf_dir:
    data.teacher_traces = TEACHER_TRACES if traces else ""
  return data


def teacher_spec(recipe: Recipe):
  """The LLM-teacher step's data/llm_teacher.TeacherSpec: recipe.teacher on the recipe's mesh."""
  from gr2jax.data import llm_teacher

  m = recipe.mesh
  return llm_teacher.TeacherSpec(**recipe.teacher.to_dict(), mesh=(m.data, m.fsdp, m.tp))


@dataclasses.dataclass(frozen=True)
class Mesh:
  """The device mesh (train/mesh.make_mesh): each axis's size, -1 = the remaining devices."""
  data: int
  fsdp: int
  tp: int


@dataclasses.dataclass(frozen=True)
class EvalSettings:
  """How stages evaluate: the split, its first `limit` examples (0 = all), the decode batch."""
  split: str
  limit: int
  batch_size: int


@dataclasses.dataclass(frozen=True)
class ModelSettings:
  """The training memory knobs of the model (ModelSpec's)."""
  remat: str
  attention_chunk_bytes: int
  param_dtype: str


@dataclasses.dataclass(frozen=True)
class TrainExamples:
  """The training examples a run reads: the first `limit` (0 = all)."""
  limit: int


_SETTINGS = (Mesh, EvalSettings, ModelSettings, TrainExamples, stage_registry.Settings)


def _sorted(fields: dict) -> dict:
  """`fields` in name order, as ConfigDict.to_dict lists them."""
  return dict(sorted(fields.items()))


def _plain(value):
  """A view field as the ConfigDict views' to_dict() held it: a block (ConfigDict) or a settings
  dataclass as nested dicts in name order, anything else (the DecodeSpec, whole; a path; a
  number) as it is (the run record writes a DecodeSpec's fields: run_identity.json_value)."""
  if isinstance(value, ml_collections.ConfigDict):
    return value.to_dict()
  return _sorted(dataclasses.asdict(value)) if isinstance(value, _SETTINGS) else value


class _View:
  """A typed, frozen view of a recipe: every field is read by attribute, and a field it does
  not have is an AttributeError (tests/test_views.py checks every read of the code against the
  fields, so a stale one fails there)."""

  def to_dict(self) -> dict:
    """The view as the ConfigDict view it replaces wrote it (same keys, same order): the run
    record's `config` and the chain's digests, so existing workdirs resume and are reused
    (tests/test_views.py pins the records). A block the stage does not have (None) is left out."""
    return _sorted({f.name: _plain(getattr(self, f.name)) for f in dataclasses.fields(self)
                    if getattr(self, f.name) is not None})


@dataclasses.dataclass(frozen=True)
class StageView(_View):
  """What a training stage's loop reads (gr2jax/train/loop.py, stages.py): `stage_config`.

  Attributes:
    stage: the stage's name.
    data: the data build's config (data_config; read by the data pipeline).
    init: the previous step's export, or `preset:NAME` for the first.
    mesh, model, eval, decode: the recipe's (decode: its DecodeSpec, whole).
    train, optimizer: the stage's blocks (gr2jax/recipes.py; locked ConfigDicts).
    settings: the stage's own block, typed (gr2jax/stage_registry.py; its `teacher`: the teacher
      stage's export), None for a stage without one; recorded under the block's name (rl, cft,
      opd).
    replay_shrink: the diffusion stages' replay shrinkage, None for the AR stages.
  """
  stage: str
  data: ml_collections.ConfigDict
  init: str
  mesh: Mesh
  model: ModelSettings
  train: ml_collections.ConfigDict
  optimizer: ml_collections.ConfigDict
  eval: EvalSettings
  decode: DecodeSpec
  settings: stage_registry.Settings | None = None
  replay_shrink: int | None = None

  def to_dict(self) -> dict:
    """_View.to_dict with the settings under their block's name (`rl`, `cft`, `opd`)."""
    out = super().to_dict()
    if "settings" in out:
      out[stage_registry.spec(self.stage).block] = out.pop("settings")
    return _sorted(out)


@dataclasses.dataclass(frozen=True)
class EvaluationView(_View):
  """What a standalone evaluation reads (loop.load_context / run_evaluation, stage 'eval'):
  `evaluation_config`. Fields as StageView's; train: every training example (limit 0)."""
  stage: str
  data: ml_collections.ConfigDict
  mesh: Mesh
  eval: EvalSettings
  decode: DecodeSpec
  train: TrainExamples


@dataclasses.dataclass(frozen=True)
class TablesView(_View):
  """What Table 3, Table 4 and Figure 6 read (gr2jax/apps/tables.py run_<stage>):
  `tables_config`.

  Attributes:
    stage: 'table3', 'table4' or 'fig6'.
    data, eval, decode: the recipe's data build config, evaluation settings and DecodeSpec.
    split, results_dir, taus, lossless_drafts, speed_examples, remeasure: the recipe's `table`
      fields (gr2jax/recipes.py).
    ar_ckpt, diffusion_ckpt: the AR GR2 (AR RL export) and the final diffusion model (RL
      export).
    fig6: Figure 6's settings (a locked ConfigDict).
  """
  stage: str
  data: ml_collections.ConfigDict
  eval: EvalSettings
  decode: DecodeSpec
  split: str
  ar_ckpt: str
  diffusion_ckpt: str
  results_dir: str
  taus: tuple
  lossless_drafts: tuple
  speed_examples: int
  fig6: ml_collections.ConfigDict
  remeasure: bool


def _locked(config) -> ml_collections.ConfigDict:
  """A block as a view holds it: a locked ConfigDict (a frozen block's copy), whose fields can
  be read and set but not added."""
  c = _editable(config) if isinstance(config, ml_collections.FrozenConfigDict) else config
  c.lock()
  return c


def _settings(cls, block):
  """A typed settings dataclass of a recipe block with the same fields."""
  return cls(**block.to_dict())


def stage_config(recipe: Recipe, stage: str, workdir: str) -> StageView:
  """The view a training stage's loop reads (gr2jax/train/loop.py, stages.py), derived from
  the recipe: nothing in it is set anywhere else (StageView's fields)."""
  spec = stage_registry.spec(stage)
  s = recipe.stages[stage]
  settings = recipe.settings[stage]
  if spec.teacher is not None:
    settings = dataclasses.replace(settings, teacher=export(workdir, spec.teacher))
  m = recipe.model
  return StageView(
    stage=stage, data=_locked(data_config(recipe)), init=init_of(recipe, stage, workdir),
    mesh=_settings(Mesh, recipe.mesh),
    model=ModelSettings(remat=m.remat, attention_chunk_bytes=m.attention_chunk_bytes,
                        param_dtype=m.param_dtype),
    train=_locked(s.train), optimizer=_locked(s.optimizer),
    eval=_settings(EvalSettings, recipe.eval), decode=recipe.decode,
    settings=settings, replay_shrink=recipe.replay_shrink if spec.diffusion else None)


def evaluation_config(recipe: Recipe) -> EvaluationView:
  """What a standalone evaluation reads (EvaluationView's fields)."""
  return EvaluationView(stage="eval", data=_locked(data_config(recipe)),
                        mesh=_settings(Mesh, recipe.mesh),
                        eval=_settings(EvalSettings, recipe.eval), decode=recipe.decode,
                        train=TrainExamples(limit=0))


def tables_config(recipe: Recipe, stage: str, workdir: str) -> TablesView:
  """What Table 3, Table 4 and Figure 6 read (TablesView's fields)."""
  t = recipe.table
  return TablesView(
    stage=stage, data=_locked(data_config(recipe)), eval=_settings(EvalSettings, recipe.eval),
    decode=recipe.decode, split=t.split, ar_ckpt=export(workdir, "ar_rl"),
    diffusion_ckpt=export(workdir, "rl"), results_dir=t.results_dir, taus=t.taus,
    lossless_drafts=t.lossless_drafts, speed_examples=t.speed_examples,
    fig6=_locked(t.fig6), remeasure=t.remeasure)
