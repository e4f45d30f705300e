"""Minimal, validating safetensors reader and writer on numpy (bf16 via ml_dtypes).

Why not `safetensors.numpy`: numpy has no bfloat16, so the library cannot hand out bf16 tensors
as numpy arrays, and its errors on a damaged file do not name the tensor. The format is small:
8 bytes little-endian header length N, N bytes of JSON `{name: {dtype, shape, data_offsets}}`
(plus an optional `__metadata__`), then the raw little-endian data. Reading memory-maps the file
and hands out one tensor at a time, so a shard is never fully resident.
"""

import json
import mmap
import os
from collections.abc import Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np

_DTYPES = {
  "F64": np.dtype(np.float64),
  "F32": np.dtype(np.float32),
  "F16": np.dtype(np.float16),
  "BF16": np.dtype(ml_dtypes.bfloat16),
  "I64": np.dtype(np.int64),
  "I32": np.dtype(np.int32),
  "I16": np.dtype(np.int16),
  "I8": np.dtype(np.int8),
  "U8": np.dtype(np.uint8),
  "BOOL": np.dtype(np.bool_),
}
_NAMES = {dtype: name for name, dtype in _DTYPES.items()}
_MAX_HEADER_BYTES = 100 * 1024 * 1024


class SafetensorsError(ValueError):
  """A safetensors file is malformed; the message names the file and, where known, the tensor."""


def read_header(path: str) -> dict[str, dict]:
  """Reads and validates a safetensors header.

  Args:
    path: the .safetensors file.

  Returns:
    {tensor name: {'dtype': numpy dtype, 'shape': tuple, 'start': int, 'end': int}}, absolute
    byte offsets into the file, in file order.

  Raises:
    SafetensorsError: bad header, unknown dtype, size mismatch, or data past the end of the file
      (a truncated download).
  """
  size = os.path.getsize(path)
  with open(path, "rb") as f:
    prefix = f.read(8)
    if len(prefix) < 8:
      raise SafetensorsError(f"{path}: file is {size} bytes, too short for a safetensors header")
    n = int.from_bytes(prefix, "little")
    if n > min(_MAX_HEADER_BYTES, size - 8):
      raise SafetensorsError(f"{path}: header length {n} exceeds the file size {size} (truncated?)")
    try:
      header = json.loads(f.read(n))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
      raise SafetensorsError(f"{path}: header is not valid JSON: {e}") from e
  header.pop("__metadata__", None)
  entries = {}
  for name, spec in header.items():
    if spec.get("dtype") not in _DTYPES:
      raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {spec.get('dtype')!r}")
    dtype = _DTYPES[spec["dtype"]]
    shape = tuple(int(d) for d in spec["shape"])
    begin, end = (int(o) for o in spec["data_offsets"])
    if end - begin != int(np.prod(shape)) * dtype.itemsize:
      raise SafetensorsError(
        f"{path}: tensor {name!r} spans {end - begin} bytes but shape {shape} {spec['dtype']} "
        f"needs {int(np.prod(shape)) * dtype.itemsize}"
      )
    if 8 + n + end > size:
      raise SafetensorsError(
        f"{path}: tensor {name!r} ends at byte {8 + n + end} but the file has {size} bytes "
        "(truncated file?)"
      )
    entries[name] = {"dtype": dtype, "shape": shape, "start": 8 + n + begin, "end": 8 + n + end}
  return dict(sorted(entries.items(), key=lambda kv: kv[1]["start"]))


class Reader:
  """Random access to the tensors of one safetensors file (a context manager; memory-maps it).

  `read(name)` returns an owned copy and drops the pages it touched from this process's resident
  set (they stay in the page cache), so reading a whole file never makes it resident at once.
  """

  def __init__(self, path: str):
    self.path = path
    self.entries = read_header(path)

  def __enter__(self) -> "Reader":
    self._file = open(self.path, "rb")
    size = os.path.getsize(self.path)
    self._mm = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else None
    return self

  def __exit__(self, *exc) -> None:
    if self._mm is not None:
      self._mm.close()
    self._file.close()

  def read(self, name: str) -> np.ndarray:
    """The tensor `name` as a numpy array with its stored dtype and shape."""
    e = self.entries[name]
    count = (e["end"] - e["start"]) // e["dtype"].itemsize
    if count == 0:
      return np.empty(e["shape"], e["dtype"])
    view = np.frombuffer(self._mm, dtype=e["dtype"], count=count, offset=e["start"])
    array = view.reshape(e["shape"]).copy()
    del view
    page = e["start"] - e["start"] % mmap.PAGESIZE
    self._mm.madvise(mmap.MADV_DONTNEED, page, e["end"] - page)
    return array


def write_stream(path: str, specs: Sequence[tuple[str, tuple[int, ...], np.dtype]],
                 arrays: Iterator[np.ndarray], metadata: Mapping[str, str]) -> None:
  """Writes tensors to a safetensors file one at a time, never holding more than one in memory.

  Args:
    path: output .safetensors file.
    specs: (name, shape, dtype) of every tensor, in write order (the header comes first).
    arrays: yields the arrays in the order of `specs`; each must match its spec.
    metadata: string -> string `__metadata__` (transformers wants {'format': 'pt'}).

  Raises:
    SafetensorsError: an unsupported dtype, or an array that does not match its spec.
  """
  header, offset = {}, 0
  for name, shape, dtype in specs:
    dtype = np.dtype(dtype)
    if dtype not in _NAMES:
      raise SafetensorsError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
    nbytes = int(np.prod(shape)) * dtype.itemsize
    header[name] = {"dtype": _NAMES[dtype], "shape": list(shape),
                    "data_offsets": [offset, offset + nbytes]}
    offset += nbytes
  header["__metadata__"] = dict(metadata)
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)
  with open(path, "wb") as f:
    f.write(len(blob).to_bytes(8, "little"))
    f.write(blob)
    for name, shape, dtype in specs:
      array = next(arrays)
      if tuple(array.shape) != tuple(shape) or array.dtype != np.dtype(dtype):
        raise SafetensorsError(f"{path}: tensor {name!r} is {array.shape} {array.dtype}, "
                               f"declared {tuple(shape)} {np.dtype(dtype)}")
      f.write(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)
