"""Session fixtures of the training tests."""

import pytest

from tests.train.toy_policy import prepare_all


@pytest.fixture(scope="session")
def prepared():
  """The three on-policy prepares on the toy models (tests/train/toy_policy.py prepare_all)."""
  return prepare_all()
