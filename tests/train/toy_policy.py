"""Toy models, prompts and a toy tokenizer for the on-policy tests (rollouts, RL, OPD).

1-layer models over a 64-token vocabulary: an AR model (AR RL, the OPD teacher) and a B = 4
diffusion student, with six stop tokens so most rollouts stop. `AnswerTokenizer` decodes any
token sequence to a valid, a malformed or a shifted ranking of LABELS, so the real GR2 reward
(train/rewards.py) gives varied rewards, and group advantages that are not all zero, on an
untrained model. `prepare_all` runs the three on-policy prepares (tests/train/conftest.py's
session fixture `prepared`: the decoders and scorers compile once for test_rollouts.py,
test_rl.py and test_opd.py).
"""

import dataclasses
import json

import jax
import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.decoding.policy import ARPolicy, DiffusionPolicy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import opd, rl, rollouts
from gr2jax.train.rollout import ARRollout, DiffusionRollout

STOP = (2, 3, 4, 5, 6, 7)
AR = ModelConfig.tiny(vocab_size=64, num_layers=1, eos_token_ids=STOP, pad_token_id=0)
DIFFUSION = dataclasses.replace(AR, block_size=4, mask_token_id=63)
TEACHER = AR  # the frozen AR teacher of OPD (its own seed)
ROUNDS = 3  # replay.rounds_needed(4, 8): B = 4, 8 steps per block
LABELS = ("<slot_0>", "<slot_1>", "<slot_2>", "<slot_3>")
BATCH = Batch(prompt_tokens=np.array([[10, 11, 12, 13, 14, 0], [20, 21, 22, 0, 0, 0]], np.int32),
              prompt_lengths=np.array([5, 3], np.int32), example_mask=np.ones(2, bool),
              example_index=np.array([0, 1], np.int32),
              target_position=np.array([1, 2], np.int32))


class AnswerTokenizer:
  """decode(ids): a malformed answer when sum(ids) % 4 == 0, else LABELS rotated by sum(ids)."""

  def decode(self, ids, skip_special_tokens=False):
    s = int(sum(ids))
    if s % 4 == 0:
      return "no answer"
    ranking = [LABELS[(i + s) % len(LABELS)] for i in range(len(LABELS))]
    return "<think>\n</think>\n\n" + json.dumps({"ranking": ranking})


def toy_params():
  """(AR params, diffusion student params, AR teacher params), seeded."""
  init = jax.jit(init_params, static_argnums=0)
  return init(AR, jax.random.key(0)), init(DIFFUSION, jax.random.key(0)), init(
    TEACHER, jax.random.key(1))


AR_POLICY = ARRollout(ARPolicy(AR, DecodeSpec(block_size=1), max_new_tokens=10), temperature=1.0)
STUDENT = DiffusionRollout(DiffusionPolicy(DIFFUSION, DecodeSpec(
  block_size=4, max_steps_per_block=8), 10), temperature=1.0, tau=0.03)
REWARDS = rl.answer_rewards(AnswerTokenizer(), [LABELS, LABELS], STOP, alpha=0.2)


def prepare_all():
  """{'params': toy_params(), stage: (train batch, stats)} for 'ar' (AR RL), 'rl' (diffusion RL)
  and 'opd': 2 prompts x G rollouts (3; OPD 2) in calls of 4 rows, the last padded."""
  ar_params, student, teacher = toy_params()
  return {
    "params": (ar_params, student, teacher),
    "ar": rollouts.prepare(ar_params, BATCH, jax.random.key(1), rollout=AR_POLICY, group_size=3,
                           reward_fn=REWARDS, chunk_rows=4),
    "rl": rollouts.prepare(student, BATCH, jax.random.key(4), rollout=STUDENT, group_size=3,
                           reward_fn=REWARDS, chunk_rows=4),
    "opd": rollouts.prepare(
      student, BATCH, jax.random.key(3), rollout=STUDENT, group_size=2, chunk_rows=4,
      teacher=opd.teacher(teacher, TEACHER, mask_token_id=DIFFUSION.mask_token_id)),
  }


def sft_batch():
  """Two SFT rows (inputs.make_batch's fields): prompts of 3 and 4 tokens, responses of 5 and 4
  tokens with lambda weights."""
  tokens = np.array([[5, 6, 7, 8, 9, 10, 11, 12, 0], [13, 14, 15, 16, 17, 18, 19, 20, 0]],
                    np.int32)
  prompt_lengths = np.array([3, 4], np.int32)
  response_lengths = np.array([5, 4], np.int32)
  p, r = 4, 5
  prompt_tokens = np.zeros((2, p), np.int32)
  response = np.zeros((2, r), np.int32)
  weights = np.zeros((2, r), np.float32)
  for b, (lp, lr) in enumerate(zip(prompt_lengths, response_lengths, strict=True)):
    prompt_tokens[b, :lp] = tokens[b, :lp]
    response[b, :lr] = tokens[b, lp:lp + lr]
    weights[b, :lr] = [0.5] * (lr - 2) + [1.0, 1.0]
  return Batch(prompt_tokens=prompt_tokens, prompt_lengths=prompt_lengths,
               example_mask=np.ones(2, bool), response_tokens=response,
               response_lengths=response_lengths, response_weights=weights)
