"""The tools' and studies' shared fixture (experiments/export_reads.py and the studies that read
an export through it): two data builds of one toy dataset whose tokenizers differ, and a
block-diffusion export of the first recorded as a training stage records it."""

import copy
import types

import pytest

from gr2jax import exports
from gr2jax.data import pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.train import loop
from tests.apps.test_rerank import _model
from tests.decoding import tiny_export


@pytest.fixture(scope="session")
def two_builds(tmp_path_factory):
  """(workdir: the export's data build, other: a build of the same data with a 600-token
  tokenizer, export: a random 1-layer block-diffusion export of `workdir`'s build whose
  metadata records its data build with the SIDs digest, as loop.export_data_build writes it)."""
  config, summary, workdir = tiny_export.build(tmp_path_factory)
  other_config = copy.deepcopy(config)
  other_config.tokenizer_vocab_size = 600  # the toy data's own vocabulary is larger
  other = str(tmp_path_factory.mktemp("other_build"))
  pipeline.run(other_config, other)
  tokenizer = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  model_config, params = _model(tokenizer, diffusion=True)
  ctx = types.SimpleNamespace(summary=summary, config=types.SimpleNamespace(data=config),
                              tokenizer=tokenizer)
  data_build, _ = loop.export_data_build(ctx)
  export = str(tmp_path_factory.mktemp("cft") / "export")
  exports.save(export, model_config, params,
               metadata={"stage": "cft", "kind": "diffusion", "data_build": data_build})
  return types.SimpleNamespace(workdir=workdir, other=other, export=export)
