"""Run identity: what a run is, written so that it can be compared, the floor below training.

- The run record (`run_record`): what a training run's checkpoints must agree with to be resumed
  (the resolved config, the data build, the init's digest, P and R). It describes the work, not
  where it lives: a path inside the run's workdir is kept relative to it (gr2jax/workdir.portable,
  "{workdir}/sft/export"), and a path inside the checkout relative to the checkout
  ("{checkout}/data/amazon_beauty", the shipped data), so the same run resumes with the workdir
  spelled relative or absolute, from another directory, after the workdir was moved or copied, or
  from another clone or a moved checkout. A data_dir outside the checkout is compared as its
  absolute path.
- What a resume may change (RUN_NEUTRAL, RUN_NEUTRAL_SECTIONS; train.steps only when not below
  the checkpoint's step, gr2jax/train/run_checkpoints.check_resume), the fields added to the
  recipe or retired after runs were recorded (ADDED_AT_DEFAULT), and so the fields that alter a
  run (`changed_fields`) and those that decide what it produces (`result_fields`).
- The step runner's identity of each step (gr2jax/chain.py): its view of the recipe
  (`step_view`), the data build's digest (`data_digest`) and the chain of step digests
  (`step_digests`, `known_digests`), recorded in W/<step>/started.json and done.json. The results
  stamp (gr2jax/apps/report.py) is computed from them without loading the trainer or the chain.

This module reads the recipe's typed views (gr2jax/recipe.py) and the export format's content
digest; it imports no training module, optax or orbax (tests/test_layers.py).
"""

import dataclasses
import json
import os

from gr2jax import exports, files
from gr2jax import recipe as recipe_lib
from gr2jax import workdir as workdir_lib
from gr2jax.decoding.spec import DecodeSpec

# Record fields a resume may change: how often to save / keep / evaluate, the evaluation itself,
# the mesh and the memory knobs (exact: micro-batches sum before dividing, remat and attention
# chunks recompute the same values).
RUN_NEUTRAL = ("config.train.steps", "config.train.save_every", "config.train.keep",
               "config.train.async_save", "config.train.eval_every", "config.train.micro_batches",
               "config.train.probe_prompts", "config.train.probe_every",
               "config.model.remat", "config.model.attention_chunk_bytes",
               "config.decode.eval_tau")  # evaluation-only: a resume may change it
RUN_NEUTRAL_SECTIONS = ("config.eval.", "config.mesh.")
# Fields added to the recipe after runs were recorded without them, each at the value that does
# what those runs did: a record holding one at that value is the same record as one without it
# (`without_added_defaults`), so checkpoints and chain steps recorded before the field existed
# still resume and are reused. Any other value is a change like any other. Retired fields, which
# the recipe no longer has, are listed the same way: cft.pivot_align and cft.answer_pair were
# retired after losing their ablations, so a record written while they existed, both at False,
# is the same record as one written now; one with either at True is a change (a run this code
# cannot redo).
ADDED_AT_DEFAULT = {"data.drop_unusable_users": False, "opd.context": "commit_step",
                    "cft.pivot_align": False, "cft.answer_pair": False,  # both retired
                    "rl.temperature": 1.0, "rl.rollout_tau": 0.9,
                    "rl.valid_weight": 0.0, "rl.speed_weight": 0.0,
                    "opd.objective": "kl", "opd.certainty": 0.0,
                    # OPD's rollouts were the decode spec's (it records them at their retired
                    # values, DecodeSpec.record): now OPD's own settings
                    "opd.rollout_tau": 0.9, "opd.temperature": 1.0}
STARTED_FILE, DONE_FILE = "started.json", "done.json"  # W/<step>/: a step's record
_TEACHER_NEUTRAL = ("batch_size", "mesh", "restart")  # how, not what, the teacher samples


def run_record(config, *, workdir: str, data_build: dict, init_sha256: str,
               lengths: tuple[int, int]) -> dict:
  """What a run's checkpoints must agree with to be resumed (JSON-normalised, `portable`).

  Args:
    config: the run config (`train.restart` is left out: it only says how this run starts).
    workdir: the run's workdir (paths inside it are recorded relative to it, paths inside the
      checkout relative to the checkout).
    data_build: exports.data_build_record of the run's data build.
    init_sha256: the digest of config.init (loop.init_digest: of its content, not its path).
    lengths: the static (P, R) of the run's batches.
  """
  resolved = config.to_dict()
  resolved.get("train", {}).pop("restart", None)
  record = {"config": resolved, "data_build": data_build, "init_sha256": init_sha256,
            "lengths": list(lengths)}
  return workdir_lib.portable(json.loads(json.dumps(record, default=json_value)), workdir)


def json_value(value):
  """The view's DecodeSpec as its record (DecodeSpec.record: its retired fields kept), another
  dataclass as its fields, anything else as its str()."""
  if isinstance(value, DecodeSpec):
    return value.record()
  return dataclasses.asdict(value) if dataclasses.is_dataclass(value) else str(value)


def without_added_defaults(tree: dict, prefix: str = "config.") -> dict:
  """A nested record without the ADDED_AT_DEFAULT fields that hold their default; `prefix` is
  what the record's paths start with before the recipe's field path ('config.' for a run
  record, '' for a stage view, 'data.' for a data build config)."""
  def keep(path: str, value) -> bool:
    field = path.removeprefix(prefix) if path.startswith(prefix) else None
    return field not in ADDED_AT_DEFAULT or ADDED_AT_DEFAULT[field] != value

  def walk(node, path: str):
    if not isinstance(node, dict):
      return node
    return {k: walk(v, f"{path}{k}.") for k, v in node.items() if keep(f"{path}{k}", v)}

  return walk(tree, "")


def _flat(tree, prefix: str = "") -> dict:
  if not isinstance(tree, dict):
    return {prefix: tree}
  out = {}
  for key, value in tree.items():
    out.update(_flat(value, f"{prefix}.{key}" if prefix else key))
  return out


def _neutral_fields(*flat_records: dict) -> set[str]:
  """RUN_NEUTRAL, plus optimizer.total_steps when every record has a constant schedule."""
  neutral = set(RUN_NEUTRAL)
  if {r.get("config.optimizer.schedule") for r in flat_records} == {"constant"}:
    neutral.add("config.optimizer.total_steps")
  return neutral


def changed_fields(saved: dict, current: dict) -> list[tuple[str, object, object]]:
  """[(field, saved value, current value)] of the record fields that alter the run; a path of
  this checkout that an older record wrote absolute is the same as its "{checkout}/..." form
  (workdir.in_checkout)."""
  a, b = (_flat(without_added_defaults(workdir_lib.in_checkout(r))) for r in (saved, current))
  neutral = _neutral_fields(a, b)
  missing = "<absent>"
  return [(k.removeprefix("config."), a.get(k, missing), b.get(k, missing))
          for k in sorted(a.keys() | b.keys())
          if k not in neutral and not k.startswith(RUN_NEUTRAL_SECTIONS)
          and a.get(k, missing) != b.get(k, missing)]


def result_fields(record: dict) -> dict[str, object]:
  """{field: value} of a record that decide what the run produces (its export): every field but
  the neutral ones (`changed_fields`), train.steps included. What a chain step's digest covers
  (`step_digests`), so a changed evaluation or save interval changes no digest."""
  flat = _flat(without_added_defaults(record))
  neutral = _neutral_fields(flat) - {"config.train.steps"}
  return {k: v for k, v in flat.items()
          if k not in neutral and not k.startswith(RUN_NEUTRAL_SECTIONS)}


def _model_digest(path: str) -> str | None:
  """exports.content_digest of a model directory (read without its weights; None when there is
  none: the step itself then names the missing directory)."""
  return exports.content_digest(path) if os.path.isdir(path) else None


def step_view(recipe: recipe_lib.Recipe, step: str, workdir: str, checkout: bool = True) -> dict:
  """What step's result depends on, as a run record (`{"config": ...}`), paths inside workdir
  and inside the checkout relative to them (workdir_lib.portable; `checkout`: its argument): a
  training stage's view of the recipe (what its
  loop records), convert's HF directory (and its content digest) and dtype, the teacher's spec,
  model content digest and data build."""
  if step == recipe_lib.CONVERT:
    config = {"hf_dir": recipe.model.hf_dir, "model": _model_digest(recipe.model.hf_dir),
              "param_dtype": recipe.model.param_dtype}
  elif step == recipe_lib.TEACHER:
    spec = dataclasses.asdict(recipe_lib.teacher_spec(recipe))
    config = {"spec": {k: v for k, v in spec.items() if k not in _TEACHER_NEUTRAL},
              "model": _model_digest(spec["hf_dir"]),
              "data": recipe_lib.data_config(recipe, traces=False).to_dict()}
  else:
    config = recipe_lib.stage_config(recipe, step, workdir).to_dict()
    config["train"].pop("restart")  # how this run starts, not what it makes (as run_record)
  record = json.loads(json.dumps({"config": config}, default=json_value))
  return workdir_lib.portable(record, workdir, checkout)


def data_digest(recipe: recipe_lib.Recipe, workdir: str, checkout: bool = True) -> str:
  """The digest of the recipe's data build config (less ADDED_AT_DEFAULT fields at their
  default, paths portable): the first link of the step digests' chain."""
  data = without_added_defaults({"data": recipe_lib.data_config(recipe).to_dict()}, "")["data"]
  return files.json_digest(workdir_lib.portable(
    json.loads(json.dumps(data, default=json_value)), workdir, checkout))


def step_digests(recipe: recipe_lib.Recipe, workdir: str, checkout: bool = True
                 ) -> dict[str, str]:
  """{step: digest} for the recipe's chain: of the fields of the step's view (`step_view`) that
  change its result (`result_fields`: not how often it saves or evaluates, nor where the workdir
  or the checkout lives) chained with every earlier step's (the first: the data build's config,
  `data_digest`). done.json also records the data build's digest (`data`), the same for every
  step. `checkout=False`: the digests of a record written before paths inside the checkout were
  "{checkout}/..." (workdir_lib.portable)."""
  keys, upstream = {}, data_digest(recipe, workdir, checkout)
  for step in recipe_lib.chain(recipe):
    fields = result_fields(step_view(recipe, step, workdir, checkout))
    upstream = keys[step] = files.json_digest([upstream, fields])
  return keys


def known_digests(recipe: recipe_lib.Recipe, workdir: str) -> dict[str, tuple[str, ...]]:
  """{'data' and each step: the digests its record may hold to count as this recipe's}: the
  digest (step_digests) first, then the one recorded before paths inside the checkout were
  "{checkout}/..." with the checkout where it is now (the same digest, once, where the recipe
  names no path inside the checkout)."""
  def digests(checkout: bool) -> dict[str, str]:
    return {"data": data_digest(recipe, workdir, checkout),
            **step_digests(recipe, workdir, checkout)}

  now, before = digests(True), digests(False)
  return {k: tuple(dict.fromkeys((now[k], before[k]))) for k in now}
