"""Whole-file safetensors helpers for the tests, over the library's Reader and write_stream."""

from collections.abc import Iterator, Mapping

import numpy as np

from gr2jax.hf import safetensors_io


def iter_tensors(path: str) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (name, array) for each tensor of a safetensors file, one at a time, in file order."""
  with safetensors_io.Reader(path) as reader:
    for name in reader.entries:
      yield name, reader.read(name)


def write_file(path: str, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str]) -> None:
  """Writes a dict of tensors to a safetensors file (safetensors_io.write_stream)."""
  specs = [(name, a.shape, a.dtype) for name, a in tensors.items()]
  safetensors_io.write_stream(path, specs, iter(tensors.values()), metadata)
