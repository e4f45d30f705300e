"""The Qwen3 decoder as one pure function of (params, tokens, positions, mask, cache).

WORKSPACE.md "Forward" is the contract. Numerics follow HF `Qwen3ForCausalLM`: RMSNorm, softmax and
logits in fp32; q/k RMSNorm per head before RoPE (rotate-half); SwiGLU MLP. Layers are scanned
or looped (below).

Keys are `[cache slots S | the T new tokens]`; attention (the einsum reference or a kernel,
config.attention_impl) is gr2jax/model/attention.py. Stacked layer params ([L, ...], training) are
scanned; per-layer params (`params.layer_list`, the decoders) run as an unrolled loop, each layer
reading its own weight and cache buffers in place. The new K/V of each layer are written into its
cache buffer with one scatter at slots `lengths[b] + arange(T)` (in place when donated;
out-of-range writes are dropped, never clamped onto valid slots).
"""

from collections.abc import Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from gr2jax.model import attention, sharding, validate
from gr2jax.model import params as params_lib
from gr2jax.model.cache import KVCache
from gr2jax.model.config import ModelConfig
from gr2jax.model.masks import padding_mask

F32 = jnp.float32


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
  """RMSNorm over the last axis, computed in fp32 and cast back to x's dtype.

  Args:
    x: [..., E] activations.
    scale: [E] learned scale.
    eps: added to the mean square.

  Returns:
    [..., E] in x.dtype.
  """
  x32 = x.astype(F32)
  normed = x32 * lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (normed * scale.astype(F32)).astype(x.dtype)


def apply_rope(x: jax.Array, positions: jax.Array, theta: float) -> jax.Array:
  """Rotary embedding, HF's rotate-half convention (first half of H paired with the second).

  Args:
    x: [B, T, N, H] queries or keys.
    positions: [B, T] int positions.
    theta: the RoPE base (config.rope_theta).

  Returns:
    [B, T, N, H] in x.dtype.
  """
  h = x.shape[-1]
  inv_freq = 1.0 / theta ** (jnp.arange(0, h, 2, dtype=F32) / h)  # [H/2]
  angles = positions.astype(F32)[:, :, None, None] * inv_freq  # [B, T, 1, H/2]
  cos, sin = jnp.cos(angles), jnp.sin(angles)
  x1, x2 = jnp.split(x.astype(F32), 2, axis=-1)
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def shard_activations(x: jax.Array) -> jax.Array:
  """The one activation-sharding constraint point: the residual stream [B, T, D] is split over
  the batch axes ('data', 'fsdp') of the mesh in context (jax.set_mesh), replicated over 'tp'.

  A no-op without a mesh in context (eager calls, decoding, single-device tests) or when the mesh
  has none of those axes, so the forward runs unchanged everywhere.
  """
  mesh = jax.sharding.get_abstract_mesh()
  batch_axes = sharding.batch_axes(mesh)
  if not batch_axes:
    return x
  size = int(np.prod([mesh.shape[a] for a in batch_axes]))
  if x.shape[0] % size:
    return x
  spec = jax.sharding.PartitionSpec(batch_axes, *([None] * (x.ndim - 1)))
  return jax.lax.with_sharding_constraint(x, spec)


def _layer(config: ModelConfig, x: jax.Array, positions: jax.Array, prepared: dict, p: dict,
           cache_kv: tuple[jax.Array, jax.Array] | None, read: bool,
           write_at: jax.Array | None):
  """One decoder layer: x [B, T, D] -> (x [B, T, D], cache_kv).

  cache_kv: this layer's (keys [B*K, H, S], values [B*K, S, H]) buffers, or None; `read`
  attends to them. With write_at ([B], cache.lengths) the new k, v are first written at slots
  write_at + arange(T) and the attention reads them there, in the written buffers alone
  (`prepared` holds attention.buffer_mask: the new tokens' mask columns moved to their slots).
  The old buffers' only reader is then the write, which XLA does in place; written after the
  reads instead, the in-place update would have no data dependency on them, and XLA copies both
  buffers of every layer on every step. And one score and one value dot over the S slots leave
  XLA nothing to concatenate: scored apart, the cache and the new keys were merged into one dot
  over a [cache | new] copy of the keys, and their scores concatenated, on every step
  (docs/results/memory_limit.md).
  """
  x = shard_activations(x)
  dt, eps = x.dtype, config.rms_norm_eps
  w = lambda name: p[name].astype(dt)
  q, k, v = _project_qkv(rms_norm(x, p["input_norm"], eps), p)
  q = apply_rope(rms_norm(q, p["q_norm"], eps), positions, config.rope_theta)
  k = apply_rope(rms_norm(k, p["k_norm"], eps), positions, config.rope_theta)
  if write_at is not None:
    cache_kv = (_write_cache(cache_kv[0], k, write_at, keys=True),
                _write_cache(cache_kv[1], v, write_at, keys=False))
  attn = attention.attend(q, k, v, *(cache_kv if read else (None, None)), prepared)
  heads = attn.shape[2] * attn.shape[3]  # [N, H] flattened: one contraction, o read in place
  x = x + jnp.einsum("BTE,ED->BTD", attn.reshape(*attn.shape[:2], heads),
                     w("o").reshape(heads, -1))
  h = rms_norm(x, p["post_attn_norm"], eps)
  gate = jnp.einsum("BTD,DF->BTF", h, w("gate"))
  up = jnp.einsum("BTD,DF->BTF", h, w("up"))
  x = x + jnp.einsum("BTF,FD->BTD", jax.nn.silu(gate) * up, w("down"))
  return x, cache_kv


def _project_qkv(h: jax.Array, p: dict) -> tuple[jax.Array, jax.Array, jax.Array]:
  """h [B, T, D] -> q [B, T, N, H], k and v [B, T, K, H] of one layer's params: one GEMM over the
  decoders' fused 'qkv' [D, K, G + 2, H] (params.fuse_qkv), three over the stored q, k, v."""
  w = lambda name: p[name].astype(h.dtype)
  if "qkv" in p:
    qkv = jnp.einsum("BTD,DKGH->BTKGH", h, w("qkv"))
    b, t, kv_heads, g, head_dim = qkv.shape
    q = qkv[:, :, :, :g - 2].reshape(b, t, kv_heads * (g - 2), head_dim)
    return q, qkv[:, :, :, g - 2], qkv[:, :, :, g - 1]
  return (jnp.einsum("BTD,DNH->BTNH", h, w("q")), jnp.einsum("BTD,DKH->BTKH", h, w("k")),
          jnp.einsum("BTD,DKH->BTKH", h, w("v")))


def _write_cache(buf: jax.Array, new: jax.Array, lengths: jax.Array, keys: bool) -> jax.Array:
  """Writes one layer's new [B, T, K, H] into its buf at slots lengths[b] + arange(T): the keys'
  [B*K, H, S] (keys=True) or the values' [B*K, S, H] (model/cache.py).

  One scatter whose batching dimension is the buffer row (vmapped over B*K, the leading
  dimension): XLA's SPMD partitioner splits it along the rows, so a cache sharded over B stays
  sharded (a scatter indexed by (row, slot) pairs is replicated: docs/plan_qwen3_8b.md finding
  5), and XLA scatters into the donated buffer in place.
  """
  b, t, k, h = new.shape
  new = new.transpose(0, 2, 3, 1) if keys else new.transpose(0, 2, 1, 3)  # [B, K, H|T, T|H]
  new = new.reshape(b * k, *new.shape[2:])
  slots = jnp.repeat(lengths, k)[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B*K, T]

  def write(buf_row, new_row, slots_row):  # [H, S] | [S, H], [H, T] | [T, H], [T]
    at = buf_row.at[:, slots_row] if keys else buf_row.at[slots_row]
    return at.set(new_row.astype(buf_row.dtype), indices_are_sorted=True, unique_indices=True)

  return jax.vmap(write)(buf, new, slots)


def _check_tokens(where: str, params: dict, config: ModelConfig, tokens) -> jax.Array:
  """tokens as an int32 [B, T] array; B, T >= 1, ids in [0, V) (values when concrete)."""
  tokens = validate.integer_array(where, "tokens", tokens, ndim=2)
  validate.check_range(where, "tokens", tokens, 0, config.vocab_size, "the vocab")
  embed = params.get("embed") if isinstance(params, Mapping) else None
  if embed is None:
    raise TypeError(f"{where}: params must be the param dict (gr2jax.model.params), got "
                    f"{type(params).__name__}")
  validate.check_shape(where, "params['embed']", embed,
                       shape=(config.vocab_size, config.hidden_size))
  return jnp.asarray(tokens, jnp.int32)  # checked: one dtype downstream (uint8 / int64 / lists)


def _check_cache(where: str, config: ModelConfig, cache, b: int, t: int,
                 update_cache: bool) -> None:
  """Shapes of a KVCache for B rows; 0 <= lengths <= S, and no overflow when writing T."""
  if not isinstance(cache, KVCache):
    raise TypeError(f"{where}: cache must be a KVCache (gr2jax.model.cache.init_cache), got "
                    f"{type(cache).__name__}")
  rows, s, h = b * config.num_kv_heads, cache.max_len, config.head_dim
  for name in ("k", "v"):
    layers = getattr(cache, name)
    if not isinstance(layers, tuple) or len(layers) != config.num_layers:
      raise ValueError(f"{where}: cache.{name} must be a tuple of num_layers="
                       f"{config.num_layers} arrays (init_cache), got "
                       f"{len(layers) if isinstance(layers, tuple) else type(layers).__name__}")
    for i, x in enumerate(layers):
      validate.check_shape(where, f"cache.{name}[{i}]", x,
                           shape=(rows, h, s) if name == "k" else (rows, s, h))
  validate.integer_array(where, "cache.lengths", cache.lengths, shape=(b,))
  validate.check_range(where, "cache.lengths", cache.lengths, 0, cache.max_len + 1)
  length_range = validate.concrete_range(cache.lengths) if update_cache else None
  if length_range and length_range[1] + t > cache.max_len:
    raise ValueError(f"{where}: writing T={t} tokens after cache.lengths max "
                     f"{length_range[1]} overflows the cache of {cache.max_len} slots")


class Mask(NamedTuple):
  """A forward's attention mask with its static structure.

  Attributes:
    values: [B, T, S + T] bool over keys [cache slots | new tokens].
    pattern: the static structure of `values` (values == attention.apply_pattern(pattern,
      key_valid)); the kernels need it (attention.py), the reference ignores it.
  """

  values: jax.Array
  pattern: attention.Pattern | None = None


def forward(params: dict, config: ModelConfig, tokens: jax.Array,
            positions: jax.Array | None = None, mask: jax.Array | Mask | None = None,
            cache: KVCache | None = None, *, update_cache: bool = False,
            logits_at: jax.Array | None = None):
  """The Qwen3 forward pass (WORKSPACE.md "Forward").

  Args:
    params: the param pytree (gr2jax.model.params).
    config: the model (static under jit).
    tokens: [B, T] int token ids.
    positions: [B, T] int positions; default arange(T), after `cache.lengths` when a cache is given.
    mask: [B, T, S + T] bool over keys [cache slots | new tokens] (S = 0 without a cache), or a
      Mask (those values with their static pattern, which the kernels need); default the valid
      cache slots plus causal over the new tokens in slot order (attention.causal_pattern;
      causal by position for increasing positions). Cache slots >= cache.lengths must be hidden
      (they hold stale keys, or with update_cache the new ones).
    cache: optional KVCache read by every layer.
    update_cache: write the T new K/V at slots `cache.lengths + arange(T)` and return the cache
      with `lengths + T`; otherwise the input cache is returned untouched.
    logits_at: optional [B, Kq] int32 query indices; the LM head runs only there.

  Returns:
    (logits f32 [B, T or Kq, V], cache).

  Raises:
    TypeError / ValueError naming the argument (gr2jax.model.validate): a non-integer, wrongly
      shaped or empty `tokens` / `positions` / `logits_at`, a non-bool or wrongly shaped `mask`,
      a cache of the wrong shape; when the values are concrete also ids outside [0, V),
      `logits_at` outside [0, T), cache.lengths outside [0, S] or a write past the cache.
      Under jit only the static checks run: the caller must feed ids in [0, V) (an id >= V gives
      NaN logits, a negative id wraps around); `generate` and `block_diffusion_generate` check
      their inputs before tracing.
  """
  return _forward(params, config, tokens, positions, mask, cache, update_cache=update_cache,
                  logits_at=logits_at)


def hidden_states(params: dict, config: ModelConfig, tokens: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
  """`forward` over `tokens` (causal, no cache) with its residual stream, what the HF parity
  tests compare layer by layer.

  Returns:
    (logits f32 [B, T, V], hidden [L + 1, B, T, D]: before the final norm, index 0 = the
    embeddings, i = after layer i).
  """
  logits, _, hidden = _forward(params, config, tokens, return_hidden=True)
  return logits, hidden


def _forward(params: dict, config: ModelConfig, tokens: jax.Array,
             positions: jax.Array | None = None, mask: jax.Array | Mask | None = None,
             cache: KVCache | None = None, *, update_cache: bool = False,
             logits_at: jax.Array | None = None, return_hidden: bool = False,
             read_cache: bool = True):
  """`forward` with two expert options (ragged_prefill's and hidden_states').

  Args:
    params, config, tokens, positions, mask, cache, update_cache, logits_at: as `forward`.
    return_hidden: also return the residual stream before the final norm, [L + 1, B, T, D]
      (index 0 = embeddings, i = after layer i), for parity debugging.
    read_cache: False skips attending to the cache slots (keys are the T new tokens only, the
      mask is [B, T, T]): exact, and about half the work, when prefilling an empty cache.

  Returns:
    `forward`'s (logits, cache), plus hidden [L + 1, B, T, D] when return_hidden.
  """
  mask, mask_pattern = mask if isinstance(mask, Mask) else (mask, None)
  tokens = _check_tokens("forward", params, config, tokens)
  b, t = tokens.shape
  s = 0 if cache is None or not read_cache else cache.max_len
  if update_cache and cache is None:
    raise ValueError("forward: update_cache=True needs a cache")
  if cache is not None:
    _check_cache("forward", config, cache, b, t, update_cache)
  if positions is None:
    positions = jnp.arange(t, dtype=jnp.int32)[None, :]
    positions = positions + (0 if cache is None else cache.lengths[:, None])
    positions = jnp.broadcast_to(positions, (b, t))
  positions = validate.integer_array("forward", "positions", positions, shape=(b, t))
  if mask is None:
    mask_pattern = attention.causal_pattern(t, s, key_padding=s > 0)
    key_valid = jnp.ones((b, t), bool)
    if s:
      key_valid = jnp.concatenate([padding_mask(cache.lengths, s), key_valid], axis=1)
    mask = attention.apply_pattern(mask_pattern, key_valid)
  mask = validate.bool_array("forward", "mask", mask, shape=(b, t, s + t))
  if mask_pattern is not None and mask_pattern.shape != (t, s + t):
    raise ValueError(f"forward: mask_pattern is {mask_pattern.shape}, the mask needs "
                     f"{(t, s + t)}")
  if logits_at is not None:
    logits_at = validate.integer_array("forward", "logits_at", logits_at, shape=(b, None))
    validate.check_range("forward", "logits_at", logits_at, 0, t)

  x = jnp.take(params["embed"], tokens, axis=0).astype(config.compute_dtype)  # [B, T, D]
  write_at = cache.lengths if update_cache else None
  # The kernel's mask, once per forward; a forward that writes and reads the cache attends over
  # the written buffers alone (_layer).
  prepared = attention.prepare(config, mask, mask_pattern, write_at if s > 0 else None)

  def body(x, layer):
    p, cache_kv = layer
    x, cache_kv = _layer(config, x, positions, prepared, p, cache_kv, s > 0, write_at)
    return x, (cache_kv, x if return_hidden else None)

  if config.remat == "full":
    body = jax.checkpoint(body, prevent_cse=False)  # recompute each layer in the backward pass

  if cache is None and not isinstance(params["layers"], tuple):
    x_out, (_, hidden) = lax.scan(body, x, (params["layers"], None))
  else:  # per-layer buffers (module docstring); stacked params are sliced here, once per call
    hidden, written = [], []
    for i, p in enumerate(params_lib.layer_list(params)["layers"]):
      x, (cache_kv, h) = body(x, (p, None if cache is None else (cache.k[i], cache.v[i])))
      hidden.append(h)
      written.append(cache_kv)
    x_out, hidden = x, jnp.stack(hidden) if return_hidden else None
    if update_cache:
      k, v = zip(*written, strict=True)
      cache = KVCache(k=k, v=v, lengths=cache.lengths + t)

  h = rms_norm(x_out, params["final_norm"], config.rms_norm_eps)
  if logits_at is not None:
    h = jnp.take_along_axis(h, jnp.asarray(logits_at, jnp.int32)[:, :, None], axis=1)
  # bf16 inputs, f32 accumulation and logits, also named as the dot's algorithm: without it XLA
  # GPU's cuBLAS path upcasts a 1-row LM head's weight to f32 on every decode step (a [D, V] f32
  # copy, 2.5 GB at 8B; docs/results/memory_limit.md). The same numbers on every backend.
  precision = lax.DotAlgorithmPreset.BF16_BF16_F32 if h.dtype == jnp.bfloat16 else None
  if config.tie_word_embeddings:
    logits = jnp.einsum("BTD,VD->BTV", h, params["embed"].astype(h.dtype),
                        preferred_element_type=F32, precision=precision)
  else:
    logits = jnp.einsum("BTD,DV->BTV", h, params["lm_head"].astype(h.dtype),
                        preferred_element_type=F32, precision=precision)
  if return_hidden:
    return logits, cache, jnp.concatenate([x[None], hidden], axis=0)
  return logits, cache


def ragged_prefill(params: dict, config: ModelConfig, tokens: jax.Array, lengths: jax.Array,
                   cache: KVCache, *, read_cache: bool = True):
  """Appends right-padded prompts to a cache and returns the logits after each real last token.

  All T tokens (padding included) are written at slots `cache.lengths + arange(T)`, then the
  lengths advance by `lengths` only: padding slots are invalid and the next write overwrites them.

  Args:
    params: the param pytree.
    config: the model.
    tokens: [B, T] right-padded prompts.
    lengths: [B] int, real tokens per prompt, each >= 1.
    cache: a cache with room for T more tokens (usually fresh from init_cache).
    read_cache: False when the cache is empty (fresh): the prompts then attend only to themselves,
      skipping the S empty slots (about half the prefill's attention work).

  Returns:
    (logits f32 [B, V] at token lengths[b] - 1, the cache with lengths advanced by `lengths`).

  Raises:
    TypeError / ValueError naming the argument, as `forward`; also `lengths` not [B] integers in
      1..T (when concrete) and a cache without room for T tokens.
  """
  tokens = _check_tokens("ragged_prefill", params, config, tokens)
  b, t = tokens.shape
  lengths = validate.integer_array("ragged_prefill", "lengths", lengths, shape=(b,))
  validate.check_range("ragged_prefill", "lengths", lengths, 1, t + 1)
  _check_cache("ragged_prefill", config, cache, b, t, True)
  lengths = jnp.asarray(lengths, jnp.int32)
  logits, new_cache = _forward(params, config, tokens, cache=cache, update_cache=True,
                               logits_at=(lengths - 1)[:, None], read_cache=read_cache)
  return logits[:, 0], new_cache.replace(lengths=cache.lengths + lengths)
