"""The one validation of every size and rate of a stage config, run before anything is built.

`check_stage_config(config)` reads the stage fields (train, optimizer, eval, rl / cft / opd,
diffusion, rerank) through attribute access only, so a recipe's stage block, a stage view
(gr2jax/recipe.stage_config) or any object with the same attribute names can be checked by it;
`recipe.from_config` checks every stage of a recipe this way before anything is built. A section
a config lacks (a data-only config has no `train`, an AR stage no `diffusion`) is skipped. The
first bad field found is a `ValueError` naming it, its value and what it must be.
"""

import math
import numbers

_MISSING = object()


def _fail(field: str, value, must: str):
  raise ValueError(f"{field}={value!r}: must be {must}")


def _int(field: str, value, minimum: int) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    _fail(field, value, f"an integer >= {minimum}")
  if value < minimum:
    _fail(field, value, f">= {minimum}")


def _float(field: str, value, *, low: float, high: float = math.inf, low_open: bool = False,
           high_open: bool = False) -> None:
  if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
    _fail(field, value, "a finite number")
  too_low = value <= low if low_open else value < low
  too_high = value >= high if high_open else value > high
  if too_low or too_high:
    interval = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    _fail(field, value, f"in {interval}")


def _section(config, name: str):
  return getattr(config, name, None)


# (section, field, kind, bounds): "int" -> minimum; "float" -> keyword bounds of _float.
_SIZES = (
  ("train", "steps", "int", 1),
  ("train", "batch_size", "int", 1),
  ("train", "micro_batches", "int", 1),
  ("train", "prepare_chunk", "int", 0),
  ("train", "save_every", "int", 1),
  ("train", "keep", "int", 1),
  ("train", "eval_every", "int", 0),
  ("train", "limit", "int", 0),
  ("optimizer", "learning_rate", "float", dict(low=0.0, low_open=True)),
  ("optimizer", "warmup_steps", "int", 0),
  ("optimizer", "total_steps", "int", 1),
  ("optimizer", "end_lr_factor", "float", dict(low=0.0, high=1.0)),
  ("optimizer", "b1", "float", dict(low=0.0, high=1.0, high_open=True)),
  ("optimizer", "b2", "float", dict(low=0.0, high=1.0, high_open=True)),
  ("optimizer", "eps", "float", dict(low=0.0, low_open=True)),
  ("optimizer", "weight_decay", "float", dict(low=0.0)),
  ("optimizer", "clip_norm", "float", dict(low=0.0)),
  ("eval", "batch_size", "int", 1),
  ("eval", "limit", "int", 0),
  ("rerank", "batch_size", "int", 1),
  ("rerank", "max_new_tokens", "int", 0),
  ("rl", "group_size", "int", 2),  # GRPO: a group of 1 has no variance, every group is dropped
  ("rl", "eps_low", "float", dict(low=0.0, high=1.0)),
  ("rl", "eps_high", "float", dict(low=0.0)),
  ("rl", "alpha", "float", dict(low=0.0)),
  ("rl", "temperature", "float", dict(low=0.0, low_open=True)),  # rollouts sample
  ("rl", "rollout_tau", "float", dict(low=0.0, high=1.0, low_open=True)),  # diffusion RL only
  ("opd", "group_size", "int", 1),
  ("cft", "eps", "float", dict(low=0.0, high=1.0, high_open=True)),
)


def check_stage_config(config, prefix: str = "") -> None:
  """Checks every size and rate a stage config has (module docstring).

  Args:
    config: a stage view (gr2jax/recipe.stage_config), a recipe's stage block
      (`config.stages.<stage>`: train, optimizer, its rl / cft / opd), or any object with the
      same attribute names.
    prefix: prepended to the field names in errors (e.g. 'stages.sft.').

  Raises:
    ValueError: names the first bad field, e.g. "train.keep=0: must be >= 1".
  """
  for section_name, field, kind, bounds in _SIZES:
    section = _section(config, section_name)
    value = _MISSING if section is None else getattr(section, field, _MISSING)
    if value is _MISSING:
      continue
    name = f"{prefix}{section_name}.{field}"
    if kind == "int":
      _int(name, value, bounds)
    else:
      _float(name, value, **bounds)
  shrink = getattr(config, "replay_shrink", None)  # None: an AR stage's view
  if shrink is not None:
    _int(f"{prefix}replay_shrink", shrink, 1)
  train = _section(config, "train")
  if train is not None and getattr(train, "batch_size", None) is not None:
    _check_divisible(config, train, prefix)


def _check_divisible(config, train, prefix: str) -> None:
  """The rows of a step (batch_size x group size for the on-policy stages) split into
  micro_batches (prepare_chunk need not divide them: chunks.map_row_chunks pads the last)."""
  group = 1
  for section_name in ("rl", "opd"):
    section = _section(config, section_name)
    if section is not None and getattr(section, "group_size", None) is not None:
      group = section.group_size
  rows = train.batch_size * group
  detail = (f" ({prefix}train.batch_size={train.batch_size} x group_size={group})"
            if group > 1 else "")
  if rows % train.micro_batches:
    _fail(f"{prefix}train.micro_batches", train.micro_batches,
          f"a divisor of the {rows} rows per step{detail}")
