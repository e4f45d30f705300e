"""The `serve` block as one typed value: `ServeSpec`, every field checked once, built once from
the config (`from_config`) and passed whole to the server (server.py) and the engine (engine.py).

gr2jax/recipes.py's `_serve_block` documents each field. The three fields serve.mode,
serve.draft_ks and serve.cost_table become one typed decoder choice, `choice` (auto.Choice:
auto.Fixed or auto.Auto, auto.py), which the engine asks which decoder serves a batch bucket.

A field is checked here on its own; what depends on the model and its build is checked when the
engine is built, before anything compiles (engine.check_fits): serve.prompt_lengths' widest
must hold the build's prompt width P, and serve.max_new_tokens after it must fit every model's
max_position_embeddings.
"""

import dataclasses
import functools

from gr2jax.apps.serve import auto
from gr2jax.model import validate


def _text(where: str, name: str, value) -> None:
  if not isinstance(value, str):
    raise validate.WrongKind(f"{where}{name}={value!r} must be a string")


def _nonempty(what: str, where: str, name: str, value) -> None:
  if not isinstance(value, str) or value == "":
    raise ValueError(f"{where}{name}={value!r} must be {what}")


def _ints(where: str, name: str, value, *, ascending: bool) -> None:
  """A tuple of ints >= 1 (ascending and distinct when `ascending`)."""
  if not isinstance(value, tuple):
    raise validate.WrongKind(f"{where}{name}={value!r} must be a tuple of ints")
  for i, b in enumerate(value):
    validate.integer(where, f"{name}[{i}]", b, minimum=1)
  if ascending and (not value or list(value) != sorted(set(value))):
    raise ValueError(f"{where}{name}={value!r} must be ascending distinct ints >= 1")


def _choice(where: str, name: str, value) -> None:
  if not isinstance(value, auto.Fixed | auto.Auto):
    raise validate.WrongKind(f"{where}{name}={value!r} must be auto.Fixed or auto.Auto")


_RULES = {  # ServeSpec field: its check, called as check("serve.", field, value)
  "ckpt": functools.partial(_nonempty, "an export path"),
  "host": functools.partial(_nonempty, "a host name or address"),
  "port": functools.partial(validate.integer, minimum=0, maximum=65535),  # 0 = a free port
  "batch_buckets": functools.partial(_ints, ascending=True),
  "prompt_lengths": functools.partial(_ints, ascending=False),  # () = the build's P
  "window_ms": functools.partial(validate.real, low=0),
  "queue_bound": functools.partial(validate.integer, minimum=1),
  "timeout_s": functools.partial(validate.real, low=0, low_open=True),
  "retry_after_s": functools.partial(validate.integer, minimum=1),
  "max_body_bytes": functools.partial(validate.integer, minimum=1),
  "drain_timeout_s": functools.partial(validate.real, low=0, low_open=True),
  "keep_alive_s": functools.partial(validate.real, low=0, low_open=True),
  "items_file": _text,
  "max_new_tokens": functools.partial(validate.integer, minimum=0),  # 0 = the build's R
  "verify_with": _text,
  "choice": _choice,
  "model_name": _text,
  "compilation_cache": _text,
}


@dataclasses.dataclass(frozen=True)
class ServeSpec:
  """The `serve` block, typed and checked (gr2jax/recipes.py documents each field and holds the
  defaults: build it with `from_config`).

  Attributes:
    choice: the decoder choice (serve.mode with serve.draft_ks and serve.cost_table):
      auto.Fixed() or auto.Auto(draft_ks, cost_table).
    The others: the serve.<field> of the same name ('{workdir}' in ckpt, verify_with and
    compilation_cache is filled in by the caller).
  """

  ckpt: str
  host: str
  port: int
  batch_buckets: tuple[int, ...]
  prompt_lengths: tuple[int, ...]
  window_ms: float
  queue_bound: int
  timeout_s: float
  retry_after_s: int
  max_body_bytes: int
  drain_timeout_s: float
  keep_alive_s: float
  items_file: str
  max_new_tokens: int
  verify_with: str
  choice: auto.Choice
  model_name: str
  compilation_cache: str

  def __post_init__(self):
    for name, check in _RULES.items():
      check("serve.", name, getattr(self, name))
    self.choice.check_verifier(self.verify_with)

  @classmethod
  def from_config(cls, c) -> "ServeSpec":
    """The spec of a `serve` config block (its field names: serve.mode, serve.draft_ks and
    serve.cost_table give `choice`).

    Raises:
      ValueError: naming the field (serve.<name>) and what it must be.
    """
    values = {f.name: c[f.name] for f in dataclasses.fields(cls) if f.name != "choice"}
    for name in ("batch_buckets", "prompt_lengths"):
      if isinstance(values[name], list | tuple):
        values[name] = tuple(values[name])
    return cls(**values, choice=_choice_of(c["mode"], c["draft_ks"], c["cost_table"]))


def _choice_of(mode, draft_ks, cost_table) -> auto.Choice:
  """The typed decoder choice of serve.mode, serve.draft_ks and serve.cost_table."""
  validate.one_of("serve.", "mode", mode, tuple(auto.CHOICES))
  draft_ks = auto.check_draft_ks(draft_ks)
  _text("serve.", "cost_table", cost_table)
  return auto.CHOICES[mode].of_block(draft_ks, cost_table)
