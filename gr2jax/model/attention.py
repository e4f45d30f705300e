"""GQA attention of T queries over [cache slots S | the T new keys]: one reference, two kernels.

`attend` is what every layer of `qwen3.forward` calls; `ModelConfig.attention_impl` picks
(`resolve_impl`; STYLE.md "Accelerators", the dispatch of maxtext's layers/attention_op.py):

  reference  the einsum path: query-chunked, each chunk rematerialised in the backward pass,
             exact for any [B, T, S + T] bool mask; the cache and the new keys are scored
             separately and share one softmax (no K/V concatenation). The CPU path, the path of
             every forward that reads a cache (below), and the ground truth of
             tests/model/test_attention.py. A two-stream layout with noisy streams (CFT, the
             replay of OPD and RL; `TwoStream`) runs per noisy block (`two_stream`): each
             block's queries over the prompt + clean keys and its own block's keys, exact,
             without the [T, T] mask or scores (the dense mask stays its test reference).
  cudnn      `jax.nn.dot_product_attention(implementation='cudnn')` (cuDNN flash attention,
             bf16/fp16 only). A causal mask without padding is cuDNN's CAUSAL mask type (no
             mask tensor); every other mask -- padding, the cached block decode, the two-stream
             CFT layout, the packed replay -- is passed as the bool mask [B, 1, T, S + T], which
             cuDNN applies as an additive bias (exact; O(T (S + T)) memory per row for the bias
             and its gradient, instead of the reference's [N, chunk, S + T] f32 scores).
  splash     Pallas splash attention (TPU): the mask's static `Pattern` is the splash mask
             (block-sparse: all-masked tiles are skipped), the per-row key validity (padding,
             unwritten cache slots) is the kv segment ids (queries segment 0, valid keys 0,
             invalid keys 1). A mask given without its Pattern has no static structure and runs
             the reference path instead (documented fallback; every mask the library builds has
             one). Run per shard of the batch axes of the mesh in context (jax.shard_map).
  auto       by jax.default_backend(): 'gpu' -> cudnn (reference when compute_dtype is
             float32: cuDNN has no fp32 kernel), 'tpu' -> splash, otherwise reference. A
             compile-only target (AOT from a CPU host) must name its kernel explicitly.

A forward that reads a cache (the decode steps: T <= B + 1 queries over S slots) is bound by
reading the cache, which it must read in place from the per-layer buffers (model/cache.py): the
cuDNN and splash kernels need one [cache | new] K/V tensor, i.e. a copy of the whole cache per
layer per step, so they serve the cache-free forwards only (training, scoring, the empty-cache
prefill). A decode step writes its new K/V first and attends over the buffers alone
(`prepare(..., written_at=)`): with 'cudnn' it runs `decode` (model/decode_attention.py, a Pallas
Triton flash-decoding kernel: without it XLA's H100 compiler writes each layer's f32 scores and
bf16 probabilities to HBM); everywhere else the reference, whose two dots read the buffers in
place (on the TPU compiler the probabilities stay on chip). Other cached forwards run the
reference.

Masks: every mask the library builds is `apply_pattern(pattern, key_valid)`: a static [T, S + T]
Pattern (per-slot block and stream ids, one rule) shared by every row, and-ed with a per-row key
validity [B, S + T]. The kernels need the factored form; the reference needs only the dense mask.
Every row must see at least one key (true of every library mask; a splash row without one would
divide by zero). The kernels read one K/V tensor, [new keys | zero padding] (`_padded_keys`).

Numerics: softmax in f32 in every path; masked scores are K_MASK in the reference (finite: a
fully masked row gives a uniform softmax rather than NaN).
"""

import contextlib
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gr2jax.model import masks, sharding
from gr2jax.model.config import ModelConfig

K_MASK = -2.3819763e38  # masked attention score; a large finite negative, not -inf
F32 = jnp.float32
SCORE_CHUNK_BYTES = 8 << 20  # f32 attention scores per query chunk on CPU (see _query_chunk)
ACCELERATOR_SCORE_CHUNK_BYTES = 1 << 30  # the same on GPU/TPU (not tuned; bounds memory)
MIN_QUERY_CHUNK = 32
KEY_GROUPS = 8  # query-chunk groups that may skip the new keys after them (see reference)
# The implementation argument of jax.nn.dot_product_attention on the 'cudnn' path, and splash's
# Pallas interpret mode: the kernels themselves on an accelerator; tests on CPU set 'xla' / True
# (the same kernel arguments, computed by XLA / the Pallas interpreter).
CUDNN_IMPLEMENTATION = "cudnn"
SPLASH_INTERPRET = False
SPLASH_MIN_BLOCK, SPLASH_MAX_BLOCK = 128, 512  # splash tile sizes (multiples of the 128 lanes)
# The reference path of a two-stream layout with noisy streams: per noisy block (`two_stream`), or
# with False the dense mask like any other (its ground truth in tests, bench_train's "before").
STRUCTURED_TWO_STREAM = True
ALL = slice(None)


@dataclasses.dataclass(frozen=True)
class Pattern:
  """The static part of an attention mask, mask[b] = pattern & key_valid[b], as per-slot ids.

  Every query and key slot has a block id and a stream id (0 = the causal / clean stream, k >= 1
  = noisy stream k). The one rule (`rule`; the x_t (+) x_0 mask of BD3-LM / Fast-dLLM v2, with
  the AR mask as its one-stream, block-size-1 case): a stream-0 query sees stream-0 keys of
  blocks <= its own; a query of stream k >= 1 sees stream-0 keys of earlier blocks and the keys
  of its own block in its own stream. O(T + S) static ints, not an O(T S) array: the dense mask
  is computed by XLA from them (`apply_pattern`), the [T, S + T] array only where a kernel needs
  it (`array`, splash). Static (hashable, a pytree without leaves): it rides through jit and
  lax.scan next to the dense mask it describes.

  Attributes:
    q_block, q_stream: [T] ints of the query slots.
    k_block, k_stream: [S + T] ints of the key slots ([cache slots | new tokens]).
    key_padding: False promises every key is valid (mask == pattern in every row): a causal
      pattern without padding is then cuDNN's CAUSAL mask type with no mask tensor.
  """

  q_block: tuple[int, ...]
  q_stream: tuple[int, ...]
  k_block: tuple[int, ...]
  k_stream: tuple[int, ...]
  key_padding: bool = True

  def __post_init__(self):
    for name in ("q_block", "q_stream", "k_block", "k_stream"):
      object.__setattr__(self, name, tuple(int(i) for i in np.asarray(getattr(self, name))))
    if len(self.q_block) != len(self.q_stream) or len(self.k_block) != len(self.k_stream):
      raise ValueError(f"Pattern: {len(self.q_block)} query blocks, {len(self.q_stream)} query "
                       f"streams, {len(self.k_block)} key blocks, {len(self.k_stream)} key "
                       "streams (each pair must match)")

  @property
  def shape(self) -> tuple[int, int]:
    """(T, S + T)."""
    return len(self.q_block), len(self.k_block)

  def mask(self, xp=np, rows: slice = ALL, cols: slice = ALL):
    """[T, S + T] bool by `rule` (its [rows, cols] part), in numpy (xp=np) or as XLA ops
    (xp=jnp)."""
    ids = [xp.asarray(np.asarray(x, np.int32)[part]) for x, part in (
      (self.q_block, rows), (self.q_stream, rows), (self.k_block, cols), (self.k_stream, cols))]
    qb, qs, kb, ks = ids[0][:, None], ids[1][:, None], ids[2][None, :], ids[3][None, :]
    return xp.where(qs > 0, ((ks == qs) & (kb == qb)) | ((ks == 0) & (kb < qb)),
                    (ks == 0) & (kb <= qb))

  @property
  def is_causal(self) -> bool:
    """Causal with no cache slots: one stream, query and key blocks the same increasing ids."""
    return (self.q_block == self.k_block and not any(self.q_stream) and not any(self.k_stream)
            and all(a < b for a, b in zip(self.q_block, self.q_block[1:], strict=False)))


jax.tree_util.register_static(Pattern)


def causal_pattern(t: int, cache_slots: int = 0, key_padding: bool = True) -> Pattern:
  """Causal over T new tokens in slot order, after `cache_slots` cache keys all visible.

  The AR prefill and decode step ([ones(T, S) | tril(T)]): a cache slot is visible iff valid.
  """
  blocks = cache_slots + np.arange(t)
  return Pattern(blocks, np.zeros(t), np.concatenate([np.arange(cache_slots), blocks]),
                 np.zeros(cache_slots + t), key_padding)


def block_pattern(t: int, cache_slots: int) -> Pattern:
  """Every new token sees the valid cache slots and all T new tokens (a block-diffusion step)."""
  return Pattern(np.full(t, cache_slots), np.zeros(t),
                 np.concatenate([np.arange(cache_slots), np.full(t, cache_slots)]),
                 np.zeros(cache_slots + t))


@dataclasses.dataclass(frozen=True)
class TwoStream:
  """The shape of the two-stream layout (gr2jax/diffusion/layout.py, the one place it is built):

    [prompt (P slots) | clean response (R) | noisy stream 1 (R) | ... | noisy stream K (R)]

  Prompt slot i is block i, response index j block P + j // B in the clean and in every noisy
  stream (masks.block_ids); stream ids 0 (prompt, clean) and 1..K (`pattern`: Pattern's rule).

  Attributes:
    prompt: P >= 0.
    response: R, a multiple of block_size.
    streams: K >= 0 noisy streams.
    block_size: B >= 1.
  """

  prompt: int
  response: int
  streams: int
  block_size: int

  @property
  def base(self) -> int:
    """C = P + R: the prompt and clean slots, the keys every noisy block shares."""
    return self.prompt + self.response

  @property
  def noisy_blocks(self) -> int:
    """Q = K R / B: the noisy blocks, each its own attention group (`two_stream`)."""
    return self.streams * self.response // self.block_size

  def pattern(self) -> Pattern:
    """The layout's static [N, N] Pattern, N = P + (1 + K) R."""
    p, r = self.prompt, self.response
    stream = np.concatenate([np.zeros(p + r, int), np.repeat(np.arange(1, self.streams + 1), r)])
    clean = masks.block_ids(np.arange(p + r), p, self.block_size, xp=np)  # prompt, then blocks
    blocks = np.concatenate([clean, np.tile(clean[p:], self.streams)])
    return Pattern(blocks, stream, blocks, stream)


@functools.lru_cache(maxsize=64)
def two_stream_of(pattern: Pattern) -> TwoStream | None:
  """The TwoStream whose `pattern()` this is, if it has a noisy stream (K >= 1), else None."""
  streams = max(pattern.q_stream, default=0)
  if streams < 1 or (pattern.k_block, pattern.k_stream) != (pattern.q_block, pattern.q_stream):
    return None
  r = pattern.q_stream.count(1)
  p = pattern.q_stream.count(0) - r
  block_size = pattern.q_block[p:p + r].count(p) if p >= 0 else 0
  if not block_size or r % block_size:
    return None
  shape = TwoStream(p, r, streams, block_size)
  return shape if shape.pattern() == pattern else None


@contextlib.contextmanager
def two_stream_path(structured: bool):
  """Within it, the functions traced run a two-stream layout's reference path per noisy block
  (True, the default) or over its dense mask (False: the ground truth, a benchmark's before)."""
  global STRUCTURED_TWO_STREAM
  before, STRUCTURED_TWO_STREAM = STRUCTURED_TWO_STREAM, structured
  try:
    yield
  finally:
    STRUCTURED_TWO_STREAM = before


def apply_pattern(pattern: Pattern, key_valid: jax.Array) -> jax.Array:
  """The dense mask of a pattern: [B, T, S + T] bool = pattern & key_valid[:, None, :].

  Args:
    pattern: the static structure.
    key_valid: [B, S + T] bool, False for padding / unwritten cache slots.
  """
  return pattern.mask(jnp)[None] & jnp.asarray(key_valid, bool)[:, None, :]


def resolve_impl(config: ModelConfig) -> str:
  """The kernel of config.attention_impl: 'reference' | 'cudnn' | 'splash' ('auto' by backend)."""
  if config.attention_impl != "auto":
    return config.attention_impl
  backend = jax.default_backend()
  if backend in ("gpu", "cuda") and config.compute_dtype != "float32":
    return "cudnn"
  return "splash" if backend == "tpu" else "reference"


def score_chunk_bytes(config: ModelConfig) -> int:
  """The reference's attention-score budget of one query chunk: config.attention_chunk_bytes,
  else by backend.

  The CPU budget keeps a chunk's scores and probs cache-resident: one [B, N, T, S + T] pass is
  memory-bound and was 2-4x slower at T = 1024 (tiny/small presets). Accelerators get
  ACCELERATOR_SCORE_CHUNK_BYTES: serial small chunks would underuse them. Training configs set
  the field, so a train step does not depend on jax.default_backend() at trace time.
  """
  if config.attention_chunk_bytes:
    return config.attention_chunk_bytes
  return SCORE_CHUNK_BYTES if jax.default_backend() == "cpu" else ACCELERATOR_SCORE_CHUNK_BYTES


# ---- the reference (einsum) path ---------------------------------------------------------------


def _query_chunk(batch: int, num_heads: int, num_keys: int, num_queries: int,
                 budget: int) -> int:
  """Queries per attention chunk: the largest power of two whose f32 scores fit `budget` bytes,
  at least MIN_QUERY_CHUNK, at most num_queries (one chunk)."""
  per_query = batch * num_heads * num_keys * 4
  chunk = max(MIN_QUERY_CHUNK, 1 << max(0, (budget // per_query).bit_length() - 1))
  return min(chunk, num_queries)


def _softmax(scores: jax.Array, mask: jax.Array, dtype) -> jax.Array:
  """softmax(scores where mask, else K_MASK) over the last axis in f32, cast to dtype."""
  return jax.nn.softmax(jnp.where(mask, scores, K_MASK), axis=-1).astype(dtype)


def _attend(q: jax.Array, k: jax.Array, v: jax.Array, k_cache: jax.Array | None,
            v_cache: jax.Array | None, mask: jax.Array) -> jax.Array:
  """Attention of C queries over [cache slots | new keys] with one shared softmax.

  Args:
    q: [B, K, G, C, H] scaled queries, grouped by KV head.
    k, v: [B, T, K, H] keys / values of the new tokens (T = 0: the buffers hold them).
    k_cache, v_cache: [B*K, H, S] cached keys, [B*K, S, H] values (model/cache.py: the rows
      are the one batch dim of both dots), or None (S = 0).
    mask: [B, C, S + T] bool, the mask rows of these C queries.

  Returns:
    [B, K, G, C, H] f32.
  """
  b, num_kv, g, c, h = q.shape
  rows = lambda x: x.reshape(b * num_kv, *x.shape[2:])  # [B, K, ...] -> [B*K, ...]
  heads = lambda x: x.reshape(b, num_kv, *x.shape[1:])  # and back
  s = 0 if k_cache is None else k_cache.shape[-1]
  scores = []  # [B, K, G, C, S | T]: the cache's, then the new keys'
  if s:
    scores.append(heads(jnp.einsum("RGCH,RHS->RGCS", rows(q), k_cache,
                                   preferred_element_type=F32)))
  if k.shape[1]:
    scores.append(jnp.einsum("BKGCH,BTKH->BKGCT", q, k, preferred_element_type=F32))
  scores = jnp.concatenate(scores, axis=-1) if len(scores) > 1 else scores[0]
  probs = _softmax(scores, mask[:, None, None], q.dtype)
  out = 0.0
  if s:
    out += heads(jnp.einsum("RGCS,RSH->RGCH", rows(probs[..., :s]), v_cache,
                            preferred_element_type=F32))
  if k.shape[1]:
    out += jnp.einsum("BKGCT,BTKH->BKGCH", probs[..., s:], v, preferred_element_type=F32)
  return out


def _attend_chunks(q: jax.Array, k: jax.Array, v: jax.Array, k_cache: jax.Array | None,
                   v_cache: jax.Array | None, mask: jax.Array, chunk: int) -> jax.Array:
  """`_attend` over [B, K, G, C * chunk, H] queries, `chunk` at a time (lax.map); f32 out.

  Each chunk is rematerialised in the backward pass (jax.checkpoint), so a gradient keeps one
  chunk's [chunk, S + T] scores at a time instead of all of them (at the paper's 10k-token
  replay that was ~20 GB per row; docs/plan_qwen3_8b.md). Exact; decoding has no backward.
  """
  b, num_kv, g, rows, h = q.shape
  q = q.reshape(b, num_kv, g, rows // chunk, chunk, h).transpose(3, 0, 1, 2, 4, 5)
  mask = mask.reshape(b, rows // chunk, chunk, -1).swapaxes(0, 1)
  attend = jax.checkpoint(lambda qm: _attend(qm[0], k, v, k_cache, v_cache, qm[1]))
  out = lax.map(attend, (q, mask))
  return out.transpose(1, 2, 3, 0, 4, 5).reshape(b, num_kv, g, rows, h)


def _attend_group(q: jax.Array, k: jax.Array, v: jax.Array, k_cache: jax.Array | None,
                  v_cache: jax.Array | None, mask: jax.Array, chunk: int,
                  limit: int) -> jax.Array:
  """`_attend_chunks`, reading only the first `limit` new keys when that is exact.

  Exact when the mask hides every later new key from these rows and each row sees some kept key
  (then the dropped scores would have had probability exactly 0): true for the row groups of a
  causal mask; otherwise (lax.cond) all keys are scored.
  """
  kept = mask.shape[-1] - k.shape[1] + limit  # cache slots + the first `limit` new keys
  if kept == mask.shape[-1]:
    return _attend_chunks(q, k, v, k_cache, v_cache, mask, chunk)
  exact = ~jnp.any(mask[..., kept:]) & jnp.all(jnp.any(mask[..., :kept], axis=-1))
  return lax.cond(
    exact,
    lambda: _attend_chunks(q, k[:, :limit], v[:, :limit], k_cache, v_cache, mask[..., :kept],
                           chunk),
    lambda: _attend_chunks(q, k, v, k_cache, v_cache, mask, chunk))


def reference(q: jax.Array, k: jax.Array, v: jax.Array, k_cache: jax.Array | None,
              v_cache: jax.Array | None, mask: jax.Array, chunk_bytes: int) -> jax.Array:
  """GQA attention of T queries over [cache slots | new keys] with one shared softmax (einsums).

  Long query sequences run in chunks of `_query_chunk` queries (lax.map): each chunk scores all
  keys under its own mask rows, so the result is exact for any mask; T is padded up to a multiple
  of the chunk with fully masked rows that are dropped afterwards. The chunks form up to
  KEY_GROUPS consecutive groups; a group whose mask rows hide all new keys after its last row
  (causal masks) skips scoring them (`_attend_group`), about 45% less work at 8 groups.

  Args:
    q: [B, T, N, H] queries (after norm + RoPE).
    k, v: [B, T, K, H] keys / values of the new tokens.
    k_cache, v_cache: [B*K, H, S] cached keys, [B*K, S, H] values, or None (S = 0).
    mask: [B, T, S + T] bool.
    chunk_bytes: the f32 score budget of one query chunk (score_chunk_bytes).

  Returns:
    [B, T, N, H] in q.dtype.
  """
  b, t, n, h = q.shape
  num_kv = k.shape[2]
  g = n // num_kv
  dtype = q.dtype
  q = q * jnp.asarray(h ** -0.5, dtype)
  q = q.reshape(b, t, num_kv, g, h).transpose(0, 2, 3, 1, 4)  # [B, K, G, T, H]
  chunk = _query_chunk(b, n, mask.shape[-1], t, chunk_bytes)
  if chunk == t:
    out = _attend(q, k, v, k_cache, v_cache, mask)  # [B, K, G, T, H]
  else:
    pad = -t % chunk
    q = jnp.pad(q, ((0, 0), (0, 0), (0, 0), (0, pad), (0, 0)))
    mask = jnp.pad(mask, ((0, 0), (0, pad), (0, 0)))
    bounds = [int(c[0]) * chunk for c in np.array_split(np.arange((t + pad) // chunk),
                                                        KEY_GROUPS) if len(c)] + [t + pad]
    groups = [_attend_group(q[:, :, :, lo:hi], k, v, k_cache, v_cache, mask[:, lo:hi], chunk,
                            min(hi, k.shape[1]))
              for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]
    out = jnp.concatenate(groups, axis=3)[:, :, :, :t]
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h).astype(dtype)


# ---- the reference path of the two-stream layout -----------------------------------------------


def two_stream_masks(mask: jax.Array, shape: TwoStream) -> dict[str, jax.Array]:
  """The parts of a two-stream mask that `two_stream` reads, without the [T, T] one.

  Every slot of the layout sees itself, so key validity is the mask's diagonal (read as a
  strided slice, which XLA fuses into the mask's producer). A noisy query's view of the shared
  keys depends only on its block's index in the response (the same in every stream and at every
  offset in the block): the pattern's row of that block's first slot in stream 1.

  Args:
    mask: [B, T, T] bool == apply_pattern(shape.pattern(), key_valid).
    shape: the layout.

  Returns:
    {'base_mask': [B, C, C] bool (prompt and clean queries over prompt and clean keys),
     'block_mask': [B, Q, C] bool (noisy block q over the same keys),
     'own_valid': [B, Q, B_s] bool (the keys of its own block)}, C = P + R, Q noisy blocks of
    B_s = shape.block_size slots.
  """
  b, t, _ = mask.shape
  c, r, size = shape.base, shape.response, shape.block_size
  valid = mask.reshape(b, t * t)[:, ::t + 1]  # [B, T]: the diagonal
  pattern = shape.pattern()
  base = pattern.mask(rows=slice(0, c), cols=slice(0, c))  # [C, C]
  blocks = np.tile(pattern.mask(rows=slice(c, c + r, size), cols=slice(0, c)),
                   (shape.streams, 1))  # [Q, C]
  return {"base_mask": base[None] & valid[:, None, :c],
          "block_mask": blocks[None] & valid[:, None, :c],
          "own_valid": valid[:, c:].reshape(b, shape.noisy_blocks, size)}


def _attend_blocks(q: jax.Array, k: jax.Array, v: jax.Array, k_own: jax.Array,
                   v_own: jax.Array, block_mask: jax.Array, own_valid: jax.Array) -> jax.Array:
  """Attention of Q query blocks, each over the C shared keys and its own block's keys, with one
  softmax over both.

  Args:
    q: [B, K, G, Q, S, H] scaled queries, grouped by KV head (S slots per block).
    k, v: [B, C, K, H] the shared keys / values.
    k_own, v_own: [B, Q, S, K, H] each block's own keys / values.
    block_mask: [B, Q, C] bool, the shared keys each block sees.
    own_valid: [B, Q, S] bool, the valid keys of its own block.

  Returns:
    [B, K, G, Q, S, H] f32.
  """
  c = k.shape[1]
  scores = jnp.concatenate(
    [jnp.einsum("BKGQSH,BCKH->BKGQSC", q, k, preferred_element_type=F32),
     jnp.einsum("BKGQSH,BQTKH->BKGQST", q, k_own, preferred_element_type=F32)], axis=-1)
  mask = jnp.concatenate([block_mask, own_valid], axis=-1)[:, None, None, :, None]
  probs = _softmax(scores, mask, q.dtype)
  return (jnp.einsum("BKGQSC,BCKH->BKGQSH", probs[..., :c], v, preferred_element_type=F32)
          + jnp.einsum("BKGQST,BQTKH->BKGQSH", probs[..., c:], v_own,
                       preferred_element_type=F32))


def two_stream(q: jax.Array, k: jax.Array, v: jax.Array, shape: TwoStream,
               prepared: dict[str, Any]) -> jax.Array:
  """The reference attention of a two-stream layout (K >= 1), exact, at the layout's cost.

  The prompt and clean queries attend over the C = P + R prompt and clean keys (`reference`,
  [B, C, C] mask, block-causal); each of the Q = K R / B_s noisy blocks attends over the same C
  keys (masked to earlier clean blocks and key validity) and its own B_s keys, one softmax over
  both (`_attend_blocks`): the score work is C^2 + K R (C + B_s) per head instead of the dense
  mask's (C + K R)^2, and no [T, T] mask or score tensor exists. The noisy blocks run in
  chunks whose f32 scores fit prepared['chunk_bytes'] (lax.map), each rematerialised in the
  backward pass like the reference's query chunks; padding blocks see no key (uniform softmax,
  dropped).

  Args:
    q: [B, T, N, H] queries (after norm + RoPE); k, v: [B, T, K, H], T = C + K R.
    shape: the layout (two_stream_of(pattern)).
    prepared: two_stream_masks(...) and 'chunk_bytes'.

  Returns:
    [B, T, N, H] in q.dtype.
  """
  b, t, n, h = q.shape
  num_kv = k.shape[2]
  g = n // num_kv
  c, size, blocks = shape.base, shape.block_size, shape.noisy_blocks
  base = reference(q[:, :c], k[:, :c], v[:, :c], None, None, prepared["base_mask"],
                   prepared["chunk_bytes"])  # [B, C, N, H]
  per_block = b * n * size * (c + size) * 4  # f32 score bytes of one noisy block
  chunks = -(-blocks // max(1, prepared["chunk_bytes"] // per_block))
  chunk = -(-blocks // chunks)
  pad = chunks * chunk - blocks
  split = lambda x: jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)).reshape(
    b, chunks, chunk, *x.shape[2:]).swapaxes(0, 1)  # [B, Q, ...] -> [chunks, B, chunk, ...]
  qn = (q[:, c:] * jnp.asarray(h ** -0.5, q.dtype)).reshape(b, blocks, size, num_kv, g, h)
  k_own, v_own = (x[:, c:].reshape(b, blocks, size, num_kv, h) for x in (k, v))
  parts = (split(qn).transpose(0, 1, 4, 5, 2, 3, 6), split(k_own), split(v_own),
           split(prepared["block_mask"]), split(prepared["own_valid"]))
  attend = lambda part: _attend_blocks(part[0], k[:, :c], v[:, :c], *part[1:])
  if chunks == 1:
    out = attend([x[0] for x in parts])[None]
  else:
    out = lax.map(jax.checkpoint(attend), parts)  # [chunks, B, K, G, chunk, S, H]
  out = out.transpose(1, 0, 4, 5, 2, 3, 6).reshape(b, chunks * chunk, size, n, h)[:, :blocks]
  return jnp.concatenate([base, out.reshape(b, t - c, n, h).astype(q.dtype)], axis=1)


# ---- kernels -----------------------------------------------------------------------------------


def _padded_keys(new: jax.Array, size: int) -> jax.Array:
  """[B, size, K, H]: a kernel's key (value) tensor, the new keys then masked zero keys (the
  kernel's padding)."""
  return jnp.pad(new, ((0, 0), (0, size - new.shape[1]), (0, 0), (0, 0)))


def cudnn_arguments(mask: jax.Array, pattern: Pattern | None) -> dict[str, Any]:
  """The mask arguments of jax.nn.dot_product_attention on the cuDNN path.

  Args:
    mask: [B, T, S + T] bool.
    pattern: its static structure, or None.

  Returns:
    {'is_causal': True, 'mask': None, 'keys': S + T} for a causal pattern without padding
    (cuDNN's CAUSAL mask type); else {'is_causal': False, 'mask': [B, 1, Tp, Sp] bool (cuDNN's
    additive bias), 'keys': Sp}, T and S + T padded to even lengths (cuDNN's bias backward
    needs them; padded keys are masked, padded rows see key 0).
  """
  b, t, keys = mask.shape
  if pattern is not None and pattern.is_causal and not pattern.key_padding:
    return {"is_causal": True, "mask": None, "keys": keys}
  mask = jnp.pad(mask[:, None], ((0, 0), (0, 0), (0, t % 2), (0, keys % 2)))
  mask = mask.at[:, :, t:, 0].set(True)  # no empty softmax on a padded row
  return {"is_causal": False, "mask": mask, "keys": keys + keys % 2}


def cudnn(q: jax.Array, k: jax.Array, v: jax.Array, arguments: dict[str, Any]) -> jax.Array:
  """cuDNN flash attention (jax.nn.dot_product_attention; GQA native) with cudnn_arguments.

  Args:
    q: [B, T, N, H]; k, v: [B, arguments['keys'], K, H]; arguments: cudnn_arguments(...).

  Returns:
    [B, T, N, H] in q.dtype.
  """
  if CUDNN_IMPLEMENTATION == "cudnn" and q.dtype == jnp.float32:
    raise ValueError("attention: attention_impl='cudnn' needs ModelConfig.compute_dtype="
                     "'bfloat16' (cuDNN flash attention has no float32 kernel)")
  mask, t = arguments["mask"], q.shape[1]
  if mask is not None and mask.shape[2] > t:
    q = jnp.pad(q, ((0, 0), (0, mask.shape[2] - t), (0, 0), (0, 0)))
  out = jax.nn.dot_product_attention(q, k, v, mask=mask, is_causal=arguments["is_causal"],
                                     implementation=CUDNN_IMPLEMENTATION)
  return out[:, :t]


def _splash_block(n: int) -> int:
  """The splash tile along a sequence of n: 128 .. 512, the smallest that covers n."""
  return min(SPLASH_MAX_BLOCK, -(-n // SPLASH_MIN_BLOCK) * SPLASH_MIN_BLOCK)


def splash_arguments(mask: jax.Array, pattern: Pattern) -> dict[str, Any]:
  """The splash mask and segment ids of a factored mask.

  Args:
    mask: [B, T, S + T] bool == apply_pattern(pattern, key_valid).
    pattern: its static structure.

  Returns:
    {'array': [Tp, Sp] numpy bool (pattern padded to tile multiples: padded rows see every real
     key, padded keys none), 'kv_segments': [B, Sp] int32 (0 = valid key, 1 = invalid or
     padding), 'blocks': (block_q, block_kv), 'keys': Sp}.
  """
  t, keys = pattern.shape
  block_q, block_kv = _splash_block(t), _splash_block(keys)
  tp, sp = -(-t // block_q) * block_q, -(-keys // block_kv) * block_kv
  array = np.zeros((tp, sp), bool)
  array[:t, :keys] = pattern.mask()
  array[t:, :keys] = True
  key_valid = jnp.any(mask, axis=1)  # [B, S + T]: the row's valid keys (module docstring)
  segments = jnp.pad(jnp.where(key_valid, 0, 1), ((0, 0), (0, sp - keys)), constant_values=1)
  return {"array": array, "kv_segments": segments.astype(jnp.int32),
          "blocks": (block_q, block_kv), "keys": sp}


def _batch_shards(fn, batch: int):
  """fn under jax.shard_map over the batch axes ('data', 'fsdp') of the mesh in context.

  A Pallas kernel is one opaque custom call that XLA's SPMD partitioner would run replicated;
  per batch shard it sees only its rows. A no-op without such a mesh (or when B does not split).
  """
  mesh = jax.sharding.get_abstract_mesh()
  axes = sharding.batch_axes(mesh)
  if not axes or batch % int(np.prod([mesh.shape[a] for a in axes])):
    return fn
  spec = jax.sharding.PartitionSpec(axes)
  return jax.shard_map(fn, in_specs=spec, out_specs=spec, check_vma=False)


def _at_precision(fn, precision: str):
  """fn with its forward and its backward traced under jax.default_matmul_precision(precision).

  A context manager around a call covers its forward only: the backward of a custom_vjp (the
  splash kernel's) is traced later, when the caller's gradient is transposed. Here fn's vjp is
  taken inside the context and its backward called inside it again (jax.vjp's function is a
  pytree of residuals, so it is this custom_vjp's residual).
  """
  @jax.custom_vjp
  def wrapped(*args):
    with jax.default_matmul_precision(precision):
      return fn(*args)

  def forward(*args):
    with jax.default_matmul_precision(precision):
      return jax.vjp(fn, *args)

  def backward(vjp_fn, cotangent):
    with jax.default_matmul_precision(precision):
      return vjp_fn(cotangent)

  wrapped.defvjp(forward, backward)
  return wrapped


def splash(q: jax.Array, k: jax.Array, v: jax.Array, arguments: dict[str, Any]) -> jax.Array:
  """Pallas splash attention (GQA native: N query heads over K kv heads) with splash_arguments.

  Matmul precision: the kernel's dots take the default precision of the trace, and Mosaic
  rejects a bf16 dot at fp32 precision ("Bad lhs type", measured on the TPU v5e compiler under
  the tests' jax_default_matmul_precision='highest'). For bf16 / fp16 inputs the kernel is
  traced, forward and backward, at 'default' precision (`_at_precision`), the kernel as it runs
  on a TPU without a precision setting: its q.k, dO.v and dS.k dots take the bf16 operands in one
  pass with f32 accumulation (exact: a product of two bf16 numbers is exact in f32), its f32
  dots (probabilities x values) at the TPU's default one bf16 pass. fp32 inputs keep the
  precision in context (Mosaic compiles f32 dots at 'highest').

  Args:
    q: [B, T, N, H]; k, v: [B, Sp, K, H] (arguments['keys']); arguments: splash_arguments(...).

  Returns:
    [B, T, N, H] in q.dtype.
  """
  # Imported here: the TPU kernel's module is jax.experimental (0.6 s to import, its path may
  # move between jax releases); the reference and cuDNN paths do not need it.
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_kernel as splash_kernel,
  )
  from jax.experimental.pallas.ops.tpu.splash_attention import (
    splash_attention_mask as splash_mask,
  )

  b, t, n, h = q.shape
  array, segments = arguments["array"], arguments["kv_segments"]
  block_q, block_kv = arguments["blocks"]
  tp = array.shape[0]
  sizes = splash_kernel.BlockSizes(
    block_q=block_q, block_kv=block_kv, block_kv_compute=block_kv, block_q_dkv=block_q,
    block_kv_dkv=block_kv, block_kv_dkv_compute=block_kv, block_q_dq=block_q,
    block_kv_dq=block_kv)
  kernel = splash_kernel.make_splash_mha(
    splash_mask.MultiHeadMask([splash_mask.NumpyMask(array)] * n), block_sizes=sizes,
    head_shards=1, q_seq_shards=1, interpret=SPLASH_INTERPRET)
  q = q * jnp.asarray(h ** -0.5, q.dtype)
  q = jnp.pad(q, ((0, 0), (0, tp - t), (0, 0), (0, 0))).transpose(0, 2, 1, 3)  # [B, N, Tp, H]
  k, v = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, Sp, H]

  def run(q, k, v, segments):  # one batch shard: [b, N, Tp, H], [b, K, Sp, H] x 2, [b, Sp]
    ids = splash_kernel.SegmentIds(q=jnp.zeros(q.shape[::2][:2], jnp.int32), kv=segments)
    return jax.vmap(kernel)(q, k, v, segment_ids=ids)

  if q.dtype != jnp.float32:
    run = _at_precision(run, "default")
  out = _batch_shards(run, b)(q, k, v, segments)  # [B, N, Tp, H]
  return out[:, :, :t].transpose(0, 2, 1, 3)


# ---- dispatch ----------------------------------------------------------------------------------


def buffer_mask(mask: jax.Array, lengths: jax.Array) -> jax.Array:
  """A mask over [cache slots S | T new keys] as the mask over the cache buffer alone, once the T
  new keys are written into it at slots lengths[b] + arange(T) (qwen3._layer).

  Slot lengths[b] + j takes new key j's column; every other slot keeps its own (slots >= lengths
  are hidden by forward's contract). Written past the buffer, a new key is dropped with its write.

  Args:
    mask: [B, T, S + T] bool.
    lengths: [B] int, the cache lengths before the write.

  Returns:
    [B, T, S] bool.
  """
  b, t, width = mask.shape
  s = width - t
  j = jnp.arange(s, dtype=jnp.int32)[None, :] - lengths[:, None]  # [B, S]: new key j at slot s
  index = jnp.broadcast_to(jnp.clip(j, 0, t - 1)[:, None, :], (b, t, s))
  new = jnp.take_along_axis(mask[..., s:], index, axis=2)
  return jnp.where(((j >= 0) & (j < t))[:, None, :], new, mask[..., :s])


def prepare(config: ModelConfig, mask: jax.Array, pattern: Pattern | None,
            written_at: jax.Array | None = None) -> dict[str, Any]:
  """The kernel and its mask arguments, computed once per forward (shared by every layer).

  Args:
    config: the model (attention_impl, attention_chunk_bytes).
    mask: [B, T, S + T] bool.
    pattern: the mask's static structure (apply_pattern), or None for an arbitrary mask.
    written_at: [B] cache lengths of a forward that writes its T new K/V into the cache buffers at
      slots written_at + arange(T) before attending (qwen3._layer): the attention then reads the
      buffers alone, under `buffer_mask` (one score and one value dot over S slots per layer, no
      [cache | new] concatenation of keys or scores).

  Returns:
    {'impl': the kernel that runs, **its mask arguments}: a forward that writes and reads the
    cache runs the decode kernel on GPU ('decode', model/decode_attention.py; the reference for
    the shapes it does not support: decode_attention.supports) and the reference elsewhere;
    any other forward that reads cache slots (S > 0), and splash without a pattern,
    run the reference (module docstring).
  """
  impl = resolve_impl(config)
  if written_at is not None and impl == "cudnn":
    from gr2jax.model import decode_attention  # Pallas: imported by a GPU decode step only
    if decode_attention.supports(config.head_dim, mask.shape[-1] - mask.shape[1]):
      return {"impl": "decode", "mask": buffer_mask(mask, written_at)}
  if mask.shape[-1] != mask.shape[1]:  # reads cache slots
    impl = "reference"
  if impl == "cudnn":
    return {"impl": impl, **cudnn_arguments(mask, pattern)}
  if impl == "splash" and pattern is not None:
    return {"impl": impl, **splash_arguments(mask, pattern)}
  shape = None if pattern is None or not STRUCTURED_TWO_STREAM else two_stream_of(pattern)
  if shape is not None:
    return {"impl": "two_stream", "shape": shape, **two_stream_masks(mask, shape),
            "chunk_bytes": score_chunk_bytes(config)}
  if written_at is not None:
    mask = buffer_mask(mask, written_at)
  return {"impl": "reference", "mask": mask, "chunk_bytes": score_chunk_bytes(config),
          "new_keys": written_at is None}


def attend(q: jax.Array, k: jax.Array, v: jax.Array, k_cache: jax.Array | None,
           v_cache: jax.Array | None, prepared: dict[str, Any]) -> jax.Array:
  """GQA attention of T queries over [cache slots | new keys] by the prepared kernel.

  Args:
    q: [B, T, N, H] queries (after norm + RoPE).
    k, v: [B, T, K, H] keys / values of the new tokens (not read when `prepare` was given
      written_at: the buffers hold them).
    k_cache, v_cache: [B*K, H, S] cached keys, [B*K, S, H] values, or None (S = 0; a kernel
      runs only then).
    prepared: prepare(config, mask, pattern[, written_at]).

  Returns:
    [B, T, N, H] in q.dtype.
  """
  impl = prepared["impl"]
  if impl == "decode":
    from gr2jax.model import decode_attention
    return decode_attention.decode_attention(q, k_cache, v_cache, prepared["mask"])
  if impl == "two_stream":
    return two_stream(q, k, v, prepared["shape"], prepared)
  if impl == "reference":
    if not prepared["new_keys"]:
      k, v = k[:, :0], v[:, :0]
    return reference(q, k, v, k_cache, v_cache, prepared["mask"], prepared["chunk_bytes"])
  k, v = (_padded_keys(x, prepared["keys"]) for x in (k, v))
  out = (cudnn if impl == "cudnn" else splash)(q, k, v, prepared)
  return out.astype(q.dtype)
