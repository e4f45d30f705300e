"""Constrained answer decoding: hand-made logits, then the decoder with a constraint."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.diffusion import constrain, decode
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params

V, MASK, START = 32, 31, 1  # START plays `</think>`
SLOTS = [10, 11, 12, 13]  # slot tokens; example candidates use 3 of them
SID = [[20, 21, 22], [23, 24, 25]]  # level-0 and level-1 SID tokens


def _allowed(constraint, response, targets):
  response, targets = np.asarray(response), np.asarray(targets)
  logits = jnp.zeros((response.shape[0], targets.shape[1], V))
  out = jax.jit(constrain.apply)(constraint, logits, jnp.asarray(targets), jnp.asarray(response))
  return [sorted(np.flatnonzero(np.isfinite(row)).tolist()) for row in np.asarray(out)[0]]


def test_slot_labels_in_answer_span_exclude_used_and_out_of_set():
  c = constrain.make_constraint([[[10], [11], [12]]], [SLOTS], V, START)
  others = [t for t in range(V) if t not in SLOTS]
  #            0  1      2   3     4     5
  response = [[5, START, 11, MASK, MASK, MASK]]
  rows = _allowed(c, response, [[1, 3, 4]])
  assert rows[0] == list(range(V))  # position 1 is not after the start token
  assert rows[1] == sorted(others + [10, 12])  # 13 out of set, 11 used
  assert rows[2] == rows[1]
  # Without a committed start token nothing is constrained.
  assert _allowed(c, [[5, MASK, 11, MASK, MASK, MASK]], [[3]])[0] == list(range(V))


def test_a_label_is_required_after_a_committed_opener_while_a_candidate_is_unused():
  opener = 7  # plays `","`
  c = constrain.make_constraint([[[10], [11], [12]]], [SLOTS], V, START, [opener])
  others = [t for t in range(V) if t not in SLOTS]
  #            0      1   2       3     4   5       6     7
  response = [[START, 11, opener, MASK, 12, opener, MASK, MASK]]
  rows = _allowed(c, response, [[3, 6, 7]])
  assert rows[0] == [10]  # after the opener: only the unused candidates' labels, 11 and 12 used
  assert rows[1] == [10]
  assert rows[2] == sorted(others + [10])  # no opener before it: labels restricted, rest free
  # Every candidate used: nothing is required after an opener (the JSON is already off).
  full = [[START, 10, opener, 11, opener, 12, opener, MASK]]
  assert _allowed(c, full, [[7]])[0] == others
  # An opener before the start token requires nothing.
  assert _allowed(c, [[opener, MASK, START, MASK]], [[1]])[0] == list(range(V))
  # SIDs: after an opener only level-0 tokens of unused candidates.
  sid = constrain.make_constraint([[[20, 23], [21, 24]]], SID, V, START, [opener])
  assert _allowed(sid, [[START, 20, 23, opener, MASK]], [[4]])[0] == [21]


def test_a_label_is_required_where_the_model_wants_one_and_commits_by_its_own_confidence():
  c = constrain.make_constraint([[[10], [11], [12]]], [SLOTS], V, START)
  #           0      1   2     3
  response = jnp.asarray([[START, 11, MASK, MASK]])
  targets = jnp.asarray([[2, 3]])
  logits = np.zeros((1, 2, V), np.float32)
  logits[0, 0, [11, 5, 12]] = [6.0, 3.0, 1.0]  # wants used 11; runner-up 5 (a newline) over 12
  logits[0, 1, [5, 11]] = [6.0, 3.0]  # wants 5: not a label position
  out = np.asarray(constrain.apply(c, jnp.asarray(logits), targets, response))
  assert sorted(np.flatnonzero(np.isfinite(out[0, 0])).tolist()) == [10, 12]
  assert np.isfinite(out[0, 1, 5]) and not np.isfinite(out[0, 1, 11])
  tokens, logp = constrain.propose(c, jnp.asarray(logits), targets, response, MASK, 0.0, None)
  assert np.asarray(tokens).tolist() == [[12, 5]]
  # The log-prob is the unconstrained model's: low where its preference was forbidden.
  free = np.asarray(jax.nn.log_softmax(jnp.asarray(logits).at[..., MASK].set(-jnp.inf)))
  np.testing.assert_allclose(np.asarray(logp), [[free[0, 0, 12], free[0, 1, 5]]], rtol=1e-6)


def test_the_span_ends_at_the_committed_end_of_turn():
  end = 9
  c = constrain.make_constraint([[[10], [11], [12]]], [SLOTS], V, START, answer_end_id=end)
  others = [t for t in range(V) if t not in SLOTS]
  #            0      1     2     3    4   5   6
  response = [[START, MASK, MASK, end, 10, 11, MASK]]
  rows = _allowed(c, response, [[1, 6]])
  assert rows[0] == sorted(others + [10, 11, 12])  # what follows the end uses no candidate
  assert rows[1] == list(range(V))  # after the end nothing is constrained


def test_label_openers_are_the_tokens_that_open_a_string_in_an_array():
  vocab = {'":["': 3, '","': 4, '"]': 5, '{"': 6, 'ranking': 7, ',': 8, '",Ġ"': 9, '"': 10}
  assert constrain.label_openers(vocab) == [3, 4, 9]
  with pytest.raises(ValueError, match="label opener is a label token"):
    constrain.make_constraint([[[10]]], [SLOTS], V, START, [10])


def test_sid_levels_follow_the_committed_prefix():
  labels = [[[20, 23], [20, 24], [21, 25]]]  # candidates: (20,23), (20,24), (21,25)
  c = constrain.make_constraint(labels, SID, V, START)
  non_label = [t for t in range(V) if t not in SID[0] + SID[1]]
  #            0      1   2   3     4   5     6
  response = [[START, 20, 23, MASK, 21, MASK, MASK]]
  rows = _allowed(c, response, [[3, 5, 6]])
  # After a complete SID: any level token of an unused candidate; (20, 23) is used.
  assert rows[0] == sorted(non_label + [20, 21, 24, 25])
  # After level-0 token 21: only level-1 tokens of candidates starting with 21.
  assert rows[1] == sorted(non_label + [25])
  assert rows[2] == sorted(non_label + [20, 21, 24, 25])


def test_bad_constraint_input():
  with pytest.raises(ValueError, match=r"\[B, N, L\]"):
    constrain.make_constraint([[[20, 23]]], [SID[0]], V, START)
  with pytest.raises(ValueError, match="not a token of its level"):
    constrain.make_constraint([[[23, 20]]], SID, V, START)


def test_decoder_respects_the_constraint():
  config = ModelConfig.tiny(vocab_size=V, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0,
                            block_size=4)
  params = init_params(config, jax.random.key(0))
  # answer_start_id = the decoder's first (seed) token, so every later position is in the span.
  prompts = jnp.array([[3, 4, 5, 6]] * 2, jnp.int32)
  lengths = jnp.array([4, 4], jnp.int32)

  def run(constraint=None, order="confidence"):
    decoding = decode.BlockDecoding(threshold=0.9 if order == "confidence" else 1.0,
                                    max_steps_per_block=8, max_new_tokens=12,
                                    commit_order=order, stop_token_ids=())
    return decode.block_diffusion_generate(params, config, prompts, lengths, decoding,
                                           steering=decode.Steering(constraint=constraint))

  free = np.asarray(run().tokens)
  start = int(free[0, 0])
  slots = [t for t in range(2, V - 1) if t != start][:4]
  c = constrain.make_constraint([[[slots[0]], [slots[1]]]] * 2, [slots], V, start)
  tokens = np.asarray(run(c).tokens)
  assert tokens[0, 0] == start
  span = tokens[0, 1:]
  assert not np.isin(span, slots[2:]).any()
  for s in slots[:2]:
    assert (span == s).sum() <= 1
  # With an opener (the free decode's most frequent token in the span), committed left to right
  # so each position is constrained by everything before it: after every opener an unused label
  # follows while one is left.
  values, counts = np.unique(free[0, 1:], return_counts=True)
  opener = int(values[np.argmax(counts)])
  slots = [t for t in range(2, V - 1) if t not in (start, opener)][:3]
  c = constrain.make_constraint([[[t] for t in slots]] * 2, [slots], V, start, [opener])
  tokens = np.asarray(run(c, order="left_to_right").tokens)
  assert tokens[0, 0] == start
  after = [i for i in range(2, tokens.shape[1]) if tokens[0, i - 1] == opener]
  assert after, "the opener never came: pick another"
  for i in after:
    used = set(tokens[0, 1:i].tolist()) & set(slots)
    if len(used) < len(slots):
      assert tokens[0, i] in set(slots) - used, (i, tokens[0].tolist())
