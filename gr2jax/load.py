"""`load_model`: (config, params) from a gr2jax export or a local HF Qwen3 directory;
`check_model_dir`: a model path refused before anything loads; `find_tokenizer`: the tokenizer an
export was trained with.

The one loader every command and the public API use: an export (gr2jax/exports.py) is restored,
an HF directory is converted in memory with the table of gr2jax/hf/table.py (the one
weights_conversion/convert_hf.py streams to disk).
"""

import glob
import json
import os
from typing import Any

import jax

from gr2jax import exports
from gr2jax import workdir as workdir_lib
from gr2jax.hf import weights as hf_weights
from gr2jax.model.config import ModelConfig


def load_model(path: str, shardings: Any = None, param_dtype: str | None = None
               ) -> tuple[ModelConfig, Any]:
  """Loads (config, params) from a gr2jax checkpoint or a local HF Qwen3 directory.

  An HF directory (config.json + safetensors or pytorch_model*.bin) is converted in memory with
  the table of gr2jax/hf/table.py (the one weights_conversion/convert_hf.py streams to disk).

  Args:
    path: a gr2jax checkpoint directory or an HF model directory.
    shardings: optional pytree of shardings for the params (see `exports.restore`).
    param_dtype: HF directories only: 'float32' or 'bfloat16' (default: the checkpoint's dtype).

  Returns:
    (config, params) with params a pytree of jax Arrays.

  Raises:
    exports.CheckpointError: `path` is neither kind of directory, or the model is damaged (for
      an HF directory: a bad config.json, missing, unmapped, non-float or wrongly shaped
      tensors, a truncated or unreadable weight file, a tokenizer.json with ids past vocab_size
      or without the eos / pad ids); the message names the path and the file or tensor.
    TypeError: `path` is not a string or os.PathLike.
  """
  if not isinstance(path, (str, os.PathLike)):
    raise TypeError(f"load_model: path must be a directory path, got {type(path).__name__}")
  path = os.fspath(path)
  if os.path.isfile(os.path.join(path, exports.CONFIG_FILE)):
    if param_dtype is not None:
      raise exports.CheckpointError(f"{path}: param_dtype applies to HF directories only")
    return exports.restore(path, shardings)
  if os.path.isfile(os.path.join(path, "config.json")):
    try:
      config = hf_weights.read_config(path, param_dtype)
      hf_weights.check_tokenizer(path, config)
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      with hf_weights.HFWeights(path) as weights:  # one host leaf at a time
        leaves = [(p, jax.device_put(leaf, device if shardings is None
                                     else exports.sharding_at(shardings, p, path)))
                  for p, leaf in hf_weights.iter_leaves(config, weights)]
    except exports.CheckpointError:
      raise
    except (OSError, ValueError) as e:  # missing shards, bad JSON, table / safetensors errors
      raise exports.CheckpointError(f"{path}: cannot load HF directory: {e}") from e
    return config, exports.unflatten(leaves)
  raise exports.CheckpointError(f"{path}: neither a gr2jax checkpoint ({exports.CONFIG_FILE}) "
                                "nor an HF directory (config.json)")


def check_model_dir(path: str, field: str) -> None:
  """Refuses, before anything is read or built, a path that is not a model directory: what a
  command checks its model fields with (rerank.ckpt, serve.ckpt, their verify_with), so a
  misspelt export is named at once, not after a data build in the workdir.

  Args:
    path: the directory the field names ('{workdir}' filled in: workdir.fill_path).
    field: how the message names the field, e.g. 'serve.ckpt'.

  Raises:
    exports.CheckpointError: one line naming the field and the path.
  """
  if not os.path.isdir(path):
    what = "is not a directory" if os.path.exists(path) else "does not exist"
    raise exports.CheckpointError(f"{field}={path}: {what} (pass a gr2jax export or an HF Qwen3 "
                                  "directory)")
  if not (os.path.isfile(os.path.join(path, exports.CONFIG_FILE))
          or os.path.isfile(os.path.join(path, "config.json"))):
    raise exports.CheckpointError(f"{field}={path}: neither a gr2jax checkpoint "
                                  f"({exports.CONFIG_FILE}) nor an HF directory (config.json)")


def _has_tokenizer(directory: str) -> bool:
  return os.path.isfile(os.path.join(directory, hf_weights.TOKENIZER_JSON))


def find_tokenizer(ckpt: str, tokenizer_dir: str | None = None) -> str:
  """The directory of the tokenizer an export was trained with: `tokenizer_dir` if given, else
  the export's own tokenizer files (a converted checkpoint has them, and a stage export with its
  inference bundle, decoding/bundle.py), else, for a stage export W/<stage>/export, the tokenizer
  of W's last data build (W/summary.json) or of another data build cached in W
  (W/tokenizer-<key>/); only read there. A tokenizer whose vocabulary is not the one the export
  records (exports.recorded_vocab_digest) is not taken.

  Raises:
    FileNotFoundError: --tokenizer_dir has no tokenizer.json, or no tokenizer was found.
    ValueError: --tokenizer_dir's vocabulary is not the one the export records.
  """
  recorded = exports.recorded_vocab_digest(exports.load_metadata(ckpt).get("data_build") or {})
  if tokenizer_dir is not None:
    if not _has_tokenizer(tokenizer_dir):
      raise FileNotFoundError(f"--tokenizer_dir={tokenizer_dir}: no tokenizer.json")
    candidates = [tokenizer_dir]
  else:
    workdir = os.path.dirname(os.path.dirname(os.path.abspath(ckpt)))
    summary = os.path.join(workdir, "summary.json")
    build = None
    if os.path.isfile(summary):  # its paths "{workdir}/..." (data/pipeline.py), or absolute
      with open(summary) as f:
        build = workdir_lib.fill_path(json.load(f)["paths"]["tokenizer"], workdir)
    builds = sorted(glob.glob(os.path.join(workdir, "tokenizer-*")))  # every cached build
    # each directory once (the summary's build is also a cached one): its vocabulary is hashed
    candidates = [d for d in dict.fromkeys(os.path.normpath(d) for d in (ckpt, build, *builds)
                                           if d) if _has_tokenizer(d)]
  for source in candidates:
    digest = exports.vocab_digest(hf_weights.load_tokenizer_json(source))
    if not recorded or digest == recorded:
      return source
    if source == tokenizer_dir:
      raise ValueError(f"--tokenizer_dir={source}: its vocabulary (vocab_sha256 {digest[:16]}) "
                       f"is not the one {ckpt} was trained with ({recorded[:16]}); pass that "
                       "data build's tokenizer directory (W/tokenizer-<key>/)")
  raise FileNotFoundError(f"{ckpt}: no tokenizer found: no {hf_weights.TOKENIZER_JSON} in it, and "
                          f"no data build in its workdir {workdir} (summary.json, tokenizer-*/) "
                          "with its vocabulary; pass --tokenizer_dir=<the data build's tokenizer "
                          "directory, W/tokenizer-<key>/>")
