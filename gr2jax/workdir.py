"""Exclusive locks on a workdir (or any path a run writes), held for as long as the run uses it;
`portable`, how a record writes paths inside a workdir or inside the checkout; and `fill_path`,
how such a path (or a recipe's path field, '{workdir}/rl/export') is read back.

`lock_workdir(workdir)` is what a stage wraps its whole run in; `lock_file(lock_path, what)` is the
same lock on an explicit lock file (`checkpoint.atomic_directory` locks a sibling of its target).

Mechanism: `fcntl.flock` on a small lock file that holds the owner's pid. The kernel drops a flock
when its process dies (SIGKILL included), so a lock file left by a dead process is simply taken
over by the next run (no pid-liveness guessing, no pid-reuse races); the pid in the file only
serves the error message. A second process gets `InUseError` ("workdir ... in use by pid N")
at once instead of waiting. The lock file is removed on release; an acquirer that raced with that
removal notices (its file is no longer the one at the path) and retries.

Locks are re-entrant within a process: a stage holding `lock_workdir(w)` may call code that locks
`w` again (e.g. the data pipeline); only the outermost release frees the lock. flock is per host:
two hosts sharing a network filesystem are not excluded.
"""

import contextlib
import fcntl
import logging
import os
import re
import threading
from collections.abc import Iterator

LOCK_FILE = ".lock"
WORKDIR = "{workdir}"  # how a record writes a run's workdir (portable)
CHECKOUT = "{checkout}"  # how a record writes the checkout gr2jax is imported from (portable)
# the checkout: the directory holding gr2jax/ and the shipped data/amazon_beauty
# (data/build_settings.py DATA_DIR)
CHECKOUT_DIR = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))

_TEMPLATE = re.compile(re.escape(WORKDIR) + "|" + re.escape(CHECKOUT))

log = logging.getLogger(__name__)

_held: dict[str, list] = {}  # absolute lock path -> [fd, depth] for locks this process holds
_guard = threading.Lock()


class InUseError(RuntimeError):
  """Another live process holds the lock; the message names its pid and the lock file."""


def _read_pid(fd: int) -> int | None:
  try:
    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None
  except OSError:
    return None


def _acquire(path: str, what: str) -> int:
  """Opens, flocks and stamps `path` with our pid; returns the fd (InUseError if held)."""
  while True:
    try:
      fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:  # a read-only directory or filesystem
      raise type(e)(e.errno, f"{what}: cannot open its lock file {path} ({e.strerror}); a run "
                    "that writes there needs it writable") from None
    try:
      fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      pid = _read_pid(fd)
      os.close(fd)
      owner = f"pid {pid}" if pid is not None else "another process"
      raise InUseError(f"{what} in use by {owner} (lock file {path}); wait for that run to "
                       "finish or use another path") from None
    try:  # the previous holder may have removed the file between our open and flock
      same = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
      same = False
    if same:
      break
    os.close(fd)
  stale = _read_pid(fd)
  if stale is not None and stale != os.getpid():
    log.warning("%s: taking over the stale lock of pid %d (no longer running)", path, stale)
  os.ftruncate(fd, 0)
  os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
  return fd


@contextlib.contextmanager
def lock_file(path: str, what: str) -> Iterator[None]:
  """Holds an exclusive lock on the file `path` (created if needed, removed on release).

  Args:
    path: the lock file.
    what: how the error message names the locked thing, e.g. "workdir /tmp/w".

  Raises:
    InUseError: another live process holds the lock.
  """
  path = os.path.abspath(path)
  with _guard:
    entry = _held.get(path)
    if entry is not None:
      entry[1] += 1
  if entry is None:
    fd = _acquire(path, what)
    with _guard:
      entry = _held[path] = [fd, 1]
  try:
    yield
  finally:
    with _guard:
      entry[1] -= 1
      release = entry[1] == 0
      if release:
        del _held[path]
    if release:
      with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # while still locked: a racing acquirer sees the inode change
      os.close(entry[0])


@contextlib.contextmanager
def lock_workdir(workdir: str) -> Iterator[None]:
  """Holds the lock of `workdir` (`workdir/.lock`; the directory is created if needed).

  Args:
    workdir: the run's working directory.

  Raises:
    InUseError: "workdir W in use by pid N": another live run holds it.
  """
  os.makedirs(workdir, exist_ok=True)
  with lock_file(os.path.join(workdir, LOCK_FILE), f"workdir {os.path.abspath(workdir)}"):
    yield


def _under(path: str, root: str, symbol: str) -> str | None:
  """Real path `path` as "`symbol`/<path relative to root>" (root itself: `symbol`) when it is
  inside real path `root`, else None."""
  if path == root:
    return symbol
  if path.startswith(root + os.sep):
    return os.path.join(symbol, os.path.relpath(path, root))
  return None


def _map_strings(tree, fn):
  """`tree` (JSON-like: dicts, lists, strings, numbers) with fn applied to every string."""
  if isinstance(tree, dict):
    return {k: _map_strings(v, fn) for k, v in tree.items()}
  if isinstance(tree, (list, tuple)):
    return [_map_strings(v, fn) for v in tree]
  return fn(tree) if isinstance(tree, str) else tree


def portable(tree, workdir: str, checkout: bool = True):
  """`tree` (JSON-like: dicts, lists, strings, numbers) with every path written the same way
  however it was spelt and wherever the workdir and the checkout live: a path inside `workdir`
  as "{workdir}/<path relative to it>" (the workdir itself: "{workdir}"), else a path inside the
  checkout (CHECKOUT_DIR: the shipped data "{checkout}/data/amazon_beauty") as
  "{checkout}/<path relative to it>", any other as its absolute real path.

  A string counts as a path when it contains a path separator (and no "{workdir}" or
  "{checkout}" already); it is resolved against the current directory (how the run reads it),
  symlinks included, so "W/sft/export" and "/abs/W/sft/export" give the same value. Other
  strings ("preset:tiny", "cosine") are kept. `checkout=False` writes paths inside the checkout
  absolute too: how records were written before "{checkout}" (gr2jax/chain.py still reuses
  their steps in place).
  """
  root, home = os.path.realpath(workdir), os.path.realpath(CHECKOUT_DIR)

  def one(text: str) -> str:
    if os.sep not in text or WORKDIR in text or CHECKOUT in text:
      return text
    path = os.path.realpath(text)
    return (_under(path, root, WORKDIR) or (checkout and _under(path, home, CHECKOUT))
            or path)

  return _map_strings(tree, one)


def in_checkout(tree):
  """`tree` with every absolute path inside the checkout written "{checkout}/<path relative to
  it>", as `portable` writes it: a record written before "{checkout}" (its paths absolute)
  compared with one written now, with the checkout where it was."""
  home = os.path.realpath(CHECKOUT_DIR)

  def one(text: str) -> str:
    return (_under(text, home, CHECKOUT) if os.path.isabs(text) else None) or text

  return _map_strings(tree, one)


def fill_path(path: str, workdir: str) -> str:
  """`path` with "{workdir}" replaced by `workdir` and "{checkout}" by the checkout (CHECKOUT_DIR),
  literally and in one pass: how a recipe's path field ('{workdir}/rl/export') and a path a
  record wrote with `portable` are read. Every other brace is part of the path (a directory
  named run{1}, a workdir holding '{'), never a format field: the one place paths are templated.

  Args:
    path: a path, possibly holding "{workdir}" or "{checkout}".
    workdir: the run's workdir, as given.
  """
  values = {WORKDIR: workdir, CHECKOUT: CHECKOUT_DIR}
  return _TEMPLATE.sub(lambda m: values[m.group(0)], path)


def fill_paths(tree, workdir: str):
  """`tree` (JSON-like) with `fill_path` applied to every string: a record `portable` wrote, read
  back with the workdir where it is now (a record with absolute paths is returned as it was)."""
  return _map_strings(tree, lambda text: fill_path(text, workdir))
