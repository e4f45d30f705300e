"""The rollouts (train/rollout.py): the model's own policy decides which, the policy's model, spec
and cap read through, the replay's round count, and no rollout of the lossless decoder. (Their
samples and log-probs: tests/train/test_rollouts.py, test_rl.py, test_opd.py.)"""

import subprocess
import sys

import pytest

from gr2jax.decoding.policy import ARPolicy, DiffusionPolicy, make_policy
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.train import rollout
from tests.train.toy_policy import AR, DIFFUSION


def test_make_rollout_is_the_rollout_of_the_models_own_policy():
  spec = DecodeSpec(block_size=4)
  ar = rollout.make_rollout(AR, spec, 10, temperature=0.5)
  assert isinstance(ar, rollout.ARRollout) and ar.policy == ARPolicy(AR, spec, 10)
  assert ar.temperature == 0.5
  assert (ar.config, ar.spec, ar.max_new_tokens) == (AR, spec, 10)
  assert ar.fields == rollout.SCORED_FIELDS
  student = rollout.make_rollout(DIFFUSION, spec, 10, shrink=2, temperature=1.0, tau=0.7)
  assert isinstance(student, rollout.DiffusionRollout)
  assert (student.temperature, student.tau) == (1.0, 0.7)
  assert student.policy == DiffusionPolicy(DIFFUSION, spec, 10)
  assert student.max_rounds == 2  # 3 steps, 2 per round
  assert "replay_rounds" in student.fields and "response_tokens" not in student.fields
  assert hash(student) == hash(rollout.make_rollout(DIFFUSION, spec, 10, shrink=2,
                                                    temperature=1.0, tau=0.7))  # jit-static
  with pytest.raises(ValueError, match="needs its commit threshold tau"):
    rollout.make_rollout(DIFFUSION, spec, 10, temperature=1.0)


def test_the_lossless_decoder_has_no_rollout():
  lossless = make_policy(DIFFUSION, DecodeSpec(block_size=4, draft_k=4), 10, verifier_config=AR)
  with pytest.raises(ValueError, match="LosslessPolicy"):
    rollout.of_policy(lossless, temperature=1.0)


def test_decoding_does_not_import_training():
  """Inference stands below training: importing the decoders loads no gr2jax.train module."""
  code = ("import sys, gr2jax.decoding.policy; "
          "print(sorted(m for m in sys.modules if m.startswith('gr2jax.train')))")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]"
