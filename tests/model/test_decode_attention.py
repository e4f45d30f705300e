"""model/decode_attention.py: the GPU decode kernel (in the Pallas interpreter) == the reference.

The kernel itself, at the shapes of each decode step (the AR step, a block step, a ragged batch,
several splits, a cache shorter than a chunk, bf16), against attention.reference over the same
buffers; then qwen3.forward's and the block step's dispatch to it (attention_impl 'cudnn' with a
cache write) against the reference forward; and that it refuses a gradient by name. The compiled
H100 decoders call it: tests/test_targets.py.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.diffusion import decode
from gr2jax.model import attention, decode_attention, qwen3
from gr2jax.model import params as params_lib
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig


@pytest.fixture(autouse=True)
def _kernels_on_cpu(monkeypatch):
  monkeypatch.setattr(decode_attention, "DECODE_INTERPRET", True)
  monkeypatch.setattr(attention, "CUDNN_IMPLEMENTATION", "xla")


def _inputs(b, t, n, kv, h, s, dtype, lengths, causal):
  """Random q and buffers, and the mask a decode step gives after its write: row t of batch
  element i sees slots < lengths[i] + T (block) or < lengths[i] + t + 1 (causal)."""
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(k1, (b, t, n, h)).astype(dtype)
  k_cache = jax.random.normal(k2, (b * kv, h, s)).astype(dtype)
  v_cache = jax.random.normal(k3, (b * kv, s, h)).astype(dtype)
  seen = jnp.asarray(lengths)[:, None] + (jnp.arange(t) + 1 if causal else jnp.full(t, t))
  mask = jnp.arange(s)[None, None, :] < seen[:, :, None]
  return q, k_cache, v_cache, mask


# (batch, T, N, K, H, S, dtype, lengths, causal, atol); splits: num_splits at these shapes.
CASES = {
  "ar_step": (1, 1, 4, 2, 32, 300, jnp.float32, [150], True, 1e-6),
  "ar_ragged_batch": (3, 1, 8, 2, 16, 200, jnp.float32, [5, 199, 60], True, 1e-6),
  "block_step": (2, 32, 4, 2, 32, 300, jnp.float32, [40, 268], False, 1e-6),
  "verify_forward": (2, 9, 4, 2, 32, 160, jnp.float32, [100, 3], True, 1e-6),
  "short_cache": (1, 4, 4, 2, 32, 40, jnp.float32, [20], False, 1e-6),
  "many_splits": (1, 1, 2, 1, 128, 2456, jnp.float32, [2200], True, 1e-6),
  "bf16_block": (1, 32, 4, 2, 32, 1000, jnp.bfloat16, [700], False, 2e-2),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_kernel_equals_the_reference(case):
  b, t, n, kv, h, s, dtype, lengths, causal, atol = CASES[case]
  q, k_cache, v_cache, mask = _inputs(b, t, n, kv, h, s, dtype, lengths, causal)
  no_new = jnp.zeros((b, 0, kv, h), dtype)
  want = attention.reference(q, no_new, no_new, k_cache, v_cache, mask, 1 << 30)
  got = jax.jit(decode_attention.decode_attention)(q, k_cache, v_cache, mask)
  assert got.dtype == q.dtype and got.shape == q.shape
  np.testing.assert_allclose(np.asarray(got, np.float32), np.asarray(want, np.float32),
                             atol=atol, rtol=atol)


def test_splits_and_chunks_cover_the_slots():
  """The AR step of Qwen3-8B's shape splits its 20 chunks over programs; a block step does not
  (its partials would outweigh the cache it reads)."""
  assert decode_attention.num_splits(8, 16, 2456, 2) == 9
  assert decode_attention.num_splits(8, 128, 2456, 2) == 1
  assert decode_attention.num_splits(1, 16, 2456, 4) == 19  # f32: the partials' bound
  assert decode_attention.num_splits(64, 16, 2456, 4) == 2  # enough programs
  _, _, _, _, h, s, *_ = CASES["many_splits"]
  assert decode_attention.num_splits(1, 16, s, 4) > 1  # the case above runs several


def test_unsupported_shapes_are_refused_by_name_and_left_to_the_reference():
  q, k_cache, v_cache, mask = _inputs(1, 1, 2, 1, 24, 64, jnp.float32, [10], True)
  with pytest.raises(ValueError, match="head_dim=24"):
    decode_attention.decode_attention(q, k_cache, v_cache, mask)
  assert not decode_attention.supports(24, 64) and not decode_attention.supports(32, 8)
  config = ModelConfig.tiny(head_dim=24, attention_impl="cudnn")
  full = jnp.concatenate([mask, jnp.ones((1, 1, 1), bool)], axis=-1)
  assert attention.prepare(config, full, None, jnp.array([10]))["impl"] == "reference"
  assert attention.prepare(ModelConfig.tiny(attention_impl="cudnn"), full, None,
                           jnp.array([10]))["impl"] == "decode"


def test_shapes_are_checked_by_name():
  q, k_cache, v_cache, mask = _inputs(1, 4, 4, 2, 32, 64, jnp.float32, [10], False)
  with pytest.raises(ValueError, match=r"mask is \(1, 1, 64\)"):
    decode_attention.decode_attention(q, k_cache, v_cache, mask[:, :1])
  with pytest.raises(ValueError, match="v_cache"):
    decode_attention.decode_attention(q, k_cache, v_cache[:, :, :16], mask)


def test_the_kernel_has_no_gradient():
  q, k_cache, v_cache, mask = _inputs(1, 1, 4, 2, 32, 64, jnp.float32, [10], True)
  loss = lambda q: jnp.sum(decode_attention.decode_attention(q, k_cache, v_cache, mask))
  with pytest.raises(NotImplementedError, match="inference only"):
    jax.grad(loss)(q)


def _prefilled(config, batch, slots, lengths):
  params = params_lib.init_params(config, jax.random.key(1))
  cache = init_cache(config, batch, slots)
  prompt = jax.random.randint(jax.random.key(2), (batch, max(lengths)), 1, 100)
  prompt_lengths = jnp.asarray(lengths, jnp.int32)
  _, cache = qwen3.forward(params, config, prompt, cache=cache, update_cache=True)
  return params, cache.replace(lengths=prompt_lengths), prompt_lengths


def test_decode_steps_with_the_kernel_equal_the_reference_forward():
  """attention_impl 'cudnn': the AR step and the block step (written-buffer attention) run the
  kernel and give the reference's logits and caches."""
  reference = ModelConfig.tiny(vocab_size=128, block_size=8, mask_token_id=127)
  kernel = dataclasses.replace(reference, attention_impl="cudnn")
  params, cache, prompt_lengths = _prefilled(reference, 2, 48, [20, 33])
  token = jnp.array([[5], [9]], jnp.int32)
  block = jnp.full((2, 8), 127, jnp.int32).at[:, 0].set(7)
  layers = params_lib.layer_list(params)
  runs = {}
  for name, config in (("reference", reference), ("kernel", kernel)):
    assert attention.prepare(config, jnp.ones((2, 1, 49), bool), None,
                             cache.lengths)["impl"] == name.replace("kernel", "decode")
    ar = jax.jit(lambda p, c, config=config: qwen3.forward(p, config, token, cache=c,
                                                             update_cache=True))(layers, cache)
    blk = jax.jit(lambda p, c, config=config: decode.block_forward(p, config, c, block,
                                                                   prompt_lengths))(layers, cache)
    runs[name] = (ar, blk)
  jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=2e-5, rtol=2e-5),
               runs["kernel"], runs["reference"])


def test_the_decoders_with_the_kernel_write_the_references_tokens():
  """generate, block_diffusion_generate and draft-and-verify with attention_impl 'cudnn' (the
  cache-free prefill through cuDNN's arguments, every decode step through the kernel) write the
  reference decoders' greedy tokens, ragged batch of 2."""
  from gr2jax.diffusion import speculative
  from gr2jax.model import generate as generate_lib

  reference = ModelConfig.tiny(vocab_size=128, block_size=8, mask_token_id=127,
                               eos_token_ids=())
  kernel = dataclasses.replace(reference, attention_impl="cudnn")
  params = params_lib.init_params(reference, jax.random.key(3))
  prompts = jax.random.randint(jax.random.key(4), (2, 12), 1, 100)
  lengths = jnp.array([12, 7], jnp.int32)
  decoding = decode.BlockDecoding(threshold=0.9, max_steps_per_block=8, max_new_tokens=16)
  spec = speculative.DraftDecoding(max_new_tokens=16, k=4, draft_tau=0.0, draft_steps=1)
  runs = {}
  for name, config in (("reference", reference), ("kernel", kernel)):
    ar = generate_lib.generate(params, config, prompts, lengths,
                               generate_lib.ARDecoding(max_new_tokens=16))
    diffusion = decode.block_diffusion_generate(params, config, prompts, lengths, decoding)
    lossless = speculative.speculative_generate(
      speculative.Model(params, config),
      speculative.Model(params, dataclasses.replace(config, block_size=1)), prompts, lengths,
      spec)
    runs[name] = (ar.tokens, diffusion.tokens, lossless.tokens)
  for got, want in zip(runs["kernel"], runs["reference"], strict=True):
    np.testing.assert_array_equal(got, want)
