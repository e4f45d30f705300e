"""Commit rule on hand-made probability arrays."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.diffusion import commit

MASK = 0  # mask token id in these tests; vocab of 4: {MASK, 1, 2, 3}


def _logits(probs):
  """[B, T, V] logits whose softmax (mask suppressed) is `probs` (mask column 0 in probs)."""
  return jnp.log(jnp.asarray(probs, jnp.float32) + 1e-30)


def _run(probs, canvas, masked, tau, **kw):
  return commit.commit_step(
    _logits(probs),
    jnp.asarray(canvas, jnp.int32),
    jnp.asarray(masked, bool),
    threshold=tau,
    mask_token_id=MASK,
    **kw,
  )


# One example, 3 positions; position 0 is already committed (token 3).
PROBS = [[[0, 0.1, 0.1, 0.8], [0, 0.95, 0.03, 0.02], [0, 0.2, 0.5, 0.3]]]
CANVAS = [[3, MASK, MASK]]
MASKED = [[False, True, True]]


def test_threshold_commits_confident_positions_only():
  out = _run(PROBS, CANVAS, MASKED, 0.9)
  np.testing.assert_array_equal(out.committed, [[False, True, False]])
  np.testing.assert_array_equal(out.canvas, [[3, 1, MASK]])
  np.testing.assert_array_equal(out.masked, [[False, False, True]])
  np.testing.assert_allclose(out.logprob[0, 1], np.log(0.95), rtol=1e-5)


def test_low_threshold_commits_all_passing_positions():
  out = _run(PROBS, CANVAS, MASKED, 0.4)
  np.testing.assert_array_equal(out.canvas, [[3, 1, 2]])
  assert not out.masked.any()


def test_forced_argmax_when_none_passes():
  probs = [[[0, 0.5, 0.25, 0.25], [0, 0.6, 0.2, 0.2], [0, 0.3, 0.3, 0.4]]]
  out = _run(probs, [[MASK] * 3], [[True] * 3], 0.9)
  np.testing.assert_array_equal(out.committed, [[False, True, False]])
  np.testing.assert_array_equal(out.canvas, [[MASK, 1, MASK]])


def test_committed_positions_stay_fixed():
  # Position 0 is committed to 3 although the logits now strongly prefer 1.
  probs = [[[0, 0.99, 0.005, 0.005], [0, 0.2, 0.7, 0.1], [0, 0.1, 0.1, 0.8]]]
  out = _run(probs, [[3, MASK, MASK]], MASKED, 0.0)
  np.testing.assert_array_equal(out.canvas, [[3, 2, 3]])
  assert not out.committed[0, 0]


def test_mask_token_never_committed():
  # The mask token holds almost all the mass; the rule must pick among real tokens.
  probs = [[[0.97, 0.01, 0.015, 0.005], [0.99, 0.004, 0.003, 0.003]]]
  out = _run(probs, [[MASK, MASK]], [[True, True]], -1.0)
  assert (out.canvas != MASK).all()
  np.testing.assert_array_equal(out.canvas, [[2, 1]])
  # Log-probs are renormalised without the mask token.
  np.testing.assert_allclose(jnp.exp(out.logprob[0, 0]), 0.015 / 0.03, rtol=1e-4)
  keys = jax.random.split(jax.random.key(0), 4)
  for k in keys:
    out = _run(probs, [[MASK, MASK]], [[True, True]], -1.0, temperature=1.0, key=k)
    assert (out.canvas != MASK).all()


def test_tau_one_commits_one_per_step():
  rng = np.random.default_rng(0)
  probs = rng.dirichlet(np.ones(4), size=(3, 8))
  probs[..., MASK] = 0
  probs /= probs.sum(-1, keepdims=True)
  canvas = jnp.full((3, 8), MASK, jnp.int32)
  masked = jnp.ones((3, 8), bool)
  for step in range(8):
    out = commit.commit_step(_logits(probs), canvas, masked, threshold=1.0, mask_token_id=MASK)
    np.testing.assert_array_equal(out.committed.sum(-1), [1, 1, 1])
    canvas, masked = out.canvas, out.masked
    assert masked.sum() == 3 * (7 - step)


def test_tau_one_commits_one_per_step_even_at_probability_one():
  """Peaked rows round to confidence exactly 1.0; tau = 1.0 still commits only the forced one."""
  probs = [[[0, 1.0, 0, 0], [0, 0, 1.0, 0], [0, 0.5, 0.5, 0]]]
  out = _run(probs, [[MASK] * 3], [[True] * 3], 1.0)
  np.testing.assert_array_equal(out.committed, [[True, False, False]])
  logits = jnp.asarray([[[0.0, 90.0, 0.0, 0.0], [0.0, 0.0, 80.0, 0.0]]])  # conf == 1.0 in fp32
  assert (jnp.exp(commit.token_log_probs(logits, MASK, 0.0).max(-1)) == 1.0).all()
  out = commit.commit_step(logits, jnp.full((1, 2), MASK), jnp.ones((1, 2), bool), threshold=1.0,
                           mask_token_id=MASK)
  np.testing.assert_array_equal(out.committed, [[True, False]])


def test_per_example_threshold_and_rows_without_masks():
  probs = [PROBS[0], PROBS[0]]
  out = _run(probs, [CANVAS[0], [3, 1, 2]], [MASKED[0], [False] * 3], jnp.array([0.0, 0.0]))
  np.testing.assert_array_equal(out.canvas, [[3, 1, 2], [3, 1, 2]])
  assert not out.committed[1].any()


def test_greedy_sampling_at_low_temperature_matches_argmax():
  out = _run(PROBS, CANVAS, MASKED, -1.0, temperature=1e-4, key=jax.random.key(3))
  np.testing.assert_array_equal(out.canvas, [[3, 1, 2]])


def test_sampling_without_key_and_bad_shapes_raise():
  with pytest.raises(ValueError, match="PRNG key"):
    _run(PROBS, CANVAS, MASKED, 0.9, temperature=1.0)
  with pytest.raises(ValueError, match=r"\[B, T, V\]"):
    _run(PROBS, [[3, MASK]], [[False, True]], 0.9)


def test_sampling_frequencies_follow_the_probabilities():
  probs = np.array([0.0, 0.2, 0.3, 0.5])
  logits = jnp.broadcast_to(_logits(probs), (20000, 1, 4))
  tokens, logp = commit.propose(logits, MASK, 1.0, jax.random.key(3))
  freq = np.bincount(np.asarray(tokens[:, 0]), minlength=4) / tokens.shape[0]
  np.testing.assert_allclose(freq, probs, atol=0.015)
  np.testing.assert_allclose(np.exp(logp[:, 0]), probs[np.asarray(tokens[:, 0])], rtol=1e-5)


def _select(conf, masked, tau, **kw):
  """select() on given confidences (proposed token = position + 1)."""
  conf = jnp.asarray(conf, jnp.float32)
  tokens = jnp.broadcast_to(jnp.arange(1, conf.shape[1] + 1, dtype=jnp.int32), conf.shape)
  return commit.select(tokens, jnp.log(conf), jnp.full(conf.shape, MASK, jnp.int32),
                       jnp.asarray(masked, bool), tau, **kw)


CONF = [[0.5, 0.95, 0.97, 0.2, 0.99]]


def test_left_to_right_commits_the_leftmost_run_above_tau():
  open_ = [[False, True, True, True, True]]
  out = _select(CONF, open_, 0.9, order="left_to_right")
  np.testing.assert_array_equal(out.committed, [[False, True, True, False, False]])
  # tau = 1.0: exactly the leftmost open position; below every confidence: all of them.
  out = _select(CONF, open_, 1.0, order="left_to_right")
  np.testing.assert_array_equal(out.committed, [[False, True, False, False, False]])
  out = _select(CONF, open_, 0.1, order="left_to_right")
  np.testing.assert_array_equal(out.committed, open_)
  # The leftmost open position commits even below tau; the run stops at the first failure.
  out = _select(CONF, [[True, True, False, True, True]], 0.9, order="left_to_right")
  np.testing.assert_array_equal(out.committed, [[True, True, False, False, False]])


def test_count_commits_exactly_the_first_positions_in_order():
  open_ = [[True, True, True, True, False]]
  for order, first_two in (("confidence", [False, True, True, False, False]),
                           ("left_to_right", [True, True, False, False, False])):
    out = _select(CONF, open_, 1.0, order=order, count=jnp.array([2]))
    np.testing.assert_array_equal(out.committed, [first_two])
  out = _select(CONF, open_, -1.0, count=jnp.array([0]))
  assert not out.committed.any()
  out = _select(CONF, open_, 1.0, count=jnp.array([9]))
  np.testing.assert_array_equal(out.committed, open_)
  with pytest.raises(ValueError, match="order='random' not in"):
    _select(CONF, open_, 1.0, order="random")


def _select_tokens(tokens, conf, masked, tau, canvas=None, **kw):
  """select() on given proposals and confidences (canvas: the block's tokens, default all MASK)."""
  conf = jnp.asarray(conf, jnp.float32)
  canvas = jnp.full(conf.shape, MASK) if canvas is None else canvas
  return commit.select(jnp.asarray(tokens, jnp.int32), jnp.log(conf),
                       jnp.asarray(canvas, jnp.int32),
                       jnp.asarray(masked, bool), tau, **kw)


# Positions 1, 2 and 4 all propose token 3; 4 is the most confident of them.
TOKENS = [[1, 3, 3, 2, 3]]
CONF_REP = [[0.5, 0.95, 0.97, 0.96, 0.99]]


def test_distinct_defers_a_token_proposed_at_a_more_confident_place():
  open_ = [[True, True, True, True, True]]
  out = _select_tokens(TOKENS, CONF_REP, open_, 0.9, order="distinct")
  np.testing.assert_array_equal(out.committed, [[False, False, False, True, True]])
  # The paper's rule commits all four above tau, token 3 at three places.
  out = _select_tokens(TOKENS, CONF_REP, open_, 0.9, order="confidence")
  np.testing.assert_array_equal(out.committed, [[False, True, True, True, True]])
  # A committed (closed) place does not defer an open one; tau < 0 (the capped step) commits all.
  out = _select_tokens(TOKENS, CONF_REP, [[True, True, True, True, False]], 0.9, order="distinct")
  np.testing.assert_array_equal(out.committed, [[False, False, True, True, False]])
  out = _select_tokens(TOKENS, CONF_REP, open_, -1.0, order="distinct")
  np.testing.assert_array_equal(out.committed, open_)
  # A token already in the block (token 3 committed at the closed place 4) is not new: its
  # places commit under the paper's rule.
  out = _select_tokens(TOKENS, CONF_REP, [[True, True, True, True, False]], 0.9,
                       canvas=[[MASK, MASK, MASK, MASK, 3]], order="distinct")
  np.testing.assert_array_equal(out.committed, [[False, True, True, True, False]])
  # The forced most-confident place commits below tau; without repeats it is 'confidence'.
  out = _select_tokens(TOKENS, CONF_REP, open_, 1.0, order="distinct")
  np.testing.assert_array_equal(out.committed, [[False, False, False, False, True]])
  out = _select(CONF, open_, 0.9, order="distinct")
  np.testing.assert_array_equal(out.committed, _select(CONF, open_, 0.9).committed)


def test_distinct_count_ranks_first_occurrences_before_repeats():
  open_ = [[True, True, True, True, True]]
  for n, want in ((2, [False, False, False, True, True]), (3, [True, False, False, True, True]),
                  (4, [True, False, True, True, True]), (5, open_[0])):
    out = _select_tokens(TOKENS, CONF_REP, open_, 1.0, order="distinct", count=jnp.array([n]))
    np.testing.assert_array_equal(out.committed, [want], err_msg=f"count={n}")
  # Closed places rank last: a count of the open places commits exactly those.
  half = [[False, True, True, False, True]]
  out = _select_tokens(TOKENS, CONF_REP, half, 1.0, order="distinct", count=jnp.array([3]))
  np.testing.assert_array_equal(out.committed, half)
