"""The checks of a stage config's sizes and rates, run before anything is built.

`check_stage_config(config)` reads the shared sections (train, optimizer, eval, rerank) and
replay_shrink through attribute access only, so a recipe's stage block, a stage view
(gr2jax/recipe.stage_config) or any object with the same attribute names can be checked by it;
a stage's own block (rl / cft / opd) is typed and checks itself when built
(gr2jax/stage_registry.py). Each value goes through gr2jax/model/validate.py's scalar checks. A
section a config lacks (a data-only config has no `train`) is skipped. The first bad field found
is a `ValueError` naming it, its value and what it must be; then the rows of a step (batch_size
x the stage's rows field, e.g. its group size) must split into train.micro_batches.
"""

from gr2jax import stage_registry
from gr2jax.model import validate

_MISSING = object()


def _section(config, name: str):
  return getattr(config, name, None)


_SIZES = (  # (section, field, check, its bounds)
  ("train", "steps", validate.integer, dict(minimum=1)),
  ("train", "batch_size", validate.integer, dict(minimum=1)),
  ("train", "micro_batches", validate.integer, dict(minimum=1)),
  ("train", "prepare_chunk", validate.integer, dict(minimum=0)),
  ("train", "save_every", validate.integer, dict(minimum=1)),
  ("train", "keep", validate.integer, dict(minimum=1)),
  ("train", "eval_every", validate.integer, dict(minimum=0)),
  ("train", "probe_prompts", validate.integer, dict(minimum=0)),
  ("train", "probe_every", validate.integer, dict(minimum=0)),
  ("train", "limit", validate.integer, dict(minimum=0)),
  ("optimizer", "learning_rate", validate.real, dict(low=0.0, low_open=True)),
  ("optimizer", "warmup_steps", validate.integer, dict(minimum=0)),
  ("optimizer", "total_steps", validate.integer, dict(minimum=1)),
  ("optimizer", "end_lr_factor", validate.real, dict(low=0.0, high=1.0)),
  ("optimizer", "b1", validate.real, dict(low=0.0, high=1.0, high_open=True)),
  ("optimizer", "b2", validate.real, dict(low=0.0, high=1.0, high_open=True)),
  ("optimizer", "eps", validate.real, dict(low=0.0, low_open=True)),
  ("optimizer", "weight_decay", validate.real, dict(low=0.0)),
  ("optimizer", "clip_norm", validate.real, dict(low=0.0)),
  ("eval", "batch_size", validate.integer, dict(minimum=1)),
  ("eval", "limit", validate.integer, dict(minimum=0)),
  ("rerank", "batch_size", validate.integer, dict(minimum=1)),
  ("rerank", "max_new_tokens", validate.integer, dict(minimum=0)),
)


def check_stage_config(config, prefix: str = "", stage: str | None = None,
                       settings=None) -> None:
  """Checks every size and rate a stage config has (module docstring).

  Args:
    config: a stage view (gr2jax/recipe.stage_config), a recipe's stage block
      (`config.stages.<stage>`: train, optimizer, its own block), or any object with the same
      attribute names.
    prefix: prepended to the field names in errors (e.g. 'stages.sft.').
    stage, settings: the training stage and its typed settings, whose rows field multiplies
      the rows of a step (default: a view's `stage` and `settings`).

  Raises:
    ValueError: names the first bad field, e.g. "train.keep=0 must be >= 1".
  """
  for section_name, field, check, bounds in _SIZES:
    section = _section(config, section_name)
    value = _MISSING if section is None else getattr(section, field, _MISSING)
    if value is not _MISSING:
      check(f"{prefix}{section_name}.", field, value, **bounds)
  shrink = getattr(config, "replay_shrink", None)  # None: an AR stage's view
  if shrink is not None:
    validate.integer(prefix, "replay_shrink", shrink, minimum=1)
  train = _section(config, "train")
  if train is not None and getattr(train, "batch_size", None) is not None:
    spec = stage_registry.STAGES.get(stage or getattr(config, "stage", None))
    if spec is not None:  # a training stage (not an evaluation's view)
      _check_divisible(spec, settings if stage else config.settings, train, prefix)


def _check_divisible(spec: stage_registry.StageSpec, settings, train, prefix: str) -> None:
  """The rows of a step (batch_size x the stage's rows field: the on-policy stages' group size)
  split into micro_batches (prepare_chunk need not divide them: chunks.map_row_chunks pads the
  last)."""
  group = spec.rows_per_prompt(settings)
  rows = train.batch_size * group
  detail = (f" ({prefix}train.batch_size={train.batch_size} x {spec.rows_field}={group})"
            if group > 1 else "")
  if rows % train.micro_batches:
    raise ValueError(f"{prefix}train.micro_batches={train.micro_batches} must be a divisor of "
                     f"the {rows} rows per step{detail}")
