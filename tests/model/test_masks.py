"""Masks: the response-relative block convention, checked by hand on small cases."""

import jax.numpy as jnp
import numpy as np

from gr2jax.model.masks import block_ids, decode_mask, make_attention_mask, padding_mask


def _mask(positions, start, block_size, valid=None):
  positions = jnp.asarray(positions)
  valid = jnp.ones(positions.shape, bool) if valid is None else jnp.asarray(valid)
  return np.asarray(make_attention_mask(positions, positions, valid, jnp.asarray(start),
                                        block_size))


def test_block_ids_by_hand():
  ids = block_ids(jnp.arange(9)[None], jnp.array([3]), 2)
  np.testing.assert_array_equal(ids, [[0, 1, 2, 3, 3, 4, 4, 5, 5]])


def test_block_size_one_is_causal():
  positions = jnp.arange(7)[None]
  np.testing.assert_array_equal(_mask(positions, [3], 1)[0], np.tril(np.ones((7, 7), bool)))


def test_block_causal_by_hand():
  # Prompt of 2 tokens (causal), then blocks of 2: {2, 3}, {4, 5}.
  expected = np.array([
      [1, 0, 0, 0, 0, 0],
      [1, 1, 0, 0, 0, 0],
      [1, 1, 1, 1, 0, 0],
      [1, 1, 1, 1, 0, 0],
      [1, 1, 1, 1, 1, 1],
      [1, 1, 1, 1, 1, 1]], bool)
  np.testing.assert_array_equal(_mask(jnp.arange(6)[None], [2], 2)[0], expected)


def test_ragged_starts_and_padding():
  positions = jnp.broadcast_to(jnp.arange(5), (2, 5))
  valid = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]], bool)
  mask = _mask(positions, [1, 3], 2, valid)
  # Example 0: prompt {0}, blocks {1,2}, {3,4}.
  assert mask[0, 1, 2] and not mask[0, 2, 3] and mask[0, 3, 4]
  # Example 1: prompt {0,1,2} causal, block {3,4}; key 4 is padding.
  assert not mask[1, 1, 2] and mask[1, 3, 3] and not mask[1, 3, 4] and not mask[1, 4, 4]


def test_padding_mask():
  np.testing.assert_array_equal(padding_mask(jnp.array([0, 2]), 3),
                                [[False, False, False], [True, True, False]])


def test_decode_mask_cache_and_new_tokens():
  # Cache of 4 slots, 2 valid for example 0 and 3 for example 1; 2 new tokens each, causal.
  lengths = jnp.array([2, 3])
  q_positions = lengths[:, None] + jnp.arange(2)
  mask = np.asarray(decode_mask(lengths, 4, q_positions))
  assert mask.shape == (2, 2, 6)
  np.testing.assert_array_equal(mask[0], [[1, 1, 0, 0, 1, 0], [1, 1, 0, 0, 1, 1]])
  np.testing.assert_array_equal(mask[1], [[1, 1, 1, 0, 1, 0], [1, 1, 1, 0, 1, 1]])
  # A block of 2 at the response start: bidirectional among the new tokens.
  block = np.asarray(decode_mask(lengths, 4, q_positions, start=lengths, block_size=2))
  np.testing.assert_array_equal(block[0], [[1, 1, 0, 0, 1, 1], [1, 1, 0, 0, 1, 1]])
