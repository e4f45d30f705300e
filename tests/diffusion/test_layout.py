"""The shared two-stream layout: replay rounds and CFT batches build identical inputs."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.data.batches import Batch
from gr2jax.diffusion import layout, replay
from gr2jax.diffusion.decode import NEVER_STEP, SEED_STEP
from gr2jax.model import masks
from gr2jax.model.config import ModelConfig
from gr2jax.train import cft

MASK, B = 63, 4
CONFIG = ModelConfig.tiny(vocab_size=64, num_layers=1, block_size=B, mask_token_id=MASK)
PROMPTS = np.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], np.int32)
PROMPT_LENGTHS = np.array([5, 3], np.int32)
P, M = 6, 10  # R = 12: the last block holds two slots past max_new
S = NEVER_STEP
# A trace as the decoder records it: seeds at block starts, per-block steps 0.., row 0 stopped at
# response index 5 (length 6) with index 6 committed after the stop in the same block and index 7
# never committed; row 1 ran to max_new.
COMMIT_STEP = np.array([
  [SEED_STEP, 1, 0, 2, SEED_STEP, 0, 1, S, S, S],
  [SEED_STEP, 0, 0, 1, SEED_STEP, 2, 1, 0, SEED_STEP, 0],
], np.int32)
TRACE = np.array([
  [20, 21, 22, 23, 24, 25, 26, MASK, MASK, MASK],
  [40, 41, 42, 43, 44, 45, 46, 47, 48, 49],
], np.int32)
LENGTHS = np.array([6, 10], np.int32)


_replay_inputs = jax.jit(replay.replay_inputs, static_argnames=("config", "rounds", "shrink"))
_cft_inputs = jax.jit(cft.cft_inputs, static_argnums=0)


def _cft_batch():
  return Batch(prompt_tokens=PROMPTS, prompt_lengths=PROMPT_LENGTHS, response_tokens=TRACE,
               response_lengths=LENGTHS)


def _replay(rounds):
  return _replay_inputs(CONFIG, PROMPTS, PROMPT_LENGTHS, TRACE, COMMIT_STEP, LENGTHS,
                        rounds=tuple(rounds))


@pytest.mark.parametrize("s", [0, 1, 2])
def test_replay_round_equals_cft_batch_with_the_same_noisy_set(s):
  noisy = (COMMIT_STEP >= s)[:, None, :]  # what round s masks
  got = _replay((s,))
  want = _cft_inputs(CONFIG, _cft_batch(), jnp.asarray(noisy))
  for a, b in zip(got, want, strict=True):
    np.testing.assert_array_equal(a, b)
  # Seeds and earlier steps are visible, round-s tokens and never-committed slots are masks.
  noisy_tokens = np.asarray(got.tokens[:, P + 12 :])
  np.testing.assert_array_equal(noisy_tokens[:, :M] == MASK, (COMMIT_STEP >= s) | (TRACE == MASK))
  assert (noisy_tokens[:, M:] == MASK).all()


def test_packed_rounds_are_independent_single_round_layouts():
  packed = _replay((0, 1, 2))
  r = 12
  for s in range(3):
    single = _replay((s,))
    idx = np.concatenate([np.arange(P + r), P + r * (1 + s) + np.arange(r)])
    np.testing.assert_array_equal(packed.tokens[:, idx], single.tokens)
    np.testing.assert_array_equal(packed.positions[:, idx], single.positions)
    np.testing.assert_array_equal(packed.mask[:, idx][:, :, idx], single.mask)
  # Noisy streams never see each other.
  for s in range(3):
    for t in range(3):
      if s != t:
        q = P + r * (1 + s) + np.arange(r)
        k = P + r * (1 + t) + np.arange(r)
        assert not np.asarray(packed.mask[:, q][:, :, k]).any()


def test_mask_semantics():
  inputs = _replay((1,))
  r = 12
  pos, mask = np.asarray(inputs.positions), np.asarray(inputs.mask)
  # Positions: prompt slots 0..P-1, response index j at prompt_length + j in both streams.
  for row in range(2):
    resp = PROMPT_LENGTHS[row] + np.arange(r)
    np.testing.assert_array_equal(pos[row, P : P + r], resp)
    np.testing.assert_array_equal(pos[row, P + r :], resp)
  # Prompt + clean: exactly the block-causal mask of masks.py over the valid keys.
  pc = np.arange(P + r)
  valid = np.concatenate([np.arange(P)[None] < PROMPT_LENGTHS[:, None],
                          np.arange(r)[None] < LENGTHS[:, None]], axis=1)
  ref = masks.make_attention_mask(pos[:, pc], pos[:, pc], valid, PROMPT_LENGTHS, B)
  real = np.concatenate([np.arange(P)[None] < PROMPT_LENGTHS[:, None],
                         np.ones((2, r), bool)], axis=1)  # the query rows any prediction reads
  np.testing.assert_array_equal(mask[:, pc][:, :, pc] & real[:, :, None], ref & real[:, :, None])
  # Padding prompt rows (read by nothing) follow the static pattern: causal over the real prompt.
  pad = ~real[:, :, None]
  np.testing.assert_array_equal(mask[:, pc][:, :, pc] & pad,
                                np.tri(P + r, dtype=bool)[None] & valid[:, None] & pad)
  np.testing.assert_array_equal(mask, inputs.pattern.mask()[None] & mask.any(axis=1)[:, None])
  assert not mask[:, pc, P + r :].any()  # prompt and clean never see a noisy key
  # Noisy block b: the valid prompt, clean blocks < b, its own noisy block.
  for row in range(2):
    for j in range(r):
      q = P + r + j
      seen = np.flatnonzero(mask[row, q])
      blk = j // B
      want = np.concatenate([
        np.arange(PROMPT_LENGTHS[row]),
        P + np.arange(min(blk * B, LENGTHS[row])),
        P + r + blk * B + np.arange(B),
      ])
      np.testing.assert_array_equal(seen, want)


def test_prediction_queries():
  stream = np.array([[layout.CLEAN_STREAM, 0, 1, layout.CLEAN_STREAM]])
  q = layout.prediction_queries(stream, np.array([5]), 6, 8)
  np.testing.assert_array_equal(q, [[4, 6 + 8 + 0, 6 + 16 + 1, 6 + 2]])


def test_errors():
  with pytest.raises(ValueError, match="mask_token_id"):
    layout.two_stream_inputs(ModelConfig.tiny(vocab_size=64), PROMPTS, PROMPT_LENGTHS, TRACE,
                             LENGTHS, np.zeros_like(TRACE, bool))
  with pytest.raises(ValueError, match="noisy"):
    layout.two_stream_inputs(CONFIG, PROMPTS, PROMPT_LENGTHS, TRACE, LENGTHS,
                             np.zeros((2, 3), bool))
