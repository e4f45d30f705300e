"""Decode attention on GPU: a Pallas (Triton) kernel reading the per-layer cache buffers in place.

The decode steps (the AR step, the block-diffusion step, the verify forward: T <= B + 1 queries)
write their new K/V into the cache buffers first and then attend over the S slots alone
(`attention.prepare(..., written_at=)`). The einsum reference does that with two dots, and on
XLA's H100 compiler it materialises each layer's f32 scores [K, G T, S] and bf16 probabilities
in HBM (10 + 5 MB per layer of Qwen3-8B at T = 32 and 2,456 slots: ~6% on top of the step's
weights + cache; docs/results/memory_limit.md). This kernel is flash decoding (FlashAttention-2's
online softmax over key chunks, split over the slots for parallelism; Dao et al. 2023, "Flash-
Decoding for long-context inference"): per kv head it loads its G x T query rows once, streams
the head's keys and values in chunks of BLOCK_K slots, and writes only [rows, H] partial outputs
and two [rows] softmax statistics per split, which `decode_attention` combines.

Layouts are the cache's own (model/cache.py): keys [B*K, H, S] (the score dot q [R, H] x k
[H, chunk] needs no transpose), values [B*K, S, H]. Slots past the last visible one of a row's
batch element (`limit`) are not read. The last chunk starts at S - BLOCK_K (it overlaps the one
before, whose slots it masks), so no load is out of bounds and S needs no padding.

Inference only: the kernel has no backward (a gradient raises); training and scoring run the
cache-free kernels of attention.py. DECODE_INTERPRET runs the same kernel in the Pallas
interpreter (the tests on CPU).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu
from jax.sharding import PartitionSpec

from gr2jax.model import sharding

K_MASK = -2.3819763e38  # masked score, as attention.K_MASK (attention imports this module lazily)
F32 = jnp.float32
BLOCK_K = 128  # slots per chunk (at most S: a shorter cache takes the largest power of two <= S)
MIN_ROWS = 16  # the smallest matrix side of a Triton dot (query rows are padded to a power of 2)
MAX_PROGRAMS = 128  # grid size the splits aim for (about one program per H100 SM)
PARTIAL_FRACTION = 16  # split partials are at most 1/16 of the cache bytes they replace reading
DECODE_INTERPRET = False  # tests on CPU set True (the Pallas interpreter)


def _pow2_at_least(n: int) -> int:
  return 1 << max(0, n - 1).bit_length()


def supports(head_dim: int, slots: int) -> bool:
  """Whether the kernel takes these shapes: a power-of-two head_dim >= MIN_ROWS (a Triton dot's
  tile) and at least MIN_ROWS slots."""
  return head_dim >= MIN_ROWS and not head_dim & (head_dim - 1) and slots >= MIN_ROWS


def num_splits(kv_rows: int, rows: int, slots: int, itemsize: int) -> int:
  """Splits of the slots across programs: enough programs to fill the GPU (MAX_PROGRAMS), with
  the partial outputs (f32 [rows, H] per split) at most 1/PARTIAL_FRACTION of the key + value
  bytes of the slots ([S, H] x 2 per kv head). A split left without a chunk by the rounding
  writes o = l = 0 and m = K_MASK, which the combination weighs by exp(K_MASK - m) = 0."""
  fill = -(-MAX_PROGRAMS // kv_rows)
  traffic = (2 * slots * itemsize) // (PARTIAL_FRACTION * rows * 4)
  return max(1, min(fill, traffic))


def _kernel(limit_ref, q_ref, k_ref, v_ref, mask_ref, o_ref, m_ref, l_ref, *, block_k: int,
            chunks_per_split: int, slots: int):
  """One (kv row, split) program: online softmax over its chunks of slots.

  Refs: limit [] int32 (slots this kv row reads); q [R, H]; k [H, S]; v [S, H]; mask [R, S]
  int8; outputs o [R, H] f32 (unnormalised), m, l [R] f32 (running max, sum).
  """
  split = pl.program_id(1)
  limit = limit_ref[()]
  first = split * chunks_per_split
  last = jnp.minimum(first + chunks_per_split, (limit + block_k - 1) // block_k)
  q = q_ref[...]
  r, h = q.shape

  def body(chunk, carry):
    o, m, l = carry
    start = jnp.minimum(chunk * block_k, slots - block_k)  # the last chunk overlaps, in bounds
    slot = start + jnp.arange(block_k, dtype=jnp.int32)
    fresh = (slot >= chunk * block_k)[None, :]  # slots the previous chunk did not cover
    k = k_ref[:, pl.ds(start, block_k)]
    scores = jnp.dot(q, k, preferred_element_type=F32)  # [R, block_k]
    visible = (mask_ref[:, pl.ds(start, block_k)] != 0) & fresh
    scores = jnp.where(visible, scores, K_MASK)
    m_new = jnp.maximum(m, jnp.max(scores, axis=1))
    alpha = jnp.exp(m - m_new)
    p = jnp.exp(scores - m_new[:, None])
    v = v_ref[pl.ds(start, block_k), :]
    o = alpha[:, None] * o + jnp.dot(p.astype(v.dtype), v, preferred_element_type=F32)
    return o, m_new, alpha * l + jnp.sum(p, axis=1)

  init = (jnp.zeros((r, h), F32), jnp.full((r,), K_MASK, F32), jnp.zeros((r,), F32))
  o, m, l = lax.fori_loop(first, jnp.maximum(first, last), body, init)
  o_ref[...] = o
  m_ref[...] = m
  l_ref[...] = l


def decode_attention(q: jax.Array, k_cache: jax.Array, v_cache: jax.Array,
                     mask: jax.Array) -> jax.Array:
  """GQA attention of T queries over the S slots of one layer's cache buffers (flash decoding).

  Args:
    q: [B, T, N, H] queries (after norm + RoPE), N = K G.
    k_cache: [B*K, H, S] keys, the new tokens' already written (model/cache.py).
    v_cache: [B*K, S, H] values.
    mask: [B, T, S] bool over the slots (attention.buffer_mask); every row sees some slot.

  Returns:
    [B, T, N, H] in q.dtype.
  """
  b, t, n, h = q.shape
  num_kv = k_cache.shape[0] // b
  slots = v_cache.shape[1]
  shapes = {"k_cache": (b * num_kv, h, slots), "v_cache": (b * num_kv, slots, h),
            "mask": (b, t, slots)}
  for name, x in (("k_cache", k_cache), ("v_cache", v_cache), ("mask", mask)):
    if x.shape != shapes[name]:
      raise ValueError(f"decode_attention: {name} is {x.shape}, q {q.shape} needs "
                       f"{shapes[name]}")
  if num_kv == 0 or n % num_kv:
    raise ValueError(f"decode_attention: {n} query heads over {k_cache.shape[0]} cache rows "
                     f"at batch {b}")
  k4 = k_cache.reshape(b, num_kv, h, -1)  # [B, K, H, S]: the rows' logical axes, for the mesh
  v4 = v_cache.reshape(b, num_kv, -1, h)
  return _shards(_decode_attention, b, num_kv)(q, k4, v4, mask)


def _shards(fn, batch: int, num_kv: int):
  """fn under jax.shard_map over the mesh in context: the batch over ('data', 'fsdp'), the kv
  heads (and their query heads) over 'tp', as the decoders shard them (model/sharding.py).

  A Pallas kernel is one opaque custom call that XLA's SPMD partitioner would run replicated
  (gathering the whole cache); per shard it reads its own rows. A no-op without such a mesh or
  where an axis does not divide.
  """
  mesh = jax.sharding.get_abstract_mesh()
  names = () if mesh.empty else mesh.axis_names
  size = lambda axes: int(np.prod([mesh.shape[a] for a in axes]))
  batch_axes = tuple(a for a in sharding.batch_axes(mesh) if batch % size((a,)) == 0)
  tp = ("tp",) if "tp" in names and num_kv % mesh.shape["tp"] == 0 else ()
  if batch % size(batch_axes) or size(batch_axes + tp) == 1:
    return fn
  spec = PartitionSpec(batch_axes or None, None, tp or None, None)  # q, out [B, T, N, H]
  cache = PartitionSpec(batch_axes or None, tp or None, None, None)  # [B, K, ., .]
  return jax.shard_map(fn, in_specs=(spec, cache, cache, PartitionSpec(batch_axes or None)),
                       out_specs=spec, check_vma=False)


@jax.custom_vjp
def _decode_attention(q, k_cache, v_cache, mask):
  return _forward(q, k_cache, v_cache, mask)


def _no_forward_for_grad(q, k_cache, v_cache, mask):
  raise NotImplementedError(
    "decode_attention is inference only (no backward): differentiate a cache-free forward "
    "(attention_impl 'cudnn' / 'splash' / 'reference'), not a decode step")


_decode_attention.defvjp(_no_forward_for_grad, lambda res, g: None)


def _forward(q, k_cache, v_cache, mask):
  """decode_attention on one shard: q [B, T, N, H], caches [B, K, H, S] / [B, K, S, H]."""
  b, t, n, h = q.shape
  _, num_kv, _, slots = k_cache.shape
  kv_rows = b * num_kv
  k_cache = k_cache.reshape(kv_rows, h, slots)
  v_cache = v_cache.reshape(kv_rows, slots, h)
  g = n // num_kv
  if not supports(h, slots):
    raise ValueError(f"decode_attention: head_dim={h}, {slots} cache slots: the kernel needs a "
                     f"power-of-two head_dim >= {MIN_ROWS} and >= {MIN_ROWS} slots "
                     "(Triton dot tiles); use attention_impl='reference'")
  block_k = min(BLOCK_K, 1 << (slots.bit_length() - 1))
  rows = max(MIN_ROWS, _pow2_at_least(g * t))
  # Query rows (g, t) of each kv head, scaled, padded with copies of the last row.
  q = (q * jnp.asarray(h ** -0.5, q.dtype)).reshape(b, t, num_kv, g, h)
  q = q.transpose(0, 2, 3, 1, 4).reshape(kv_rows, g * t, h)
  q = jnp.pad(q, ((0, 0), (0, rows - g * t), (0, 0)), mode="edge")
  row_mask = jnp.tile(mask, (1, g, 1))  # [B, G T, S]: row (g, t) has mask row t
  row_mask = jnp.pad(row_mask, ((0, 0), (0, rows - g * t), (0, 0)), mode="edge").astype(jnp.int8)
  slot = jnp.arange(slots, dtype=jnp.int32)
  limit = jnp.max(jnp.where(jnp.any(mask, axis=1), slot + 1, 0), axis=1)  # [B]
  limit = jnp.repeat(limit.astype(jnp.int32), num_kv)  # [B*K]
  splits = num_splits(kv_rows, rows, slots, k_cache.dtype.itemsize)
  chunks = -(-slots // block_k)
  chunks_per_split = -(-chunks // splits)
  kernel = functools.partial(_kernel, block_k=block_k, chunks_per_split=chunks_per_split,
                             slots=slots)
  o, m, l = pl.pallas_call(
    kernel,
    grid=(kv_rows, splits),
    in_specs=[
      pl.BlockSpec((None,), lambda r, s: (r,)),
      pl.BlockSpec((None, rows, h), lambda r, s: (r, 0, 0)),
      pl.BlockSpec((None, h, slots), lambda r, s: (r, 0, 0)),
      pl.BlockSpec((None, slots, h), lambda r, s: (r, 0, 0)),
      pl.BlockSpec((None, rows, slots), lambda r, s: (r // num_kv, 0, 0)),
    ],
    out_specs=[
      pl.BlockSpec((None, None, rows, h), lambda r, s: (s, r, 0, 0)),
      pl.BlockSpec((None, None, rows), lambda r, s: (s, r, 0)),
      pl.BlockSpec((None, None, rows), lambda r, s: (s, r, 0)),
    ],
    out_shape=[jax.ShapeDtypeStruct((splits, kv_rows, rows, h), F32),
               jax.ShapeDtypeStruct((splits, kv_rows, rows), F32),
               jax.ShapeDtypeStruct((splits, kv_rows, rows), F32)],
    compiler_params=plgpu.CompilerParams(num_warps=4 if rows <= 64 else 8, num_stages=2),
    interpret=DECODE_INTERPRET,
    name="decode_attention",
  )(limit, q, k_cache, v_cache, row_mask)
  m_all = jnp.max(m, axis=0)  # [B*K, R]
  w = jnp.exp(m - m_all[None])  # [splits, B*K, R]
  out = jnp.einsum("SRQ,SRQH->RQH", w, o) / jnp.einsum("SRQ,SRQ->RQ", w, l)[..., None]
  out = out[:, :g * t].reshape(b, num_kv, g, t, h).transpose(0, 3, 1, 2, 4)
  return out.reshape(b, t, n, h).astype(q.dtype)
