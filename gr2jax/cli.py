"""The command lines' one rule for refusals: one line naming the argument, file or field, no
traceback, unless --verbosity (or -v) asks for one.

  app.run(cli.one_line_refusals()(main))    # experiments/*.py, weights_conversion/*.py

A refusal is an exception the library raises about its input: a ValueError (CheckpointError,
RunChangedError, ... are ValueErrors) or TypeError naming the argument, an OSError naming the
file, absl's UsageError, a FloatingPointError stopping a run, a workdir in use (InUseError).
Anything else (an assertion, a KeyError) is a bug and keeps its traceback.
"""

import contextlib
import sys

from absl import app, flags

from gr2jax import workdir

REFUSALS = (ValueError, TypeError, OSError, FloatingPointError, app.UsageError,
            workdir.InUseError)


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
