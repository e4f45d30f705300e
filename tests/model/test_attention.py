"""Attention kernels == the einsum reference (outputs and gradients, fp32, atol 1e-5) for every
mask the library builds; the reference's query chunking is exact for any mask.

On CPU the cuDNN path runs `jax.nn.dot_product_attention(implementation='xla')` with the same
kernel arguments (`attention.cudnn_arguments`), and splash runs in Pallas interpret mode.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from gr2jax import exports
from gr2jax.diffusion import decode, layout, replay
from gr2jax.diffusion.decode import NEVER_STEP, SEED_STEP
from gr2jax.model import attention, decode_attention, masks, qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params

ATOL = 1e-5
KERNELS = ("cudnn", "splash")
B, N, K, H = 2, 4, 2, 8
MASK_ID, BLOCK = 63, 4
DIFFUSION = ModelConfig.tiny(vocab_size=64, num_layers=1, block_size=BLOCK,
                             mask_token_id=MASK_ID)
PROMPTS = np.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], np.int32)
PROMPT_LENGTHS = np.array([5, 3], np.int32)
RESPONSES = np.array([[20, 21, 22, 23, 24, 25, 26, 27], [40, 41, 42, 43, 44, 45, 0, 0]], np.int32)
RESPONSE_LENGTHS = np.array([8, 6], np.int32)
COMMIT_STEP = np.array([[SEED_STEP, 1, 0, 2, SEED_STEP, 0, 1, NEVER_STEP],
                        [SEED_STEP, 0, 0, 1, SEED_STEP, 2, 1, 0]], np.int32)


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch):
  monkeypatch.setattr(attention, "CUDNN_IMPLEMENTATION", "xla")
  monkeypatch.setattr(attention, "SPLASH_INTERPRET", True)
  monkeypatch.setattr(decode_attention, "DECODE_INTERPRET", True)  # the 'cudnn' decode steps


def _causal_prefill():
  t = 10
  return 0, attention.apply_pattern(attention.causal_pattern(t, key_padding=False),
                                    jnp.ones((B, t), bool)), \
    attention.causal_pattern(t, key_padding=False)


def _ragged_prefill():
  """Right-padded prompts appended after a partly filled cache (ragged_prefill's mask)."""
  t, s = 7, 6
  lengths = jnp.array([4, 0], jnp.int32)
  pattern = attention.causal_pattern(t, s)
  valid = jnp.concatenate([masks.padding_mask(lengths, s), jnp.ones((B, t), bool)], axis=1)
  want = masks.decode_mask(lengths, s, lengths[:, None] + jnp.arange(t)[None, :])
  np.testing.assert_array_equal(attention.apply_pattern(pattern, valid), want)
  return s, want, pattern


def _ar_rl_sequence():
  """[right-padded prompt | response]: causal over valid keys (the causal scorer of SFT, AR RL
  and the OPD teacher: train/policy.causal_log_probs, a two-stream layout with no noisy stream)."""
  b, r = RESPONSES.shape
  inputs = jax.jit(layout.two_stream_inputs, static_argnums=0)(
    ModelConfig.tiny(), PROMPTS, PROMPT_LENGTHS, RESPONSES, RESPONSE_LENGTHS,
    np.zeros((b, 0, r), bool))
  p = PROMPTS.shape[1]
  valid = jnp.concatenate([masks.padding_mask(PROMPT_LENGTHS, p),
                           masks.padding_mask(RESPONSE_LENGTHS, r)], axis=1)
  by_position = masks.make_attention_mask(inputs.positions, inputs.positions, valid,
                                          PROMPT_LENGTHS, 1)
  real = jnp.concatenate([valid[:, :p], jnp.ones((B, r), bool)], axis=1)[:, :, None]
  np.testing.assert_array_equal(inputs.mask & real, by_position & real)  # rows a prediction reads
  return 0, inputs.mask, inputs.pattern


def _block_decode():
  """A cached block-diffusion step: the block after the prompt (row 0) / one block (row 1)."""
  s = 12
  lengths = jnp.asarray(PROMPT_LENGTHS) + jnp.array([0, BLOCK])
  positions = lengths[:, None] + jnp.arange(BLOCK)[None, :]
  want = masks.decode_mask(lengths, s, positions, PROMPT_LENGTHS, BLOCK)
  pattern = attention.block_pattern(BLOCK, s)
  valid = jnp.concatenate([masks.padding_mask(lengths, s), jnp.ones((B, BLOCK), bool)], axis=1)
  np.testing.assert_array_equal(attention.apply_pattern(pattern, valid), want)
  return s, want, pattern


def _cft_two_stream():
  noisy = np.random.default_rng(5).random((B, 1, RESPONSES.shape[1])) < 0.5
  noisy = np.concatenate([noisy, ~noisy], axis=1)  # the complementary pair
  inputs = jax.jit(layout.two_stream_inputs, static_argnums=0)(
    DIFFUSION, PROMPTS, PROMPT_LENGTHS, RESPONSES, RESPONSE_LENGTHS, noisy)
  return 0, inputs.mask, inputs.pattern


def _packed_replay():
  inputs = jax.jit(replay.replay_inputs, static_argnums=0, static_argnames="rounds")(
    DIFFUSION, PROMPTS, PROMPT_LENGTHS, RESPONSES, COMMIT_STEP, RESPONSE_LENGTHS,
    rounds=(0, 1, 2))
  return 0, inputs.mask, inputs.pattern


MASKS = {"causal_prefill": _causal_prefill, "ragged_prompt_response": _ar_rl_sequence,
         "cft_two_stream": _cft_two_stream, "packed_replay": _packed_replay}  # cache-free
CACHED_MASKS = {"ragged_prefill": _ragged_prefill, "block_decode": _block_decode}


def _inputs(t: int):
  rng = np.random.default_rng(t)  # numpy: eager jax.random compiles per shape (seconds)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  return normal(B, t, N, H), [normal(B, t, K, H) for _ in range(2)], normal(B, t, N, H)


def _run(impl, mask, pattern, q, new, weights, chunk_bytes=0):
  config = ModelConfig.tiny(attention_impl=impl, attention_chunk_bytes=chunk_bytes)

  def loss(q, k, v):
    out = attention.attend(q, k, v, None, None, attention.prepare(config, mask, pattern))
    return jnp.sum(out * weights), out

  grad = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)
  (_, out), grads = jax.jit(grad)(q, *new)
  return out, grads


@pytest.mark.parametrize("kind", sorted(MASKS))
def test_kernels_equal_the_reference(kind):
  """Every cache-free mask kind: output and d/d(q, k, v) of each kernel == reference."""
  _, mask, pattern = MASKS[kind]()
  assert jnp.all(jnp.any(mask, axis=-1)), "every row sees a key"
  np.testing.assert_array_equal(
    attention.apply_pattern(pattern, jnp.any(mask, axis=1)), mask)  # the factored form
  args = _inputs(mask.shape[1])
  want, want_grads = _run("reference", mask, pattern, *args)
  for impl in KERNELS:
    got, got_grads = _run(impl, mask, pattern, *args)
    np.testing.assert_allclose(got, want, atol=ATOL, err_msg=impl)
    jax.tree.map(lambda x, y, impl=impl: np.testing.assert_allclose(x, y, atol=ATOL,
                                                                    err_msg=impl),
                 got_grads, want_grads)


@pytest.mark.parametrize("kind", sorted(CACHED_MASKS))
def test_a_forward_that_reads_a_cache_runs_the_reference(kind):
  """Whatever the kernel setting: the einsums read the cache in place (attention.py); the
  reference itself is checked against the cache-free forward in test_qwen3 / test_decode."""
  _, mask, pattern = CACHED_MASKS[kind]()
  for impl in KERNELS:
    assert attention.prepare(ModelConfig.tiny(attention_impl=impl), mask, pattern)["impl"] == \
      "reference", impl


def test_kernel_arguments():
  """cuDNN: CAUSAL without a tensor only for unpadded causal; splash: padded tiles + segments."""
  _, mask, pattern = _causal_prefill()
  assert attention.cudnn_arguments(mask, pattern) == {"is_causal": True, "mask": None,
                                                      "keys": 10}
  padded = attention.causal_pattern(10)
  assert attention.cudnn_arguments(mask, padded)["mask"].shape == (B, 1, 10, 10)
  _, mask, _ = _block_decode()  # T = 4 queries over 12 + 4 keys: even
  assert attention.cudnn_arguments(mask, None)["mask"].shape == (B, 1, 4, 16)
  odd = attention.cudnn_arguments(mask[:, :3, :15], None)  # padded to even, masked
  assert odd["mask"].shape == (B, 1, 4, 16) and odd["keys"] == 16
  assert not odd["mask"][:, :, :, 15].any() and odd["mask"][:, 0, 3, 0].all()
  _, mask, pattern = _cft_two_stream()
  args = attention.splash_arguments(mask, pattern)
  n = mask.shape[1]
  assert args["array"].shape == (128, 128) and args["blocks"] == (128, 128)
  np.testing.assert_array_equal(args["array"][:n, :n], pattern.mask())
  assert args["array"][n:, :n].all() and not args["array"][:, n:].any()
  np.testing.assert_array_equal(args["kv_segments"][:, :n] == 0, jnp.any(mask, axis=1))
  assert (args["kv_segments"][:, n:] == 1).all()
  # A mask without a static pattern runs the reference on splash (documented fallback).
  config = ModelConfig.tiny(attention_impl="splash")
  assert attention.prepare(config, mask, None)["impl"] == "reference"


def test_resolve_impl_and_config():
  assert attention.resolve_impl(ModelConfig.tiny()) == "reference"
  assert attention.resolve_impl(ModelConfig.tiny(attention_impl="auto")) == "reference"  # CPU
  assert attention.resolve_impl(ModelConfig.tiny(attention_impl="splash")) == "splash"
  with pytest.raises(ValueError, match="attention_impl"):
    ModelConfig.tiny(attention_impl="flash")
  assert "attention_impl" not in str(ModelConfig.tiny(attention_impl="cudnn").to_hf_dict())
  pattern = attention.causal_pattern(4)
  assert pattern == attention.causal_pattern(4) and hash(pattern) == hash(
    attention.causal_pattern(4))
  assert pattern != attention.causal_pattern(4, key_padding=False)
  assert attention.causal_pattern(4, key_padding=False).is_causal
  assert not attention.block_pattern(4, 2).is_causal
  assert not attention.causal_pattern(4, 1).is_causal
  np.testing.assert_array_equal(attention.causal_pattern(3, 2).mask(),
                                np.concatenate([np.ones((3, 2), bool), np.tri(3, dtype=bool)], 1))
  assert attention.block_pattern(2, 3).mask().all()
  config = ModelConfig.tiny(attention_impl="splash")
  assert exports.config_from_dict(exports.config_to_dict(config)) == config
  old = {k: v for k, v in exports.config_to_dict(config).items() if k != "attention_impl"}
  assert exports.config_from_dict(old).attention_impl == "reference"  # older checkpoints


def test_splash_runs_per_batch_shard():
  """Under a mesh with a batch axis the kernel runs in jax.shard_map: rows stay sharded."""
  _, mask, pattern = _ar_rl_sequence()
  q, (k, v), _ = _inputs(mask.shape[1])
  config = ModelConfig.tiny(attention_impl="splash")
  want = attention.attend(q, k, v, None, None, attention.prepare(ModelConfig.tiny(), mask, None))
  mesh = jax.make_mesh((2,), ("fsdp",), axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:2])
  with jax.set_mesh(mesh):
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("fsdp"))
    got = jax.jit(lambda q, k, v: attention.attend(
      q, k, v, None, None, attention.prepare(config, mask, pattern)))(
        *(jax.device_put(x, rows) for x in (q, k, v)))
  assert got.sharding.spec == jax.sharding.PartitionSpec("fsdp")
  np.testing.assert_allclose(got, want, atol=ATOL)


def test_cudnn_refuses_float32_on_the_real_kernel(monkeypatch):
  monkeypatch.setattr(attention, "CUDNN_IMPLEMENTATION", "cudnn")
  _, mask, pattern = _causal_prefill()
  q, new, _ = _inputs(10)
  with pytest.raises(ValueError, match="compute_dtype"):
    attention.cudnn(q, *new, attention.cudnn_arguments(mask, pattern))


# ---- the two-stream layout: per noisy block on the reference path -----------------------------


@pytest.mark.parametrize("block_size", [1, 4, 32])
@pytest.mark.parametrize("streams", [0, 1, 2, 7])
def test_two_stream_path_equals_the_dense_reference(monkeypatch, streams, block_size):
  """The reference path of a two-stream layout (attention.two_stream) == the dense mask, output
  and d/d(q, k, v), ragged prompts and responses, in one chunk and in padded chunks of noisy
  blocks; K = 0 (the causal scorer) keeps the dense path; the kernels keep theirs."""
  config = ModelConfig.tiny(block_size=block_size, mask_token_id=MASK_ID)
  m = 10
  r = layout.padded_width(m, block_size)
  noisy = np.random.default_rng(streams).random((B, streams, m)) < 0.5
  inputs = jax.jit(layout.two_stream_inputs, static_argnums=0)(
    config, PROMPTS, PROMPT_LENGTHS, RESPONSES[:, :1].repeat(m, 1),
    np.array([10, 3], np.int32), noisy)
  shape = attention.two_stream_of(inputs.pattern)
  prepared = attention.prepare(ModelConfig.tiny(), inputs.mask, inputs.pattern)
  if streams:
    assert shape == attention.TwoStream(PROMPTS.shape[1], r, streams, block_size)
    assert prepared["impl"] == "two_stream"
    assert shape.base == PROMPTS.shape[1] + r and shape.noisy_blocks == streams * r // block_size
  else:
    assert shape is None and prepared["impl"] == "reference"
  for impl in KERNELS:
    assert attention.prepare(ModelConfig.tiny(attention_impl=impl), inputs.mask,
                             inputs.pattern)["impl"] == impl
  args = _inputs(inputs.mask.shape[1])
  # 4 noisy blocks' scores per chunk: Q = 70, 21, 7 blocks run in padded chunks.
  per_block = B * N * block_size * (PROMPTS.shape[1] + r + block_size) * 4
  for chunk_bytes in (0, 4 * per_block):
    got, got_grads = _run("reference", inputs.mask, inputs.pattern, *args, chunk_bytes)
    monkeypatch.setattr(attention, "STRUCTURED_TWO_STREAM", False)
    want, want_grads = _run("reference", inputs.mask, inputs.pattern, *args, chunk_bytes)
    monkeypatch.setattr(attention, "STRUCTURED_TWO_STREAM", True)
    np.testing.assert_allclose(got, want, atol=ATOL)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=ATOL), got_grads,
                 want_grads)


def test_two_stream_of_recognises_only_the_layout():
  """A pattern is run per noisy block only when it is exactly a TwoStream's pattern."""
  shape = attention.TwoStream(3, 8, 2, 4)
  pattern = shape.pattern()
  assert attention.two_stream_of(pattern) == shape
  assert attention.two_stream_of(attention.TwoStream(3, 8, 0, 4).pattern()) is None  # K = 0
  assert attention.two_stream_of(attention.causal_pattern(5)) is None
  assert attention.two_stream_of(attention.block_pattern(4, 3)) is None  # reads a cache
  other = list(pattern.q_block)
  other[-1] -= 1  # the last noisy slot in the block before its own
  assert attention.two_stream_of(dataclasses.replace(pattern, q_block=other,
                                                     k_block=other)) is None
  ids = np.asarray(pattern.q_stream)
  swapped = np.where(ids == 1, 2, np.where(ids == 2, 1, ids))  # the same rule, renumbered:
  assert attention.two_stream_of(dataclasses.replace(pattern, q_stream=swapped,
                                                     k_stream=swapped)) is None  # dense path


# ---- the whole forward on a tiny model --------------------------------------------------------

PARAMS = jax.jit(init_params, static_argnums=0)(DIFFUSION, jax.random.key(0))


def _forward_outputs(config, params):
  """A causal LM forward and a two-stream CFT score (differentiated), a cached block step (not)."""
  logits, _ = qwen3.forward(params, config, jnp.asarray(RESPONSES))  # the default causal mask
  noisy = jnp.arange(RESPONSES.shape[1])[None, None, :] % 3 == 1
  inputs = layout.two_stream_inputs(config, PROMPTS, PROMPT_LENGTHS, RESPONSES,
                                    RESPONSE_LENGTHS, jnp.broadcast_to(noisy, (B, 1, 8)))
  queries = layout.prediction_queries(jnp.zeros((B, 8), jnp.int32).at[:, 0].set(-1),
                                      PROMPT_LENGTHS, PROMPTS.shape[1], 8)
  scored, _ = layout.score(params, config, inputs, queries, RESPONSES)
  cache = init_cache(config, B, 16)
  cache = cache.replace(k=tuple(jax.random.normal(jax.random.key(2 + i), x.shape)  # traced: cheap
                              for i, x in enumerate(cache.k)),
                        v=tuple(jax.random.normal(jax.random.key(9 + i), x.shape)
                              for i, x in enumerate(cache.v)),
                        lengths=jnp.asarray(PROMPT_LENGTHS))  # a prefilled prompt
  block, _ = decode.block_forward(jax.lax.stop_gradient(params), config, cache,
                                  jnp.full((B, BLOCK), MASK_ID), PROMPT_LENGTHS)
  return jnp.mean(scored) + jnp.mean(jax.nn.log_softmax(logits)[..., 3]), (logits, scored, block)


_FORWARD = jax.jit(jax.value_and_grad(_forward_outputs, argnums=1, has_aux=True),
                   static_argnums=0)


@pytest.mark.integration
@pytest.mark.parametrize("impl", KERNELS)
def test_forward_with_each_kernel_equals_the_reference(impl):
  """qwen3.forward with each kernel: causal logits and two-stream log-probs with their
  d/dparams, and the logits of a cached block step, == the reference forward."""
  (_, want), want_grads = _FORWARD(DIFFUSION, PARAMS)
  (_, got), got_grads = _FORWARD(dataclasses.replace(DIFFUSION, attention_impl=impl), PARAMS)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=ATOL), got, want)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=ATOL), got_grads, want_grads)


@pytest.mark.parametrize("structured", [True, False])
def test_a_noisy_block_sees_no_other_stream_and_no_later_clean_block(monkeypatch, structured):
  """Leak test of the two-stream forward (per noisy block, and the dense mask): new tokens in
  noisy stream 2, in a clean block, or in block 1 of noisy stream 0 leave the logits of every
  other stream, of the noisy blocks not after that clean block, and of block 0 of stream 0
  unchanged (and do change the queries that see them)."""
  monkeypatch.setattr(attention, "STRUCTURED_TWO_STREAM", structured)
  streams, r, p = 3, RESPONSES.shape[1], PROMPTS.shape[1]
  noisy = np.random.default_rng(1).random((B, streams, r)) < 0.5
  inputs = layout.two_stream_inputs(DIFFUSION, PROMPTS, PROMPT_LENGTHS, RESPONSES,
                                    RESPONSE_LENGTHS, noisy)
  forward = jax.jit(lambda tokens: qwen3.forward(
    PARAMS, DIFFUSION, tokens, inputs.positions, qwen3.Mask(inputs.mask, inputs.pattern))[0])
  base = forward(inputs.tokens)
  noisy_slot = lambda k, j: p + (1 + k) * r + j  # stream k (0-based), response index j

  def changed(slots):
    tokens = inputs.tokens.at[:, np.asarray(slots)].set((inputs.tokens[:, slots] + 7) % MASK_ID)
    return np.abs(np.asarray(forward(tokens) - base)).max(axis=(0, 2)) > 1e-6  # [T]

  block0 = np.concatenate([[noisy_slot(k, j) for j in range(BLOCK)] for k in range(streams)])
  other_streams = np.arange(noisy_slot(2, 0))
  moved = changed([noisy_slot(2, j) for j in range(r)])  # stream 2
  assert not moved[other_streams].any() and moved[noisy_slot(2, 0):].all()
  moved = changed(p + np.arange(BLOCK))  # clean block 0: seen by the noisy blocks 1 only
  assert not moved[:p].any() and not moved[block0].any()
  assert moved[p] and moved[noisy_slot(0, BLOCK)] and moved[noisy_slot(2, BLOCK)]
  moved = changed(p + BLOCK + np.arange(BLOCK))  # clean block 1: by no noisy block
  assert not moved[:p + BLOCK].any() and not moved[p + r:].any() and moved[p + BLOCK]
  moved = changed([noisy_slot(0, BLOCK + j) for j in range(BLOCK)])  # stream 0, block 1
  assert not moved[:noisy_slot(0, BLOCK)].any() and not moved[noisy_slot(1, 0):].any()
  assert moved[noisy_slot(0, BLOCK):noisy_slot(0, r)].all()


# ---- the reference's query chunking ------------------------------------------------------------


@pytest.mark.parametrize("cached,causal,blank_row", [(False, False, 2), (True, False, 2),
                                                     (False, True, None), (True, True, 2)])
def test_query_chunked_attention_is_exact_for_any_mask(monkeypatch, cached, causal, blank_row):
  """Chunks of 4 queries (T = 10, padded to 12) equal one chunk, values and grads, any mask.

  Causal masks let the first two chunks skip later keys (lax.cond); a fully masked row (uniform
  softmax over all keys) must make its chunk score every key again.
  """
  b, t, s, n, k, h = 2, 10, 5, 4, 2, 8
  rng = np.random.default_rng(3)
  normal = lambda *shape: rng.standard_normal(shape).astype(np.float32)
  q = normal(b, t, n, h)
  kv = [normal(b, t, k, h) for _ in range(2)]
  cache_kv = [normal(b * k, h, s), normal(b * k, s, h)] if cached else [None, None]
  if causal:
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    mask = jnp.concatenate([jnp.ones((b, t, s), bool), mask], -1) if cached else mask
  else:
    mask = jnp.asarray(rng.random((b, t, (s if cached else 0) + t)) < 0.5)
  if blank_row is not None:
    mask = mask.at[0, blank_row].set(False)  # uniform softmax over all keys, no NaN

  def run(budget):  # traced afresh on each call: picks up the patched chunking constants
    def loss(q, k, v):
      out = attention.reference(q, k, v, *cache_kv, mask, budget)
      return jnp.sum(out * jnp.cos(out)), out

    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, *kv)

  (_, whole), whole_grads = run(1 << 40)
  monkeypatch.setattr(attention, "MIN_QUERY_CHUNK", 4)
  assert attention._query_chunk(b, n, mask.shape[-1], t, 1) == 4
  (_, chunked), chunked_grads = run(1)
  assert not np.any(np.isnan(chunked))
  np.testing.assert_allclose(chunked, whole, atol=1e-5)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), chunked_grads,
               whole_grads)


def _kernel_dots(jaxpr, inside: bool = False) -> list:
  """(precision, operand dtypes) of every dot_general inside a pallas_call of `jaxpr`."""
  found = []
  for eqn in jaxpr.eqns:
    if inside and eqn.primitive.name == "dot_general":
      found.append((eqn.params["precision"], tuple(str(x.aval.dtype) for x in eqn.invars)))
    for value in eqn.params.values():
      for sub in value if isinstance(value, tuple | list) else (value,):
        sub = getattr(sub, "jaxpr", sub)
        if hasattr(sub, "eqns"):
          found += _kernel_dots(sub, inside or eqn.primitive.name == "pallas_call")
  return found


def test_splash_bf16_kernel_traces_at_default_precision_under_highest():
  """conftest's 'highest' would give the kernel's bf16 dots fp32 precision, which Mosaic rejects
  ("Bad lhs type"; tests/test_targets.py compiles the kernel for a TPU under it): the forward and
  backward kernels trace at 'default' (attention._at_precision), and the interpreted kernel's
  output and gradients equal the reference's."""
  assert jax.config.jax_default_matmul_precision == "highest"
  _, mask, pattern = _packed_replay()
  q, new, weights = (jax.tree.map(lambda x: jnp.asarray(x, jnp.bfloat16), a)
                     for a in _inputs(mask.shape[1]))
  config = ModelConfig.tiny(attention_impl="splash", compute_dtype="bfloat16")

  def loss(q, k, v):
    out = attention.attend(q, k, v, None, None, attention.prepare(config, mask, pattern))
    return jnp.sum(out.astype(jnp.float32) * weights)

  dots = _kernel_dots(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(q, *new).jaxpr)
  assert len(dots) >= 3 and "bfloat16" in {d for _, types in dots for d in types}  # fwd + bwd
  assert {p for p, _ in dots} == {(lax.Precision.DEFAULT,) * 2}, dots
  want, got = (_run(impl, mask, pattern, q, new, weights)
               for impl in ("reference", "splash"))  # outputs and gradients, bf16
  jax.tree.map(lambda x, y: np.testing.assert_allclose(np.float32(x), np.float32(y), atol=3e-2),
               got, want)
