"""THE settings schema: every settings block of gr2jax is declared once, in one way.

A block is a frozen, keyword-only dataclass deriving from `Settings` whose fields are made by the
field kinds below (`integer`, `real`, `flag`, `choice`, `text`, `ints`, `reals`, `texts`, `items`,
`value`, `block`). Each field carries its default (or none: the caller must give it), a one-line
doc and its bounds; `Settings.__post_init__` checks every field from that metadata, then the
block's own cross-field rule (`check`, written in the class that owns both fields). A bad value
is a ValueError (a TypeError too for a value of the wrong kind: `WrongKind`) naming the field
with its path: `stages.cft.train.steps=0 must be >= 1` when the block was built with
`Cls.of(values, where='stages.cft.train.')`, `decode.eval_tau=...` for a block whose `WHERE` is
'decode.', the bare field otherwise.

The command line's ConfigDict is built from these declarations (`config_of`: the defaults, a
recipe's values over them, gr2jax/recipes.py) and read back into them (`Cls.of`); `describe`
lists each field's path, default, bounds and doc (experiments/run.py --help). A block's
`to_dict()` is its fields as nested dicts in name order, the form ConfigDict.to_dict() gave
records and digests before the schema, so they stay the same.

The scalar checks (`check_int`, `check_real`, `check_choice`, `check_bool`) are the project's one
set: the field kinds call them, and so do the few entry points that check a scalar argument
(`where` the entry point: `summary: tolerance=...`). This module imports nothing of gr2jax: the
model, the decoders and every layer above declare their settings with it.
"""

import contextvars
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import numpy as np

# where the block being built through `Settings.of` sits ('stages.cft.train.'); None: its WHERE
_WHERE = contextvars.ContextVar("gr2jax_settings_where", default=None)
_KEY = "gr2jax_setting"  # the field metadata entry holding its _Kind


class WrongKind(TypeError, ValueError):
  """A value of the wrong kind (a str or a bool for a number, ...): a TypeError, and also a
  ValueError, as every bad setting is reported."""


def label(where: str, name: str) -> str:
  """`where: name`, or `block.name` when `where` is a block path ending in a dot ('decode.'), or
  the bare name when `where` is ''."""
  return f"{where}{name}" if not where or where.endswith(".") else f"{where}: {name}"


def check_int(where: str, name: str, value, *, minimum: int | None = None,
              maximum: int | None = None) -> int:
  """A Python / numpy integer scalar (bool refused) in [minimum, maximum], returned as int."""
  at = label(where, name)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
    raise WrongKind(f"{at} must be an int, got {type(value).__name__} {value!r}")
  if minimum is not None and value < minimum:
    raise ValueError(f"{at}={value} must be >= {minimum}")
  if maximum is not None and value > maximum:
    raise ValueError(f"{at}={value} must be <= {maximum}")
  return int(value)


def check_real(where: str, name: str, value, *, low: float | None = None,
               high: float | None = None, low_open: bool = False, high_open: bool = False,
               note: str = "") -> float:
  """A finite real scalar (Python / numpy; bool refused) in an interval, returned as float.

  Args:
    where: the entry point, or a block path with its dot.
    name: the argument or field name.
    value: the value.
    low: the smallest allowed value (None: no lower bound); excluded when low_open.
    high: the largest allowed value (None: no upper bound); excluded when high_open.
    low_open, high_open: the bound itself is refused (`(0, 1]`, `[0, 1)`).
    note: appended to the out-of-interval message, e.g. " (0 = greedy)".

  Raises:
    WrongKind: not a real number. ValueError: not finite, or outside the interval.
  """
  at = label(where, name)
  if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer,
                                                                   np.floating)):
    raise WrongKind(f"{at} must be a real number, got {type(value).__name__} {value!r}")
  if not math.isfinite(value):
    raise ValueError(f"{at}={value} must be finite")
  below = low is not None and (value <= low if low_open else value < low)
  above = high is not None and (value >= high if high_open else value > high)
  if below or above:
    raise ValueError(f"{at}={value} must be {_interval(low, high, low_open, high_open)}{note}")
  return float(value)


def _interval(low, high, low_open: bool, high_open: bool) -> str:
  if high is None:
    return f"{'>' if low_open else '>='} {low}"
  if low is None:
    return f"{'<' if high_open else '<='} {high}"
  return f"in {'(' if low_open else '['}{low}, {high}{')' if high_open else ']'}"


def check_choice(where: str, name: str, value, choices: tuple) -> None:
  """ValueError naming the field unless value is one of choices."""
  if value not in choices:
    raise ValueError(f"{label(where, name)}={value!r} not in {choices}")


def check_bool(where: str, name: str, value) -> None:
  """WrongKind naming the field unless value is a bool."""
  if not isinstance(value, bool):
    raise WrongKind(f"{label(where, name)} must be a bool, got {type(value).__name__} "
                    f"{value!r}")


def check_text(where: str, name: str, value, *, nonempty: str = "") -> None:
  """WrongKind unless value is a str; ValueError when it is '' and `nonempty` says what it must
  be instead ('an export path')."""
  if not isinstance(value, str):
    raise WrongKind(f"{label(where, name)}={value!r} must be a string")
  if nonempty and not value:
    raise ValueError(f"{label(where, name)}='' must be {nonempty}")


@dataclasses.dataclass(frozen=True)
class _Kind:
  """A field's declaration: its doc, its bounds as text (for describe), its check(where, name,
  value) -> the value to keep (a list made a tuple; anything else as given, so records keep
  the values' own types), the block class of a nested block, and whether the code derives it
  (no recipe sets it: it is in no ConfigDict; `defaults` and `describe` leave it out)."""
  doc: str
  bounds: str
  check: Callable[[str, str, Any], Any]
  block: type | None = None
  derived: bool = False


def _field(default, doc: str, bounds: str, check, block=None, derived=False):
  kind = _Kind(doc=doc, bounds=bounds, check=check, block=block, derived=derived)
  metadata = {_KEY: kind}
  if block is not None:
    return dataclasses.field(default_factory=block, metadata=metadata)
  if default is dataclasses.MISSING:
    return dataclasses.field(metadata=metadata)
  return dataclasses.field(default=default, metadata=metadata)


_NO = dataclasses.MISSING  # a field without a default: every construction gives it


def _keep(check):
  """A check that returns the value as given."""
  def run(where, name, value):
    check(where, name, value)
    return value
  return run


def integer(default=_NO, *, doc: str, minimum: int | None = None, maximum: int | None = None):
  """An int in [minimum, maximum]."""
  bounds = " ".join(b for b in (f">= {minimum}" if minimum is not None else "",
                                f"<= {maximum}" if maximum is not None else "") if b)
  return _field(default, doc, f"int {bounds}".strip(), _keep(
    lambda w, n, v: check_int(w, n, v, minimum=minimum, maximum=maximum)))


def real(default=_NO, *, doc: str, low: float | None = None, high: float | None = None,
         low_open: bool = False, high_open: bool = False, note: str = ""):
  """A finite real in an interval (check_real's bounds)."""
  bounds = ("real " + _interval(low, high, low_open, high_open)
            if low is not None or high is not None else "real")
  return _field(default, doc, bounds, _keep(lambda w, n, v: check_real(
    w, n, v, low=low, high=high, low_open=low_open, high_open=high_open, note=note)))


def flag(default=_NO, *, doc: str):
  """A bool."""
  return _field(default, doc, "bool", _keep(check_bool))


def choice(default=_NO, *, doc: str, choices: tuple):
  """One of `choices`."""
  return _field(default, doc, f"one of {tuple(choices)}", _keep(
    lambda w, n, v: check_choice(w, n, v, tuple(choices))))


def text(default=_NO, *, doc: str, nonempty: str = ""):
  """A string (a path, a name); `nonempty`: what it must be when '' is refused."""
  return _field(default, doc, "str" + (", not ''" if nonempty else ""), _keep(
    lambda w, n, v: check_text(w, n, v, nonempty=nonempty)))


def _sequence(where: str, name: str, value, what: str) -> tuple:
  if not isinstance(value, (tuple, list)):
    raise WrongKind(f"{label(where, name)}={value!r} must be a tuple of {what}")
  return tuple(value)


def items(default=_NO, *, doc: str, what: str, item: Callable[[str, str, Any], Any],
          rule: Callable[[tuple], str] | None = None):
  """A tuple (a list is taken as one) whose every entry passes item(where, 'name[i]', entry),
  and, when given, `rule(values)` (the whole tuple's rule: '' when it holds, else what it must
  be)."""
  def check(where, name, value):
    values = _sequence(where, name, value, what)
    for i, v in enumerate(values):
      item(where, f"{name}[{i}]", v)
    if rule is not None and (must := rule(values)):
      raise ValueError(f"{label(where, name)}={value!r} must be {must}")
    return values
  return _field(default, doc, f"tuple of {what}", check)


def _ascending(values: tuple) -> str:
  return "" if values and list(values) == sorted(set(values)) else "ascending distinct ints"


def ints(default=_NO, *, doc: str, minimum: int | None = None, ascending: bool = False):
  """A tuple of ints >= minimum (ascending and distinct, not empty, when `ascending`)."""
  return items(default, doc=doc, what=f"ints >= {minimum}" if minimum is not None else "ints",
               item=lambda w, n, v: check_int(w, n, v, minimum=minimum),
               rule=_ascending if ascending else None)


def reals(default=_NO, *, doc: str, **bounds):
  """A tuple of finite reals, each in check_real's interval."""
  return items(default, doc=doc, what="reals", item=lambda w, n, v: check_real(w, n, v, **bounds))


def texts(default=_NO, *, doc: str, choices: tuple | None = None):
  """A tuple of strings (each one of `choices` when given)."""
  def item(w, n, v):
    check_text(w, n, v)
    if choices is not None:
      check_choice(w, n, v, tuple(choices))
  return items(default, doc=doc, what="strings" if choices is None else f"of {tuple(choices)}",
               item=item)


def derived(default, *, doc: str):
  """A string the code fills in from other settings (a path derived from the workdir), never
  set by a recipe or the command line."""
  return _field(default, doc, "str, derived", _keep(check_text), derived=True)


def value(default=_NO, *, doc: str, what: str, check: Callable[[str, str, Any], None]):
  """A value of another kind (an object the code builds), `check(where, name, value)`."""
  return _field(default, doc, what, _keep(check))


def block(cls: type, *, doc: str):
  """A nested settings block of class `cls` (a Settings subclass), its defaults by default;
  `Settings.of` builds it from a mapping, with its path."""
  def check(where, name, v):
    if not isinstance(v, cls):
      raise WrongKind(f"{label(where, name)} must be a {cls.__name__} block, got "
                      f"{type(v).__name__}")
    return v
  return _field(None, doc, f"block {cls.__name__}", check, block=cls)


def _plain(v):
  """A field value as ConfigDict.to_dict gave it: a block as nested dicts in name order."""
  return v.to_dict() if isinstance(v, Settings) else v


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
  """A settings block: every field declared with a field kind, checked at construction (module
  docstring). A subclass sets WHERE, how its errors name it when it is built directly
  ('decode.'), and overrides `check` for the rules between its own fields."""

  WHERE: ClassVar[str] = ""

  def __post_init__(self):
    where = _WHERE.get()
    where = self.WHERE if where is None else where
    for f in dataclasses.fields(self):
      kind = f.metadata.get(_KEY)
      if kind is not None:
        object.__setattr__(self, f.name, kind.check(where, f.name, getattr(self, f.name)))
    self.check(where)

  def check(self, where: str) -> None:
    """The block's cross-field rules (none here); `where` prefixes the fields it names."""

  @classmethod
  def of(cls, values: Mapping, where: str = ""):
    """The block of a mapping (a ConfigDict block, a record), checked, errors naming
    `where` + the field: a field it does not declare, one it lacks that has no default, a bad
    value. A nested block's mapping becomes its block (with its path)."""
    values = dict(values.items())
    declared = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - set(declared))
    if unknown:
      raise ValueError(f"{where}{unknown[0]} is not a setting (the settings of "
                       f"{where or cls.__name__}: {', '.join(sorted(declared))})")
    missing = sorted(n for n, f in declared.items() if n not in values
                     and f.default is _NO and f.default_factory is _NO)
    if missing:
      raise ValueError(f"{where}{missing[0]} must be given")
    for name, v in values.items():
      sub = declared[name].metadata.get(_KEY)
      if sub is not None and sub.block is not None and isinstance(v, Mapping):
        values[name] = sub.block.of(v, f"{where}{name}.")
    token = _WHERE.set(where)
    try:
      return cls(**values)
    finally:
      _WHERE.reset(token)

  def to_dict(self) -> dict:
    """The fields as nested dicts in name order (records, digests; module docstring)."""
    return {f.name: _plain(getattr(self, f.name))
            for f in sorted(dataclasses.fields(self), key=lambda f: f.name)}

  def replace(self, **changes):
    """A copy with `changes`, checked again."""
    return dataclasses.replace(self, **changes)


def declared(cls: type) -> list[tuple[str, dataclasses.Field]]:
  """(name, field) of a block's settings (the fields made by a field kind but `derived`), in
  order: what a recipe's ConfigDict block holds."""
  return [(f.name, f) for f in dataclasses.fields(cls)
          if _KEY in f.metadata and not f.metadata[_KEY].derived]


def kind_of(f: dataclasses.Field) -> _Kind:
  return f.metadata[_KEY]


def defaults(cls: type) -> dict:
  """{field: default} of a block, nested blocks as dicts; a field without a default is left
  out (the recipe gives it)."""
  out = {}
  for name, f in declared(cls):
    kind = kind_of(f)
    if kind.block is not None:
      out[name] = defaults(kind.block)
    elif f.default is not _NO:
      out[name] = f.default
  return out


def to_config(cls: type, values: Mapping | None = None):
  """The ConfigDict of a block for the command line (its defaults, `values` over them; a
  nested block a nested ConfigDict): what `--config.<path>=` overrides and `Cls.of` reads
  back."""
  import ml_collections

  return ml_collections.ConfigDict({**defaults(cls), **(values or {})})


def describe(cls: type, prefix: str = "", values: Mapping | None = None) -> list[str]:
  """One line per field of a block and its nested blocks: `path = value  (bounds) doc`, the
  value `values`' (a recipe's ConfigDict block) where given, else the default."""
  lines = []
  for name, f in declared(cls):
    kind = kind_of(f)
    given = values.get(name, _NO) if values is not None else _NO
    if kind.block is not None:
      lines += describe(kind.block, f"{prefix}{name}.", given if given is not _NO else None)
      continue
    shown = (repr(given) if given is not _NO else repr(f.default) if f.default is not _NO
             else "(required)")
    lines.append(f"{prefix}{name} = {shown}  ({kind.bounds}) {kind.doc}")
  return lines


def count_fields(cls: type) -> tuple[int, int]:
  """(fields with a one-line doc, all fields) of a block and its nested blocks."""
  documented = total = 0
  for _, f in declared(cls):
    kind = kind_of(f)
    if kind.block is not None:
      d, t = count_fields(kind.block)
      documented, total = documented + d, total + t
    else:
      documented, total = documented + bool(kind.doc.strip()), total + 1
  return documented, total
