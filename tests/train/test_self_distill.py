"""Self-distillation targets (gr2jax/train/self_distill.py): the model's own greedy slow decode,
valid answers kept and weighted, invalid ones masked out; CFT's loss then trains on them."""

import functools

import jax
import numpy as np

from gr2jax.decoding import policy as policy_lib
from gr2jax.train import cft, rewards, self_distill
from tests.train import toy_policy
from tests.train.toy_policy import BATCH, LABELS, STOP, AnswerTokenizer


def test_targets_are_the_policys_own_valid_slow_decode_answers():
  _, student, _ = toy_policy.toy_params()
  policy = toy_policy.STUDENT.policy
  rows = BATCH.replace(response_tokens=np.zeros((2, 10), np.int32))
  prepare = self_distill.targets(policy, AnswerTokenizer(), [LABELS, LABELS], pad_id=0)
  batch, stats = prepare(student, rows, None)
  out = policy.decode(policy.decoding_params(student), BATCH.prompt_tokens, BATCH.prompt_lengths)
  lengths = np.asarray(out.lengths)
  _, valid, _ = rewards.rollout_rewards(AnswerTokenizer(), out.tokens, lengths,
                                        [LABELS, LABELS], BATCH.target_position, STOP)
  np.testing.assert_array_equal(batch.response_lengths, lengths)
  for b in range(2):
    np.testing.assert_array_equal(batch.response_tokens[b, :lengths[b]], out.tokens[b, :lengths[b]])
    assert np.all(batch.response_tokens[b, lengths[b]:] == 0)
    assert batch.response_weights[b].sum() == (lengths[b] if valid[b] else 0)
  np.testing.assert_array_equal(batch.example_mask, valid)
  assert stats["self_valid_rate"] == valid.mean()
  assert stats["self_forwards_per_token"] == out.nfe.sum() / lengths.sum()
  assert prepare(student, rows, None)[1] == stats  # greedy: the key plays no part
  # CFT's loss reads exactly these fields and weighs only the kept answers.
  loss = functools.partial(cft.cft_loss, config=toy_policy.DIFFUSION, certainty=2.0)
  total, weight, _ = loss(student, batch.select(cft.FIELDS), jax.random.key(0))
  assert float(weight) == batch.response_weights.sum() and np.isfinite(float(total))


def test_padding_rows_are_never_trained_on():
  _, student, _ = toy_policy.toy_params()
  rows = BATCH.replace(response_tokens=np.zeros((2, 10), np.int32),
                       example_mask=np.array([True, False]))
  prepare = self_distill.targets(toy_policy.STUDENT.policy, AnswerTokenizer(), [LABELS, LABELS],
                                 pad_id=0)
  batch, _ = prepare(student, rows, None)
  assert not batch.example_mask[1] and batch.response_weights[1].sum() == 0
  assert isinstance(toy_policy.STUDENT.policy, policy_lib.DiffusionPolicy)
