"""A tiny stage export of a small synthetic data build, written as a training stage writes it
(train/loop.export_data_build: the data build record with its SID digest, the inference bundle),
with the metadata the reranker reads (loop.export_metadata's data_config, decode, run lengths):
what the bundle, reranker and add_bundle tests load."""

import dataclasses
import json
import os
import shutil
import types

from gr2jax import exports
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.train import loop
from tests.apps.test_rerank import _model
from tests.data.test_pipeline import _config, write_dataset_with_sids


def build(tmp_path_factory) -> tuple:
  """(data config, its pipeline.run summary, the workdir it was built in)."""
  data_dir = write_dataset_with_sids(tmp_path_factory.mktemp("beauty"))
  config = _config(data_dir, data_dir / "sids.npy")
  workdir = str(tmp_path_factory.mktemp("work"))
  return config, pipeline.run(config, workdir), workdir


def write_export(path: str, config, summary) -> None:
  """A random 1-layer AR model of the build's tokenizer, exported at `path` with its bundle."""
  tokenizer = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  model_config, params = _model(tokenizer, diffusion=False)
  ctx = types.SimpleNamespace(summary=summary, config=types.SimpleNamespace(data=config),
                              tokenizer=tokenizer)
  data_build, write_bundle = loop.export_data_build(ctx)
  metadata = {"stage": "sft", "kind": "ar", "step": 0, "data_build": data_build,
              "run": {"lengths": list(lengths_lib.static_lengths(summary))},
              "data_config": config.to_dict(), "decode": dataclasses.asdict(DecodeSpec())}
  exports.save(path, model_config, params, metadata=metadata, write_more=write_bundle)


def copy_without_bundle(export: str, out: str) -> str:
  """A copy of `export` at `out` as exports were written before they carried a bundle (no
  inference/, no tokenizer files, no bundle digest in the metadata); returns `out`."""
  keep = {exports.CONFIG_FILE, exports.METADATA_FILE, exports.PARAMS_DIR}
  shutil.copytree(export, out, ignore=lambda d, names: [
    n for n in names if d == export and n not in keep])
  metadata = exports.load_metadata(out)
  del metadata[bundle.RECORD_DIGEST]
  with open(os.path.join(out, exports.METADATA_FILE), "w") as f:
    json.dump(metadata, f, indent=1)
  assert not os.path.exists(os.path.join(out, bundle.DIRECTORY))
  return out
