"""forward: cache invariants, masks, logits_at, dtypes, every config field used, clear errors."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.model import qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.masks import decode_mask, make_attention_mask
from gr2jax.model.params import abstract_params, init_params
from gr2jax.model.qwen3 import forward, ragged_prefill

CONFIG = ModelConfig.tiny(vocab_size=64, num_layers=2)
PARAMS = init_params(CONFIG, jax.random.key(0))
TOKENS = jax.random.randint(jax.random.key(1), (2, 9), 0, 64)
# Jitted once per shape: eager scans recompile op by op and are ~10x slower on CPU.
FWD = jax.jit(forward, static_argnums=1, static_argnames="update_cache")
HIDDEN = jax.jit(qwen3.hidden_states, static_argnums=1)


def _perturbed(params, scale=0.3):
  """Params with larger random norms so every field matters visibly in the logits."""
  leaves, treedef = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.key(7), len(leaves))
  return jax.tree.unflatten(treedef, [x + scale * jax.random.normal(k, x.shape)
                                      for x, k in zip(leaves, keys, strict=True)])


def test_shapes_and_fp32_logits():
  logits, cache = FWD(PARAMS, CONFIG, TOKENS)
  assert logits.shape == (2, 9, 64) and logits.dtype == jnp.float32 and cache is None
  _, hidden = HIDDEN(PARAMS, CONFIG, TOKENS)
  assert hidden.shape == (3, 2, 9, 128)


def test_cached_prefill_and_extend_equal_full_forward():
  full, _ = FWD(PARAMS, CONFIG, TOKENS)
  cache = init_cache(CONFIG, batch=2, max_len=12)
  pieces = []
  for lo, hi in [(0, 4), (4, 5), (5, 8), (8, 9)]:  # prefill, 1-token, multi-token, 1-token
    logits, cache = FWD(PARAMS, CONFIG, TOKENS[:, lo:hi], cache=cache, update_cache=True)
    pieces.append(logits)
  np.testing.assert_allclose(jnp.concatenate(pieces, axis=1), full, atol=1e-5)
  np.testing.assert_array_equal(cache.lengths, [9, 9])


def test_read_only_cache_is_untouched():
  cache = init_cache(CONFIG, batch=2, max_len=12)
  _, cache = FWD(PARAMS, CONFIG, TOKENS[:, :4], cache=cache, update_cache=True)
  _, same = forward(PARAMS, CONFIG, TOKENS[:, 4:6], cache=cache)
  assert same is cache
  _, same = FWD(PARAMS, CONFIG, TOKENS[:, 4:6], cache=cache)
  jax.tree.map(np.testing.assert_array_equal, same, cache)


def test_write_past_the_cache_is_dropped_under_jit():
  cache = init_cache(CONFIG, batch=2, max_len=6)
  _, cache = FWD(PARAMS, CONFIG, TOKENS[:, :4], cache=cache, update_cache=True)
  _, after = FWD(PARAMS, CONFIG, TOKENS[:, 4:7], cache=cache, update_cache=True)
  k_after, k_before = np.stack(after.k), np.stack(cache.k)  # [L, B*K, H, S]
  np.testing.assert_array_equal(k_after[..., :4], k_before[..., :4])  # valid slots intact
  _, ref = FWD(PARAMS, CONFIG, TOKENS[:, :6], cache=init_cache(CONFIG, 2, 6), update_cache=True)
  np.testing.assert_allclose(k_after, np.stack(ref.k), atol=1e-5)  # slots 4, 5 written, 7th dropped


def test_block_mask_with_cache_equals_training_forward():
  """Prompt in the cache + a block under the block mask == one forward with the same mask."""
  start, block = 5, 4
  positions = jnp.broadcast_to(jnp.arange(9), (2, 9))
  full_mask = make_attention_mask(positions, positions, jnp.ones((2, 9), bool),
                                  jnp.full((2,), start), block)
  full, _ = FWD(PARAMS, CONFIG, TOKENS, mask=full_mask)
  cache = init_cache(CONFIG, batch=2, max_len=9)
  _, cache = FWD(PARAMS, CONFIG, TOKENS[:, :start], cache=cache, update_cache=True)
  q_positions = positions[:, start:]
  mask = decode_mask(cache.lengths, 9, q_positions, start=jnp.full((2,), start), block_size=block)
  logits, _ = FWD(PARAMS, CONFIG, TOKENS[:, start:], q_positions, mask, cache)
  np.testing.assert_allclose(logits, full[:, start:], atol=1e-5)
  # In-block attention is bidirectional: the block's first logit depends on its last token.
  changed = TOKENS.at[:, -1].set((TOKENS[:, -1] + 1) % 64)
  other, _ = FWD(PARAMS, CONFIG, changed, mask=full_mask)
  assert not np.allclose(other[:, start], full[:, start])


def test_logits_at_gathers():
  full, _ = FWD(PARAMS, CONFIG, TOKENS)
  at = jnp.array([[8, 0], [3, 3]])
  logits, _ = FWD(PARAMS, CONFIG, TOKENS, logits_at=at)
  np.testing.assert_allclose(logits, jnp.take_along_axis(full, at[:, :, None], axis=1),
                             atol=1e-6)


def test_ragged_prefill_equals_one_by_one():
  lengths = jnp.array([5, 9])
  tokens = jnp.where(jnp.arange(9) < lengths[:, None], TOKENS, 0)
  prefill = jax.jit(ragged_prefill, static_argnums=1)
  last, cache = prefill(PARAMS, CONFIG, tokens, lengths, init_cache(CONFIG, 2, 12))
  np.testing.assert_array_equal(cache.lengths, lengths)
  nxt, _ = FWD(PARAMS, CONFIG, jnp.array([[3], [4]]), cache=cache)
  for b in range(2):
    n = int(lengths[b])
    ref, _ = FWD(PARAMS, CONFIG, tokens[b:b + 1, :n])
    np.testing.assert_allclose(last[b], ref[0, -1], atol=1e-5)
    ref2, _ = FWD(PARAMS, CONFIG, jnp.concatenate([tokens[b:b + 1, :n],
                                                       jnp.array([[3 + b]])], axis=1))
    np.testing.assert_allclose(nxt[b, 0], ref2[0, -1], atol=1e-5)


def test_jit_and_bf16():
  config = dataclasses.replace(CONFIG, param_dtype="bfloat16", compute_dtype="bfloat16")
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), PARAMS)
  logits, _ = FWD(params, config, TOKENS)
  ref, _ = FWD(PARAMS, CONFIG, TOKENS)
  assert logits.dtype == jnp.float32
  assert float(jnp.max(jnp.abs(logits - ref))) < 0.05 * float(jnp.max(jnp.abs(ref))) + 1e-3
  cache = init_cache(config, 2, 12)
  assert cache.k[0].dtype == jnp.bfloat16
  _, cache = FWD(params, config, TOKENS, cache=cache, update_cache=True)
  assert cache.k[0].dtype == jnp.bfloat16


# Fields consumed outside the forward: by init_cache / generate / gr2jax.diffusion / the tokenizer.
DECODE_FIELDS = {"max_position_embeddings", "block_size", "mask_token_id", "bos_token_id",
                 "eos_token_ids", "pad_token_id"}
# Training hooks that must NOT change the values: tested exact in
# test_remat_and_chunk_budget_do_not_change_loss_or_grads and (attention_impl)
# tests/model/test_attention.py.
EXACT_HOOK_FIELDS = {"remat", "attention_chunk_bytes", "attention_impl"}


def test_every_config_field_is_used():
  """Catches an ignored field (another JAX port ignores rope_theta): each one changes the params'
  shapes or the logits."""
  shape_changes = {"vocab_size": 65, "hidden_size": 96, "num_layers": 3, "num_heads": 8,
                   "num_kv_heads": 1, "head_dim": 16, "intermediate_size": 128,
                   "tie_word_embeddings": True, "param_dtype": "bfloat16"}
  value_changes = {"rope_theta": 100.0, "rms_norm_eps": 0.5, "tie_word_embeddings": True,
                   "compute_dtype": "bfloat16"}
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  assert set(shape_changes) | set(value_changes) | DECODE_FIELDS | EXACT_HOOK_FIELDS == fields, (
      "a new config field needs a use test")
  shapes = lambda c: jax.tree.map(lambda x: (x.shape, x.dtype), abstract_params(c))
  for name, value in shape_changes.items():
    assert shapes(dataclasses.replace(CONFIG, **{name: value})) != shapes(CONFIG), name
  params = _perturbed(PARAMS)
  ref = FWD(params, CONFIG, TOKENS)[0]
  for name, value in value_changes.items():
    config = dataclasses.replace(CONFIG, **{name: value})
    p = params
    if name == "tie_word_embeddings":
      p = {k: v for k, v in params.items() if k != "lm_head"}
    assert not np.allclose(FWD(p, config, TOKENS)[0], ref, atol=1e-4), name


def test_bad_inputs_are_named():
  with pytest.raises(ValueError, match="mask"):
    forward(PARAMS, CONFIG, TOKENS, mask=jnp.ones((2, 9, 10), bool))
  with pytest.raises(ValueError, match="positions"):
    forward(PARAMS, CONFIG, TOKENS, positions=jnp.zeros((2, 8), jnp.int32))
  with pytest.raises(ValueError, match="overflows"):
    forward(PARAMS, CONFIG, TOKENS, cache=init_cache(CONFIG, 2, 8), update_cache=True)
  with pytest.raises(ValueError, match="cache.k"):
    forward(PARAMS, CONFIG, TOKENS, cache=init_cache(CONFIG, 3, 16))
  with pytest.raises(ValueError, match="outside the vocab"):
    forward(PARAMS, CONFIG, TOKENS.at[0, 3].set(64))
  with pytest.raises(ValueError, match="needs a cache"):
    forward(PARAMS, CONFIG, TOKENS, update_cache=True)


def test_prefill_without_reading_empty_cache_is_exact():
  params = init_params(CONFIG, jax.random.key(3))
  tokens = jax.random.randint(jax.random.key(4), (2, 7), 0, CONFIG.vocab_size)
  lengths = jnp.array([7, 4], jnp.int32)
  fresh = init_cache(CONFIG, 2, 12)
  logits_a, cache_a = ragged_prefill(params, CONFIG, tokens, lengths, fresh)
  logits_b, cache_b = ragged_prefill(params, CONFIG, tokens, lengths, fresh, read_cache=False)
  np.testing.assert_allclose(logits_a, logits_b, atol=1e-5)
  np.testing.assert_allclose(np.stack(cache_a.k), np.stack(cache_b.k), atol=1e-6)
  np.testing.assert_array_equal(cache_a.lengths, cache_b.lengths)


def test_remat_and_chunk_budget_do_not_change_loss_or_grads():
  """config.remat='full' and an explicit attention_chunk_bytes are exact (training hooks)."""
  config = ModelConfig.tiny(vocab_size=64, num_layers=2)
  params = init_params(config, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 40), 0, 64)

  def loss(p, cfg):
    logits, _ = qwen3.forward(p, cfg, tokens)
    return jnp.mean(jax.nn.log_softmax(logits)[..., 0])

  grad = jax.jit(jax.value_and_grad(loss), static_argnums=1)  # compiled: eager was 1.5x the time
  base = grad(params, config)
  for cfg in (dataclasses.replace(config, remat="full"),
              dataclasses.replace(config, attention_chunk_bytes=1)):
    got = grad(params, cfg)
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-5), got, base)
  with pytest.raises(ValueError, match="remat"):
    ModelConfig.tiny(remat="some")
