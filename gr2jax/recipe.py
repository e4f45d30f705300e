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

from gr2jax import settings, stage_registry
from gr2jax.data.build_settings import DataSettings, TeacherSettings
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.table_settings import Fig6Settings, TableSettings

CONVERT = "convert"  # the HF checkpoint converted with the project's tokens added
TEACHER = "teacher"  # the LLM-teacher step (teacher.hf_dir set): traces for the data build
TEACHER_TRACES = os.path.join("{workdir}", TEACHER, "traces.jsonl")  # its output (data/pipeline.py
#                                                   resolves {workdir})


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings(settings.Settings):
  """The training memory knobs of the model (what a stage view records as `model`)."""
  WHERE = "model."
  remat: str = settings.choice("none", doc="'none' | 'full' (recompute each layer in the "
                               "backward pass)", choices=("none", "full"))
  attention_chunk_bytes: int = settings.integer(8 << 20, doc="f32 attention scores per query "
                                                "chunk (8 MiB: CPU)", minimum=1)
  param_dtype: str = settings.choice("", doc="'' keeps the checkpoint's dtype; 'bfloat16' "
                                     "(fp32 Adam moments) / 'float32'",
                                     choices=("", "float32", "bfloat16"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelBlock(ModelSettings):
  """The recipe's `model` block: the preset trained from scratch and the memory knobs."""
  preset: str = settings.text("tiny_deep", doc="gr2jax ModelConfig preset sized to the "
                              "tokenizer, used when hf_dir is ''")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec(ModelBlock):
  """The model a recipe starts from: the block, with the preset '' under an HF recipe."""
  hf_dir: str = settings.text("", doc="a local HF Qwen3 directory (config.json + weights + "
                              "tokenizer); its tokenizer is extended with the project's tokens")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Mesh(settings.Settings):
  """The device mesh (train/mesh.make_mesh): each axis's size, -1 = the remaining devices."""
  WHERE = "mesh."
  data: int = settings.integer(1, doc="data-parallel replicas", minimum=-1)
  fsdp: int = settings.integer(-1, doc="parameter-sharded data parallelism (-1 = the remaining "
                               "devices)", minimum=-1)
  tp: int = settings.integer(1, doc="tensor parallelism", minimum=-1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvalSettings(settings.Settings):
  """How stages evaluate: the split, its first `limit` examples (0 = all), the decode batch."""
  WHERE = "eval."
  split: str = settings.choice("test_1615", doc="'test_1615' (the paper's 1,615 users) | "
                               "'test' | 'validation'",
                               choices=("test_1615", "test", "validation"))
  limit: int = settings.integer(0, doc="evaluate only the first N examples (0 = all)",
                                minimum=0)
  batch_size: int = settings.integer(256, doc="decode batch size", minimum=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunSettings(settings.Settings):
  """The recipe's top-level settings."""
  recipe: str = settings.text("tiny", doc="the recipe's name (gr2jax/recipes.py RECIPES)")
  hf_dir: str = settings.text("", doc="a local HF Qwen3 directory to start from ('' = "
                              "model.preset from scratch)")
  upstream: str = settings.choice("check", doc="a stage whose upstream stages are not done: "
                                  "'check' names them and their commands, 'run' runs them "
                                  "first", choices=("check", "run"))
  stage: str = settings.text("table2", doc="what experiments/run.py runs (its STAGES key; the "
                             "config file sets it)")
  replay_shrink: int = settings.integer(1, doc="OPD / RL replay step shrinkage (1 = exact; k "
                                        "merges k steps per round)", minimum=1)
  xla_flags: tuple = settings.value(
    (), doc="XLA flags every compile of the run needs ('--xla_<name>=<value>'): run.py merges "
    "them into XLA_FLAGS before JAX starts, plan.py --target compiles with them",
    what="tuple of '--xla_<name>=<value>'", check=lambda w, n, v: _check_xla_flags(w, n, v))


@dataclasses.dataclass(frozen=True)
class Recipe:
  """One reproduction (module docstring).

  Attributes:
    name: the recipe's name (gr2jax/recipes.py).
    data: the data build (the prompt in data.prompt).
    model: the starting model.
    decode: how every evaluation and served request of the recipe decodes.
    mesh: the device mesh (data, fsdp, tp; -1 = the remaining devices).
    eval: split, limit (first N users; 0 = all) and decode batch size of stage evaluations.
    stages: {stage: its settings (train, optimizer and its own block, `.own`: rl, cft, opd;
      gr2jax/stage_registry.StageSettings)}.
    replay_shrink: OPD / RL replay step shrinkage (1 = exact; k merges k steps per round).
    table: Table 2's splits, diffusion_splits and results_dir; Table 3 / 4, Figure 6.
    teacher: the LLM-teacher step's settings (teacher_spec; hf_dir '' = the rule teacher).
    xla_flags: XLA flags every compile of the run needs, as XLA_FLAGS entries '--name=value'
      (parse_xla_flags): experiments/run.py merges them into XLA_FLAGS before JAX starts its
      backend; experiments/plan.py compiles its targets with them.
  """
  name: str
  data: DataSettings
  model: ModelSpec
  decode: DecodeSpec
  mesh: Mesh
  eval: EvalSettings
  stages: Mapping[str, stage_registry.StageSettings]
  replay_shrink: int
  table: TableSettings
  teacher: TeacherSettings
  xla_flags: tuple[str, ...]

  def __post_init__(self):
    """The rules between blocks: the data build's tokenizer base is the model's (hf_dir), an
    LLM-teacher step (teacher.hf_dir) writes the traces the build reads, and Table 3 decodes
    under the recipe's own commit order (its readers take those rows as the recipe's)."""
    if self.data.tokenizer_base:
      raise ValueError("data.tokenizer_base is derived from --config.hf_dir; set that instead")
    if self.teacher.hf_dir and self.data.teacher_traces:
      raise ValueError(f"data.teacher_traces={self.data.teacher_traces!r} and teacher.hf_dir="
                       f"{self.teacher.hf_dir!r} are both set: the teacher step writes the "
                       "traces; set one of them")
    if self.table.commit_orders and self.decode.commit_order not in self.table.commit_orders:
      raise ValueError(f"table.commit_orders={self.table.commit_orders!r} must hold "
                       f"decode.commit_order={self.decode.commit_order!r}: Table 3's rows under "
                       "the recipe's own order are the ones its readers take")


_XLA_FLAG = re.compile(r"--(xla_\w+)=(\S+)")


def _check_xla_flags(where: str, name: str, flags) -> None:
  if not isinstance(flags, (tuple, list)):
    raise settings.WrongKind(f"{settings.label(where, name)}={flags!r} must be a tuple of "
                             "strings")
  parse_xla_flags(flags)


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
    ValueError: a bad setting (its block's declaration: the error names the field's path), a
      rule between blocks broken (Recipe's), a stage missing from config.stages.
    FileNotFoundError: hf_dir without a config.json.
  """
  run = RunSettings.of({f: config[f] for f in settings.defaults(RunSettings)}, "")
  if run.hf_dir and not os.path.isfile(os.path.join(run.hf_dir, "config.json")):
    raise FileNotFoundError(f"--config.hf_dir={run.hf_dir}: no config.json there (expected a "
                            "local HF Qwen3 directory)")
  stages = stage_registry.names()
  missing = [s for s in stages if s not in config.stages]
  if missing:
    raise ValueError(f"recipe {config.recipe!r}: config.stages lacks {missing}")
  model = ModelBlock.of(config.model.to_dict(), "model.")
  return Recipe(
    name=run.recipe,
    data=DataSettings.of(config.data.to_dict(), "data."),
    model=ModelSpec(**{**model.to_dict(), "preset": "" if run.hf_dir else model.preset},
                    hf_dir=run.hf_dir),
    decode=DecodeSpec.of(config.decode.to_dict(), "decode."),
    mesh=Mesh.of(config.mesh.to_dict(), "mesh."),
    eval=EvalSettings.of(config.eval.to_dict(), "eval."),
    stages=types.MappingProxyType({s: stage_registry.StageSettings.of_stage(
      s, config.stages[s].to_dict(), f"stages.{s}.") for s in stages}),
    replay_shrink=run.replay_shrink,
    table=TableSettings.of(config.table.to_dict(), "table."),
    teacher=TeacherSettings.of(config.teacher.to_dict(), "teacher."),
    xla_flags=tuple(run.xla_flags))


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


def data_config(recipe: Recipe, traces: bool = True) -> DataSettings:
  """The data build's settings: recipe.data with `tokenizer_base` = the HF directory whose
  tokenizer the build extends ('' = train the tiny BPE) and, when the recipe has an LLM teacher
  (teacher.hf_dir), `teacher_traces` = the teacher step's output (TEACHER_TRACES).

  Args:
    recipe: the recipe.
    traces: False gives the build the teacher itself reads (its training lists, no traces).
  """
  data = recipe.data.replace(tokenizer_base=_hf_dir(recipe))
  if recipe.teacher.hf_dir:
    data = data.replace(teacher_traces=TEACHER_TRACES if traces else "")
  return data


def teacher_spec(recipe: Recipe):
  """The LLM-teacher step's data/llm_teacher.TeacherSpec: recipe.teacher on the recipe's mesh."""
  from gr2jax.data import llm_teacher

  m = recipe.mesh
  return llm_teacher.TeacherSpec(**dataclasses.asdict(recipe.teacher),
                                 mesh=(m.data, m.fsdp, m.tp))


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainExamples(settings.Settings):
  """The training examples an evaluation's run reads: the first `limit` (0 = all)."""
  limit: int = settings.integer(0, doc="the first N training examples (0 = all)", minimum=0)


def _sorted(fields: dict) -> dict:
  """`fields` in name order, as ConfigDict.to_dict lists them."""
  return dict(sorted(fields.items()))


def _plain(value):
  """A view field as the ConfigDict views' to_dict() held it: a settings block as nested dicts in
  name order, anything else (the DecodeSpec, whole; a path; a number) as it is (the run record
  writes a DecodeSpec's fields: run_identity.json_value)."""
  if isinstance(value, settings.Settings) and not isinstance(value, DecodeSpec):
    return value.to_dict()
  return value


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
    data: the data build's settings (data_config; read by the data pipeline).
    init: the previous step's export, or `preset:NAME` for the first.
    mesh, model, eval, decode: the recipe's (decode: its DecodeSpec, whole).
    train, optimizer: the stage's blocks (stage_registry.TrainSettings, OptimizerSettings).
    settings: the stage's own block (gr2jax/stage_registry.py; its `teacher`: the teacher
      stage's export), None for a stage without one; recorded under the block's name (rl, cft,
      opd).
    replay_shrink: the diffusion stages' replay shrinkage, None for the AR stages.
  """
  stage: str
  data: DataSettings
  init: str
  mesh: Mesh
  model: ModelSettings
  train: stage_registry.TrainSettings
  optimizer: stage_registry.OptimizerSettings
  eval: EvalSettings
  decode: DecodeSpec
  settings: stage_registry.StageBlock | None = None
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
  data: DataSettings
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
    split, results_dir, taus, commit_orders, full_split_taus, lossless_drafts, speed_examples,
      remeasure: the recipe's `table` fields (gr2jax/recipes.py); commit_orders () is the
      recipe's decode.commit_order alone.
    ar_ckpt, diffusion_ckpt: the AR GR2 (AR RL export) and the final diffusion model (RL
      export).
    fig6: Figure 6's settings.
  """
  stage: str
  data: DataSettings
  eval: EvalSettings
  decode: DecodeSpec
  split: str
  ar_ckpt: str
  diffusion_ckpt: str
  results_dir: str
  taus: tuple
  commit_orders: tuple
  full_split_taus: tuple
  lossless_drafts: tuple
  speed_examples: int
  fig6: Fig6Settings
  remeasure: bool


def stage_config(recipe: Recipe, stage: str, workdir: str) -> StageView:
  """The view a training stage's loop reads (gr2jax/train/loop.py, stages.py), derived from
  the recipe: nothing in it is set anywhere else (StageView's fields)."""
  spec = stage_registry.spec(stage)
  s = recipe.stages[stage]
  own = s.own
  if spec.teacher is not None:
    own = own.replace(teacher=export(workdir, spec.teacher))
  m = recipe.model
  return StageView(
    stage=stage, data=data_config(recipe), init=init_of(recipe, stage, workdir),
    mesh=recipe.mesh,
    model=ModelSettings(remat=m.remat, attention_chunk_bytes=m.attention_chunk_bytes,
                        param_dtype=m.param_dtype),
    train=s.train, optimizer=s.optimizer, eval=recipe.eval, decode=recipe.decode,
    settings=own, replay_shrink=recipe.replay_shrink if spec.diffusion else None)


def evaluation_config(recipe: Recipe) -> EvaluationView:
  """What a standalone evaluation reads (EvaluationView's fields)."""
  return EvaluationView(stage="eval", data=data_config(recipe),
                        mesh=recipe.mesh, eval=recipe.eval, decode=recipe.decode,
                        train=TrainExamples(limit=0))


def tables_config(recipe: Recipe, stage: str, workdir: str) -> TablesView:
  """What Table 3, Table 4 and Figure 6 read (TablesView's fields)."""
  t = recipe.table
  return TablesView(
    stage=stage, data=data_config(recipe), eval=recipe.eval,
    decode=recipe.decode, split=t.split, ar_ckpt=export(workdir, "ar_rl"),
    diffusion_ckpt=export(workdir, "rl"), results_dir=t.results_dir, taus=t.taus,
    commit_orders=t.commit_orders or (recipe.decode.commit_order,),
    full_split_taus=t.full_split_taus,
    lossless_drafts=t.lossless_drafts, speed_examples=t.speed_examples,
    fig6=t.fig6, remeasure=t.remeasure)
