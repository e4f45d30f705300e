"""Row chunks: one jitted per-chunk function over a batch's rows, results concatenated on the host.

At paper scale a training step decodes 512-1,024 trajectories and scores all of them (teacher
log-probs, pi_old) before the jitted step; one call over every row does not fit a device
(docs/plan_qwen3_8b.md). `map_row_chunks` cuts the rows into chunks of a fixed size (the last one
padded by repeating the batch's last row, so every call has the same shape and nothing
recompiles), places each chunk with the batch sharding (model/sharding.py `global_arrays`: each
process fills only its own shards), brings the per-row outputs back to the host
(`host_arrays`) and drops the padding. chunk_rows = 0 is one call over all rows, unpadded.
"""

from collections.abc import Callable

import jax
import numpy as np

from gr2jax.model import sharding as sharding_lib


def chunk_size(num_rows: int, chunk_rows: int) -> int:
  """Rows per call: chunk_rows, or all num_rows when chunk_rows is 0 or covers them."""
  if chunk_rows < 0:
    raise ValueError(f"chunk_rows must be >= 0 (0 = all rows at once), got {chunk_rows}")
  return num_rows if chunk_rows == 0 or chunk_rows >= num_rows else chunk_rows


def map_row_chunks(fn: Callable, rows, chunk_rows: int, *,
                   sharding: jax.sharding.Sharding | None = None,
                   key: jax.Array | None = None):
  """fn over the rows of `rows` in chunks of chunk_rows; the outputs concatenated (module doc).

  Args:
    fn: (chunk, key) -> a pytree of [C, ...] per-row arrays; jitted (or made of jitted pieces):
      every call has the same C. The chunk has the structure of `rows` (leaves [C, ...]).
    rows: a pytree of [B, ...] host arrays (a dict, a training Batch); leafless nodes (a static
      replay.Rounds) go whole to every chunk.
    chunk_rows: C; 0 (or >= B) = one call over all B rows.
    sharding: the placement of each chunk's arrays (a leading-axis batch sharding; C must be a
      multiple of its batch shards); None passes numpy.
    key: a PRNG key for fn; chunk i gets fold_in(key, i) (one call: the key itself). None gives
      fn None.

  Returns:
    fn's pytree with [B, ...] numpy leaves (in every process).
  """
  num_rows = len(jax.tree.leaves(rows)[0])
  size = chunk_size(num_rows, chunk_rows)
  single = size == num_rows
  outputs = []
  for i, start in enumerate(range(0, num_rows, size)):
    index = np.minimum(np.arange(start, start + size), num_rows - 1)  # pad: repeat row B - 1
    chunk = jax.tree.map(lambda x, index=index: np.asarray(x)[index], rows)
    if sharding is not None:
      chunk = sharding_lib.global_arrays(chunk, sharding)
    chunk_key = key if key is None or single else jax.random.fold_in(key, i)
    outputs.append(sharding_lib.host_arrays(fn(chunk, chunk_key)))
  return jax.tree.map(lambda *xs: np.concatenate(xs)[:num_rows], *outputs)
