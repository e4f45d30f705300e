"""DecodeSpec: paper defaults, and every bad field named."""

import pytest

from gr2jax.train.policy import DecodeSpec


def test_paper_defaults():
  spec = DecodeSpec()
  assert (spec.block_size, spec.eval_tau, spec.rollout_tau, spec.max_steps_per_block) == (
    32, 1.0, 0.9, 64)


@pytest.mark.parametrize("field,value", [
  ("block_size", 0), ("block_size", 2.0), ("max_steps_per_block", 0), ("eval_tau", 0.0),
  ("eval_tau", 1.5), ("rollout_tau", float("nan")), ("temperature", -1.0),
  ("temperature", float("inf"))])
def test_bad_fields_are_named(field, value):
  with pytest.raises(ValueError, match=f"DecodeSpec.{field}"):
    DecodeSpec(**{field: value})
