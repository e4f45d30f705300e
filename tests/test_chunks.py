"""Row chunks: chunked == one call (padding dropped, one compile), keys per chunk, sharded chunks,
and greedy block-diffusion rollouts decoded in chunks equal to one batch."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec

from gr2jax import chunks
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from tests.diffusion import helpers

ROWS = {"x": np.arange(30, dtype=np.float32).reshape(10, 3), "n": np.arange(10, dtype=np.int32)}


def test_chunk_size():
  assert chunks.chunk_size(10, 0) == 10 and chunks.chunk_size(10, 16) == 10
  assert chunks.chunk_size(10, 4) == 4
  with pytest.raises(ValueError, match="chunk_rows must be >= 0"):
    chunks.chunk_size(10, -1)


def test_chunked_equals_one_call_with_one_compile():
  shapes = []

  @jax.jit
  def fn(rows):
    shapes.append(rows["x"].shape)  # runs once per trace
    return {"total": rows["x"].sum(axis=1) + rows["n"], "double": 2 * rows["x"]}

  whole = chunks.map_row_chunks(lambda rows, _: fn(rows), ROWS, 0)
  chunked = chunks.map_row_chunks(lambda rows, _: fn(rows), ROWS, 4)  # 4 + 4 + 2 padded to 4
  assert shapes == [(10, 3), (4, 3)]
  for name in whole:
    assert chunked[name].shape == whole[name].shape and isinstance(chunked[name], np.ndarray)
    np.testing.assert_array_equal(chunked[name], whole[name])


def test_one_call_gets_the_key_and_chunks_fold_it_in():
  key = jax.random.key(3)
  draw = lambda rows, k: jax.random.uniform(k, (len(rows["n"]),))
  np.testing.assert_array_equal(chunks.map_row_chunks(draw, ROWS, 0, key=key),
                                jax.random.uniform(key, (10,)))
  out = chunks.map_row_chunks(draw, ROWS, 4, key=key)
  for i in range(3):
    expected = jax.random.uniform(jax.random.fold_in(key, i), (4,))
    np.testing.assert_array_equal(out[4 * i:4 * i + 4], expected[:len(out[4 * i:4 * i + 4])])
  assert chunks.map_row_chunks(lambda rows, k: rows["n"] * (k is None), ROWS, 4).sum() == 45


def test_chunks_are_placed_with_the_batch_sharding():
  mesh = jax.make_mesh((8,), ("fsdp",), devices=jax.devices()[:8])
  sharding = NamedSharding(mesh, PartitionSpec("fsdp"))
  seen = []

  def fn(rows, _):
    seen.append(rows["x"].sharding)
    return rows["x"] * 2

  out = chunks.map_row_chunks(fn, {"x": np.arange(12, dtype=np.float32)}, 8, sharding=sharding)
  assert seen == [sharding, sharding]
  np.testing.assert_array_equal(out, 2 * np.arange(12))


def test_greedy_rollouts_in_chunks_equal_one_batch():
  config = ModelConfig.tiny(vocab_size=64, num_layers=1, block_size=4, mask_token_id=63,
                            eos_token_ids=(), pad_token_id=0)
  params = jax.tree.map(lambda x: 4 * x, init_params(config, jax.random.key(0)))  # peaky
  prompts = np.asarray(jax.random.randint(jax.random.key(1), (5, 6), 1, 63), np.int32)
  rows = {"prompt_tokens": prompts, "prompt_lengths": np.array([6, 3, 5, 4, 6], np.int32)}

  def decode(chunk, key):
    out = helpers.generate(params, config, chunk["prompt_tokens"], chunk["prompt_lengths"],
                           threshold=0.5, max_steps_per_block=4, max_new_tokens=8,
                           temperature=0.0, key=key)
    return out.tokens, out.commit_step, out.lengths, out.commit_logprob

  whole = chunks.map_row_chunks(decode, rows, 0, key=jax.random.key(2))
  chunked = chunks.map_row_chunks(decode, rows, 2, key=jax.random.key(2))  # 2 + 2 + 1 padded
  for a, b in zip(chunked[:3], whole[:3], strict=True):
    np.testing.assert_array_equal(a, b)
  np.testing.assert_allclose(chunked[3], whole[3], atol=1e-6)
  assert jnp.asarray(whole[0]).shape == (5, 8)
