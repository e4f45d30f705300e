"""The toy tokenizer every serving test shares (saved to disk: the subprocess server reads it)."""

import pytest

from tests.train.toy import toy_tokenizer


@pytest.fixture(scope="session")
def tok_dir(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("serve_tok"))
  toy_tokenizer(out)
  return out
