"""The command lines' one rule for refusals: one line naming the argument, file or field, no
traceback, unless --verbosity (or -v) asks for one; and their flags' values checked when absl
parses them, before main starts.

  cli.run(main)         # every main of experiments/, experiments/studies/, weights_conversion/

A refusal is an exception the library raises about its input: a ValueError (CheckpointError,
RunChangedError, ... are ValueErrors) or TypeError naming the argument, an OSError naming the
file, absl's UsageError, a FloatingPointError stopping a run, a workdir in use (InUseError).
Anything else (an assertion, a KeyError) is a bug and keeps its traceback.

A flag absl refuses while parsing (an unknown flag, a value out of its DEFINE_integer /
DEFINE_float bounds or outside its DEFINE_enum, a missing required flag, a config file whose
get_config raised) is one line too (`parse_flags`): `--batch_size=0: 0 is not a positive
integer`. Flags whose values need more than absl's bounds are defined here, checked the same way:

  cli.define("mfu", 0.4, "...", cli.number(0, 1, low_open=True))         # a float in (0, 1]
  cli.define_list("batch_sizes", [1, 8], "...", cli.integer(1))           # [int >= 1, ...]
  cli.define_list("steps", ["ar"], "...", cli.choice(("ar", "block")))    # names from a set
  cli.define_list("forced", ["0.9:3"], "...",
                  cli.fields(":", TAU=cli.number(0, 1, low_open=True), K=cli.integer(1)))

so `--batch_sizes=1,0` is `--batch_sizes=1,0: '0' is not an integer >= 1` before main starts.
"""

import contextlib
import dataclasses
import math
import sys
from collections.abc import Callable, Sequence
from typing import Any

from absl import app, flags

from gr2jax import workdir

REFUSALS = (ValueError, TypeError, OSError, FloatingPointError, app.UsageError,
            workdir.InUseError)

# The flags defined by define / define_list belong to the module calling them (absl's help
# lists a program's own flags), not to this one.
flags.disclaim_key_flags()


def verbose() -> bool:
  """Whether --verbosity or -v was given on the command line (absl's logging flags)."""
  return any(name in flags.FLAGS and flags.FLAGS[name].present for name in ("verbosity", "v"))


def one_line(error: BaseException) -> str:
  """The refusal's line: its message, else its type's name."""
  return str(error).strip() or type(error).__name__


@contextlib.contextmanager
def one_line_refusals():
  """A refusal raised inside exits with its one line on stderr (status 1) unless verbose();
  usable as a decorator of an absl main."""
  try:
    yield
  except REFUSALS as e:
    if verbose():
      raise
    print(one_line(e), file=sys.stderr, flush=True)
    raise SystemExit(1) from None


def flag_error_line(error: flags.Error) -> str:
  """The one line of a flag absl refused: `--name=value: why` (absl's own text without its
  `flag ` prefix); where absl's text spans lines (a config file whose get_config raised quotes
  the traceback), the flag and the first exception's message."""
  text = str(error).strip()
  if text.startswith("flag --"):  # one flag's value
    text = text[len("flag "):]
  elif text.startswith("flags "):  # a check of several flags' values
    text = text[len("flags "):]
  if "\n" not in text:
    return text
  cause = error
  while cause.__cause__ or cause.__context__:
    cause = cause.__cause__ or cause.__context__
  head = text.split("\n", 1)[0].split(": ", 1)[0]
  return f"{head}: {' '.join(one_line(cause).split())}"


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl's flag parsing (app.run's flags_parser) with its refusals as one line on stderr,
  exit status 1 (absl's own adds a 'FATAL Flags parsing error' header and a help line).

  Returns:
    argv without the flags parsed.
  """
  try:
    return flag_values(argv)
  except flags.Error as e:
    raise SystemExit(flag_error_line(e)) from None


def run(main: Callable, argv: list[str] | None = None,
        flags_parser: Callable[[list[str]], list[str]] = parse_flags) -> None:
  """app.run(main) for a command line: its flags checked by `flags_parser` (parse_flags) before
  main starts, main's refusals one line (one_line_refusals)."""
  app.run(one_line_refusals()(main), argv=argv, flags_parser=flags_parser)


# ---- flag values checked while absl parses them -------------------------------------------


@dataclasses.dataclass(frozen=True)
class Item:
  """What one flag value (or one entry of a list flag) must be.

  Attributes:
    what: the rule as the refusal says it ('an integer >= 1').
    parse: the text (or a default's value) -> the value, None or a ValueError when it breaks
      the rule.
    text: the value -> its text on a command line.
  """

  what: str
  parse: Callable[[Any], Any]
  text: Callable[[Any], str] = str

  def __call__(self, value: Any) -> Any:
    """The value of `value` (a flag's text, or a default's value).

    Raises:
      ValueError: `value` breaks the rule (names the value and the rule).
    """
    try:
      out = self.parse(value.strip() if isinstance(value, str) else value)
    except (ValueError, TypeError, OverflowError):
      out = None
    if out is None:
      shown = value if isinstance(value, str) else self.text(value)
      raise ValueError(f"{shown!r} is not {self.what}")
    return out


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
  if low is not None and high is not None:
    return f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
  if low is not None:
    return f" {'>' if low_open else '>='} {low:g}"
  if high is not None:
    return f" {'<' if high_open else '<='} {high:g}"
  return ""


def _within(value, low, high, low_open: bool, high_open: bool) -> bool:
  return ((low is None or (value > low if low_open else value >= low))
          and (high is None or (value < high if high_open else value <= high)))


def integer(low: int | None = None, high: int | None = None) -> Item:
  """An integer in [low, high] (either bound may be None: unbounded)."""

  def parse(value):
    number = value if isinstance(value, int) and not isinstance(value, bool) else int(value)
    return number if _within(number, low, high, False, False) else None

  return Item(f"an integer{_bounds(low, high, False, False)}", parse)


def number(low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False) -> Item:
  """A finite number in [low, high]; low_open / high_open exclude that bound ((0, 1]: a
  rate or a commit threshold)."""

  def parse(value):
    x = float(value)
    return x if math.isfinite(x) and _within(x, low, high, low_open, high_open) else None

  return Item(f"a number{_bounds(low, high, low_open, high_open)}", parse, text=lambda x: f"{x:g}")


def choice(known: Sequence[str]) -> Item:
  """One of the names `known`."""
  known = tuple(known)
  return Item(f"one of {', '.join(known)}", lambda value: value if value in known else None)


def fields(sep: str, **named: Item) -> Item:
  """Several values in one entry, separated by `sep` ('TAU:K'), each checked by its Item; the
  value is their tuple."""
  names = list(named)

  def parse(value):
    parts = value.split(sep) if isinstance(value, str) else list(value)
    if len(parts) != len(names):
      return None
    return tuple(named[name](part) for name, part in zip(names, parts, strict=True))

  rules = [f"{name} {item.what}" for name, item in named.items()]
  what = f"{sep.join(names)} with {', '.join(rules[:-1])}{' and ' * (len(rules) > 1)}{rules[-1]}"
  return Item(what, parse, text=lambda value: sep.join(
    named[name].text(part) for name, part in zip(names, value, strict=True)))


class _ItemParser(flags.ArgumentParser):
  """absl's parser of a flag whose value is one Item."""

  def __init__(self, item: Item):
    self.item = item

  def parse(self, argument):
    return self.item(argument)

  def flag_type(self) -> str:
    return self.item.what


class _ItemListParser(flags.ListParser):
  """absl's parser of a comma-separated list flag whose entries are Items."""

  def __init__(self, item: Item, allow_empty: bool):
    super().__init__()
    self.item, self.allow_empty = item, allow_empty

  def parse(self, argument):
    texts = list(argument) if isinstance(argument, (list, tuple)) else super().parse(argument)
    if not texts and not self.allow_empty:
      raise ValueError(f"no entry; each must be {self.item.what}")
    return [self.item(text) for text in texts]

  def flag_type(self) -> str:
    return f"comma-separated list of {self.item.what}"


class _ItemListSerializer(flags.ArgumentSerializer):
  def __init__(self, item: Item):
    self.item = item

  def serialize(self, value) -> str:
    return ",".join(self.item.text(v) for v in value)


def define(name: str, default: Any, help_text: str, item: Item,
           flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """A flag whose value `item` parses and checks when absl parses the command line (a default
  of None: the flag unset)."""
  return flags.DEFINE(_ItemParser(item), name, default, help_text, flag_values)


def define_list(name: str, default: Sequence[Any] | None, help_text: str, item: Item, *,
                allow_empty: bool = False,
                flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """A comma-separated list flag whose entries `item` parses and checks when absl parses the
  command line; its value is the list of their values. An empty list is refused unless
  allow_empty."""
  return flags.DEFINE(_ItemListParser(item, allow_empty), name, default, help_text, flag_values,
                      serializer=_ItemListSerializer(item))
