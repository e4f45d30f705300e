"""Checks of the arrays and scalars a public entry point receives, before anything is traced.

The rule (README "What bad input gets"): an entry point that receives host values -- `forward`,
`ragged_prefill`, `generate` (and its `prefill`), `block_diffusion_generate` -- calls these first,
so a bad argument is a `TypeError` (wrong kind: dtype, not an array, not an int) or a `ValueError`
(wrong rank, shape, empty dimension, value out of range) whose message starts with the function
and names the argument, never a raw JAX error or a silently wrong result.

Static facts (dtype, rank, shape) are checked also under tracing; value checks (token ids in
[0, V), lengths in 1..P, ...) need concrete values and are skipped for tracers. Inside a jitted
caller the contract is the caller's: ids outside [0, V) give NaN logits (jnp.take fills with NaN;
negative ids wrap around), so jitted code must be fed checked values (`generate` and
`block_diffusion_generate` check before they trace).

The scalar checks (an int, a real in an interval, a choice, a bool) are gr2jax/settings.py's,
the project's one set: settings blocks declare their fields with them, and `token_ids` here
checks each id with them.
"""

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.settings import WrongKind, check_int, label


def _is_tracer(x) -> bool:
  return isinstance(x, jax.core.Tracer)


def as_array(where: str, name: str, x):
  """x as an array (jax arrays and tracers kept; numpy, lists and scalars via numpy)."""
  if x is None:
    raise TypeError(f"{where}: {name} is None, expected an integer array")
  if isinstance(x, (jax.Array, np.ndarray)) or _is_tracer(x):
    return x
  if isinstance(x, (str, bytes, dict, set)):
    raise TypeError(f"{where}: {name} must be an array, got {type(x).__name__}")
  try:
    return np.asarray(x)
  except (ValueError, TypeError) as e:  # ragged nested lists
    raise TypeError(f"{where}: {name} is not an array ({e})") from None


def integer_array(where: str, name: str, x, *, ndim: int | None = None,
                  shape: tuple[int | None, ...] | None = None, nonempty: bool = True):
  """Checks an integer array's kind, rank, shape and non-empty dimensions.

  Args:
    where: the entry point, for the message.
    name: the argument name, for the message.
    x: the value (array, tracer, numpy array, nested list).
    ndim: required rank, or None.
    shape: required shape; None entries match any size.
    nonempty: every dimension must be >= 1.

  Returns:
    x as an array (not cast; callers cast after `check_range`).

  Raises:
    TypeError: not an array, or not of an integer dtype (bool and floats are refused).
    ValueError: wrong rank or shape, or an empty dimension.
  """
  x = as_array(where, name, x)
  dtype = np.dtype(x.dtype) if not jax.dtypes.issubdtype(x.dtype, jax.dtypes.extended) else None
  if dtype is None or dtype == np.bool_ or not np.issubdtype(dtype, np.integer):
    raise TypeError(f"{where}: {name} must be an integer array, got dtype {x.dtype}")
  check_shape(where, name, x, ndim=ndim, shape=shape, nonempty=nonempty)
  return x


def bool_array(where: str, name: str, x, *, shape: tuple[int | None, ...]):
  """Checks a boolean array (e.g. an attention mask) and its shape; returns it as an array."""
  x = as_array(where, name, x)
  if x.dtype != np.bool_:
    raise TypeError(f"{where}: {name} must be a bool array, got dtype {x.dtype}")
  check_shape(where, name, x, shape=shape, nonempty=False)
  return x


def _shape_text(shape) -> str:
  """(2, ?) for a shape with None entries (any size); (2,) for one dimension."""
  parts = ["?" if d is None else str(d) for d in shape]
  return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


def check_shape(where: str, name: str, x, *, ndim: int | None = None,
                shape: tuple[int | None, ...] | None = None, nonempty: bool = False) -> None:
  """Raises ValueError naming `name` on a wrong rank / shape or an empty dimension."""
  actual = tuple(x.shape)
  if shape is not None:
    ndim = len(shape)
  if ndim is not None and len(actual) != ndim:
    want = f"shape {_shape_text(shape)}" if shape else f"rank {ndim}"
    raise ValueError(f"{where}: {name} must have {want}, got shape {actual}")
  if shape is not None and any(w is not None and w != a for w, a in zip(shape, actual,
                                                                        strict=True)):
    raise ValueError(f"{where}: {name} has shape {actual}, expected {_shape_text(shape)}")
  if nonempty and 0 in actual:
    raise ValueError(f"{where}: {name} has an empty dimension, shape {actual}")


def concrete_range(x) -> tuple[int, int] | None:
  """(min, max) of a non-empty integer array when concrete; None for a tracer."""
  if _is_tracer(x):
    return None
  try:
    if isinstance(x, np.ndarray):
      return int(x.min()), int(x.max())
    return int(jnp.min(x)), int(jnp.max(x))
  except jax.errors.ConcretizationTypeError:
    return None


def check_range(where: str, name: str, x, low: int, high: int, what: str = "") -> None:
  """Raises ValueError naming the first element of `name` outside [low, high) (concrete only).

  Args:
    where: the entry point.
    name: the argument name.
    x: a non-empty integer array.
    low: smallest allowed value.
    high: one past the largest allowed value.
    what: names the range in the message, e.g. "the vocab".
  """
  span = concrete_range(x)
  if span is None or (low <= span[0] and span[1] < high):
    return
  values = np.asarray(x)
  bad = np.argwhere((values < low) | (values >= high))[0]
  index = ", ".join(str(int(i)) for i in bad)
  raise ValueError(f"{where}: {name}[{index}] = {int(values[tuple(bad)])} is outside "
                   f"{what + ' ' if what else ''}[{low}, {high - 1}]")


def token_ids(where: str, name: str, values, vocab_size: int | None) -> tuple[int, ...]:
  """A sequence of token ids (e.g. stop ids): ints in [0, vocab_size), as a tuple of ints
  (vocab_size None: ints >= 0, before a vocab is known). `where` as settings.label's.

  Raises:
    WrongKind: not a sequence, or an id that is not an int. ValueError: an id out of range.
  """
  if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
    raise WrongKind(f"{label(where, name)} must be a sequence of ints, got "
                    f"{type(values).__name__}")
  out = tuple(check_int(where, f"{name}[{i}]", v, minimum=0) for i, v in enumerate(values))
  for i, v in enumerate(out):
    if vocab_size is not None and v >= vocab_size:
      raise ValueError(f"{label(where, f'{name}[{i}]')} = {v} is outside the vocab "
                       f"[0, {vocab_size - 1}]")
  return out


def prng_key(where: str, name: str, key) -> None:
  """Raises TypeError unless key is a PRNG key (typed `jax.random.key` or raw uint32 [2])."""
  dtype = getattr(key, "dtype", None)
  if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
    if key.shape != ():
      raise ValueError(f"{where}: {name} must be a single PRNG key, got shape {key.shape}")
    return
  if dtype is not None and dtype == np.uint32 and tuple(key.shape) == (2,):
    return
  raise TypeError(f"{where}: {name} must be a PRNG key (jax.random.key(seed)), got "
                  f"{type(key).__name__}" + (f" {dtype}{tuple(key.shape)}" if dtype else ""))


def prompts(where: str, config, tokens, lengths) -> tuple[jax.Array, jax.Array]:
  """Right-padded prompts [B, P] with ids in [0, V) and lengths [B] in 1..P, as int32 arrays.

  Args:
    where: the entry point.
    config: the ModelConfig (its vocab_size).
    tokens: [B, P] prompts.
    lengths: [B] real prompt lengths, or None for P everywhere.

  Raises:
    TypeError / ValueError naming `prompt_tokens` / `prompt_lengths`.
  """
  tokens = integer_array(where, "prompt_tokens", tokens, ndim=2)
  check_range(where, "prompt_tokens", tokens, 0, config.vocab_size, "the vocab")
  b, p = tokens.shape
  if lengths is None:
    lengths = np.full((b,), p, np.int32)
  lengths = integer_array(where, "prompt_lengths", lengths, shape=(b,))
  check_range(where, "prompt_lengths", lengths, 1, p + 1)
  return jnp.asarray(tokens, jnp.int32), jnp.asarray(lengths, jnp.int32)


def responses(where: str, tokens, lengths, *, rows: int | None = None,
              vocab_size: int | None = None,
              names: tuple[str, str] = ("tokens", "lengths")) -> tuple[np.ndarray, np.ndarray]:
  """Right-padded responses [B, M] and their lengths [B] in 0..M (an empty response counts
  nothing), as numpy arrays: lengths int32, tokens int32 when vocab_size is given (else their
  own integer dtype). Concrete values: a decode's output, not a tracer.

  Args:
    where: the entry point.
    tokens: [B, M] responses (any id after a row's length, in the vocab).
    lengths: [B] tokens per row.
    rows: the B the responses must have (e.g. the prompts'), or None.
    vocab_size: the ids must be in [0, vocab_size); None: any integer.
    names: the arguments' names, for the messages.

  Raises:
    TypeError / ValueError naming the argument: not integer arrays, a wrong rank or row count,
      an id outside the vocab, a length outside 0..M.
  """
  tokens = integer_array(where, names[0], tokens, shape=(rows, None))
  if vocab_size is not None:
    check_range(where, names[0], tokens, 0, vocab_size, "the vocab")
  b, m = tokens.shape
  lengths = integer_array(where, names[1], lengths, shape=(b,))
  check_range(where, names[1], lengths, 0, m + 1)
  return (np.asarray(tokens, None if vocab_size is None else np.int32),
          np.asarray(lengths, np.int32))
