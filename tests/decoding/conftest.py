"""The tiny bundled export of the decoding tests (tests/decoding/tiny_export.py), built once."""

import types

import pytest

from tests.decoding import tiny_export


@pytest.fixture(scope="session")
def bundled(tmp_path_factory):
  """(config: the data config, summary: its build's, workdir: where it was built, export: a
  stage export of it with its inference bundle). Tests change copies of the export only."""
  config, summary, workdir = tiny_export.build(tmp_path_factory)
  export = str(tmp_path_factory.mktemp("stage") / "export")
  tiny_export.write_export(export, config, summary)
  return types.SimpleNamespace(config=config, summary=summary, workdir=workdir, export=export)
