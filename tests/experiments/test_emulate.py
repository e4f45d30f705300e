"""experiments/emulate.py: recorded runs replayed through the decoders' own steps."""

import dataclasses
import inspect

import jax
import numpy as np
import pytest

from experiments import emulate
from gr2jax.diffusion import decode, speculative
from gr2jax.model import qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.params import init_params
from tests.diffusion import helpers
from tests.diffusion.test_decode import CONFIG, LENGTHS, MAX_NEW, PROMPTS

CONFIG = dataclasses.replace(CONFIG, block_size=4)

DECODING = decode.BlockDecoding(threshold=1.0, max_steps_per_block=8, max_new_tokens=MAX_NEW,
                                stop_token_ids=())


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _decode(params, threshold):
  return helpers.generate(params, CONFIG, PROMPTS, LENGTHS, threshold=threshold,
                          **{f.name: getattr(DECODING, f.name) for f in dataclasses.fields(
                            DECODING) if f.name != "threshold"})


def _padded(schedule):
  width = max(map(len, schedule))
  return np.asarray([r + [1] * (width - len(r)) for r in schedule])


def test_production_decoders_carry_no_emulation():
  """The block-diffusion decoder is steered by a constraint and a response prefix only, and the
  draft-and-verify module has no replay: a schedule or a prefilled cache is the emulator's."""
  assert [f.name for f in dataclasses.fields(decode.Steering)] == ["constraint",
                                                                   "response_prefix"]
  for name in ("speculative_replay", "prefill", "schedule_from_output", "first_divergence"):
    assert not hasattr(speculative, name), name
  # The loops take no commit hook: a replay is a strategy of its own (emulate.RecordedCounts,
  # emulate.RecordedRules) where the decoder's goes (decode.Threshold, speculative.DecoderRules).
  assert list(inspect.signature(decode.decode_loop).parameters) == [
    "params", "config", "inputs", "static", "logits", "cache"]
  assert list(inspect.signature(decode.loop_step).parameters) == [
    "params", "config", "inputs", "static", "s"]
  assert speculative.Rules.__abstractmethods__ == {"draft_select", "accept"}
  for name in ("draft_steps", "draft_count", "ended"):
    assert not hasattr(speculative.DecoderRules, name), name
  assert issubclass(emulate.RecordedCounts, decode.CommitSchedule)
  assert issubclass(emulate.RecordedRules, speculative.Rules)


def test_speculative_replay_checks_its_schedule_and_prefill():
  """A schedule of the wrong shape or range, and a prefill of other sizes, name the argument
  before anything runs."""
  ar = dataclasses.replace(CONFIG, block_size=1, mask_token_id=None)
  weights = init_params(ar, jax.random.key(0))
  drafter, verifier = speculative.Model(weights, CONFIG), speculative.Model(weights, ar)
  spec = speculative.DraftDecoding(max_new_tokens=MAX_NEW, k=4)
  run = lambda schedule, **kw: emulate.speculative_replay(
    drafter, verifier, PROMPTS, LENGTHS, spec, schedule, **kw)
  with pytest.raises(ValueError, match="speculative_replay: schedule"):
    run(np.zeros((3, 4, 2), np.int32))
  with pytest.raises(ValueError, match="speculative_replay: schedule"):
    run(np.full((2, 4, 2), -2, np.int32))
  prefilled = emulate.speculative_prefill(drafter, verifier, PROMPTS, LENGTHS,
                                          dataclasses.replace(spec, max_new_tokens=MAX_NEW - 4))
  with pytest.raises(ValueError, match=r"prefilled\[0\] must be a KVCache of 2 rows and 18 "
                                       r"slots \(speculative_prefill\)"):
    run(np.zeros((2, 4, 2), np.int32), prefilled=prefilled)


def test_replayed_schedule_reproduces_the_decode(params):
  """A decode's recorded schedule, replayed on the same weights, commits the same tokens at the
  same steps (the threshold rule commits the most confident positions: a count of them)."""
  out = _decode(params, threshold=0.026)
  schedule = emulate.schedule_from_trace(out.commit_step, out.lengths, 4)
  assert [sum(r) for r in schedule] == [MAX_NEW - MAX_NEW // 4] * 2
  assert min(map(len, schedule)) < 3 * MAX_NEW // 4  # some steps commit several tokens
  replay_out = emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, _padded(schedule))
  np.testing.assert_array_equal(replay_out.tokens, out.tokens)
  np.testing.assert_array_equal(replay_out.commit_step, out.commit_step)
  np.testing.assert_array_equal(replay_out.nfe, out.nfe)
  # A schedule committing one token per step is tau = 1.0.
  ones = emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, np.ones((2, 9), np.int32))
  np.testing.assert_array_equal(ones.commit_step, _decode(params, threshold=1.0).commit_step)
  with pytest.raises(ValueError, match=r"emulate.replay: schedule must be an int array \[2"):
    emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, np.ones((3, 4), np.int32))
  with pytest.raises(ValueError, match="negative commit count -1"):
    emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, -np.ones((2, 4), np.int32))


def test_prefilled_cache_decodes_as_the_prefill_inside(params):
  ones = np.ones((2, 9), np.int32)
  out = emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, ones)
  cache = init_cache(CONFIG, 2, PROMPTS.shape[1] + MAX_NEW)
  logits, cache = qwen3.ragged_prefill(params, CONFIG, PROMPTS, LENGTHS, cache)
  again = emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, ones,
                         prefilled=(cache, logits))
  for field in ("tokens", "commit_step", "nfe"):
    np.testing.assert_array_equal(getattr(again, field), getattr(out, field), err_msg=field)
  with pytest.raises(ValueError, match=r"prefilled\[1\] must be logits \[2, 64\]"):
    emulate.replay(params, CONFIG, PROMPTS, LENGTHS, DECODING, ones,
                   prefilled=(cache, logits[:, :5]))
  with pytest.raises(ValueError, match="cache_size=30 != the prefilled cache's 18 slots"):
    emulate.replay(params, CONFIG, PROMPTS, LENGTHS,
                   dataclasses.replace(DECODING, cache_size=30), ones, prefilled=(cache, logits))
