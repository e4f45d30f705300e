"""OPD on a tiny 1-layer model (fp32, CPU): KL vs the teacher, teacher scoring, a toy update.

Decoder shapes match tests/diffusion/test_replay.py (2 rows, prompt 6, 10 new tokens, B = 4,
temperature 1) so the sampled decoder compiles once for both modules.
"""

import dataclasses
import functools

import jax
import numpy as np
import pytest

from gr2jax import stage_registry
from gr2jax.data.batches import Batch
from gr2jax.decoding.policy import DiffusionPolicy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import layout, replay
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import opd, rollouts
from gr2jax.train.rollout import DiffusionRollout

MASK = 63
CONFIG = ModelConfig.tiny(
  vocab_size=64, num_layers=1, block_size=4, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0
)
TEACHER = dataclasses.replace(CONFIG, block_size=1, mask_token_id=None)  # the AR model
PROMPTS = np.array([[5, 6, 7, 8, 9, 0], [10, 11, 12, 0, 0, 0]], np.int32)
LENGTHS = np.array([5, 3], np.int32)
BATCH = Batch(prompt_tokens=PROMPTS, prompt_lengths=LENGTHS, example_mask=np.ones(2, bool))
SPEC = DecodeSpec(block_size=4, max_steps_per_block=8)
STUDENT = DiffusionRollout(DiffusionPolicy(CONFIG, SPEC, max_new_tokens=10), temperature=1.0,
                           tau=0.03)


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _loss_fn(policy):
  return jax.jit(functools.partial(opd.opd_loss, rollout=policy))


def _prepare(params, key, teacher_params, policy=STUDENT, group_size=1, chunk_rows=0, **kwargs):
  teacher = opd.teacher(teacher_params, TEACHER, mask_token_id=MASK, **kwargs)
  return rollouts.prepare(params, BATCH, key, rollout=policy, group_size=group_size,
                          teacher=teacher, chunk_rows=chunk_rows)


def test_kl_is_zero_when_the_student_is_the_teacher_with_block_size_one(params):
  student = DiffusionRollout(DiffusionPolicy(dataclasses.replace(CONFIG, block_size=1),
                                             dataclasses.replace(SPEC, block_size=1),
                                             max_new_tokens=10), temperature=1.0, tau=0.03)
  train, stats = _prepare(params, jax.random.key(2), params, policy=student)
  assert train.teacher_log_probs.shape == (2, 10, 64) and stats["response_len"] == 10
  assert train.replay_rounds == replay.Rounds(0)
  loss_sum, weight, aux = _loss_fn(student)(params, train, jax.random.key(0))
  assert abs(float(loss_sum)) < 1e-5 and float(weight) == 2.0
  np.testing.assert_allclose(aux["student_logp"], aux["teacher_logp"], atol=1e-5)
  # The teacher's scores of the sampled tokens are what the B = 1 decoder sampled them with.
  picked = np.take_along_axis(train.teacher_log_probs, train.trace_tokens[..., None], -1)
  np.testing.assert_allclose(picked[..., 0], train.commit_logprob, atol=2e-5)


def test_gradient_moves_a_toy_student_toward_the_teacher(params):
  teacher_params = init_params(TEACHER, jax.random.key(1))
  train, _ = _prepare(params, jax.random.key(3), teacher_params)
  loss_fn = _loss_fn(STUDENT)
  step = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, train, jax.random.key(0))[0]))
  p, kls = params, []
  for _ in range(5):
    kl, grads = step(p)
    kls.append(float(kl))
    p = jax.tree.map(lambda x, g: x - 0.5 * g, p, grads)
  assert kls[0] > 0.1 and all(b < a for a, b in zip(kls, kls[1:], strict=False))
  assert kls[-1] < 0.8 * kls[0]


def test_prepare_refuses_greedy_rollouts(params):
  greedy = DiffusionRollout(DiffusionPolicy(CONFIG, SPEC, 10), temperature=0.0, tau=0.03)
  with pytest.raises(ValueError, match="temperature"):
    _prepare(params, jax.random.key(0), params, policy=greedy)
  with pytest.raises(ValueError, match="AR"):
    opd.teacher_log_probs(params, CONFIG, PROMPTS, LENGTHS, PROMPTS, LENGTHS, mask_token_id=MASK)


def test_teacher_dtypes_are_the_settings_choices():
  assert opd.TEACHER_DTYPES["float32"] == np.float32
  assert opd.TEACHER_DTYPES["bfloat16"] == jax.numpy.bfloat16
  for name in opd.TEACHER_DTYPES:  # every storage dtype is a value of the setting
    assert stage_registry.OPDSettings(teacher_dtype=name).teacher_dtype == name
  with pytest.raises(ValueError, match=r"opd.teacher_dtype='fp16' not in \('float32', "):
    stage_registry.OPDSettings.of({"teacher_dtype": "fp16"}, "opd.")


def test_chunked_prepare_scores_like_one_call(params):
  """6 trajectories in calls of 4 rows (the last padded): the teacher's cached distributions equal
  one unchunked teacher call on the same trajectories; bf16 storage rounds them."""
  teacher_params = init_params(TEACHER, jax.random.key(1))
  train, _ = _prepare(params, jax.random.key(3), teacher_params, group_size=3, chunk_rows=4)
  assert train.trace_tokens.shape == (6, 10)
  assert isinstance(train.replay_rounds, replay.Rounds)
  whole = opd.teacher_log_probs(teacher_params, TEACHER, train.prompt_tokens,
                                train.prompt_lengths, train.trace_tokens,
                                train.response_lengths, mask_token_id=MASK)
  np.testing.assert_allclose(train.teacher_log_probs, whole, atol=1e-6)
  half, _ = _prepare(params, jax.random.key(3), teacher_params, group_size=3, chunk_rows=4,
                     dtype=opd.TEACHER_DTYPES["bfloat16"])
  assert half.teacher_log_probs.dtype == jax.numpy.bfloat16
  np.testing.assert_array_equal(half.trace_tokens, train.trace_tokens)  # same rollouts
  np.testing.assert_array_equal(half.teacher_log_probs,
                                train.teacher_log_probs.astype(jax.numpy.bfloat16))


def test_left_to_right_steps_keep_seeds_and_never_committed_slots():
  never, seed = replay.NEVER_STEP, replay.SEED_STEP
  steps = np.array([[seed, 2, 0, 1, seed, 0, never, never]])
  np.testing.assert_array_equal(opd.left_to_right_steps(steps, 4),
                                [[seed, 0, 1, 2, seed, 0, never, never]])
  with pytest.raises(ValueError, match="opd.context='left' not in"):
    stage_registry.OPDSettings.of({"context": "left"}, "opd.")


def test_left_clean_context_reads_each_token_with_its_left_context_clean(params):
  """Each distilled token t of the 'left_clean' replay scores as one forward of [prompt |
  clean blocks before t's | t's block with o_<t clean and the rest masked] would."""
  train, _ = _prepare(params, jax.random.key(4), params)
  left = opd.student_context(train, "left_clean", STUDENT)
  assert opd.student_context(train, "commit_step", STUDENT) is train
  logp, _ = STUDENT.log_probs(params, left, temperature=0.0)
  steps = np.asarray(left.commit_step)
  b_size = CONFIG.block_size
  checked = 0
  for row in range(2):
    for t in range(train.trace_tokens.shape[1]):
      if steps[row, t] in (replay.SEED_STEP, replay.NEVER_STEP):
        continue
      j = np.arange(train.trace_tokens.shape[1])
      noisy = (j >= t) & (j // b_size == t // b_size) | (j // b_size > t // b_size)
      inputs = layout.two_stream_inputs(
        CONFIG, PROMPTS[row:row + 1], LENGTHS[row:row + 1], train.trace_tokens[row:row + 1],
        train.response_lengths[row:row + 1], noisy[None])
      r = layout.padded_width(len(j), b_size)
      queries = np.array([[PROMPTS.shape[1] + r + t - 1]])
      want, _ = layout.score(params, CONFIG, inputs, queries,
                             train.trace_tokens[row:row + 1, t:t + 1])
      np.testing.assert_allclose(logp[row, t], want[0, 0], atol=2e-5)
      checked += 1
  assert checked >= 10
