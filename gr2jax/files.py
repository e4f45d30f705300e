"""The file helpers every layer shares: one atomic write, one file digest, one JSON digest.

A file written with `atomic_write` is either the old file or the whole new one, never a part:
the bytes go to a temp sibling (`temp_name`, unique per process and call), are flushed and
fsynced, then renamed over the target. A killed writer leaves only a temp sibling, which
`TEMP_PATTERN` recognises so the next run can remove it.
"""

import hashlib
import json
import os
import re
import secrets

TEMP_PATTERN = re.compile(r".+\.tmp-\d+-[0-9a-f]{8}")  # the names temp_name makes


def temp_name(path: str) -> str:
  """A temp path next to `path`, unique to this process and call (matches TEMP_PATTERN)."""
  return f"{path}.tmp-{os.getpid()}-{secrets.token_hex(4)}"


def atomic_write(path: str, data: str | bytes) -> None:
  """Writes `data` to `path` through a synced temp sibling and a rename.

  Args:
    path: the file to write; its directory must exist.
    data: text (written as UTF-8) or bytes.

  Raises:
    OSError: the write failed; the temp sibling is removed and `path` is untouched.
  """
  tmp = temp_name(path)
  try:
    with open(tmp, "wb") as f:
      f.write(data.encode("utf-8") if isinstance(data, str) else data)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise


def file_sha256(path: str) -> str:
  """The hex sha256 of a file's bytes."""
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()


def json_digest(obj) -> str:
  """A short, stable digest (16 hex) of a JSON-able value: keys sorted, other values by str()."""
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]
