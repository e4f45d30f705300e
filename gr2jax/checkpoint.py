"""Save / restore (config, params) with orbax, and `load_model` for orbax or HF directories.

A gr2jax checkpoint directory holds:
  gr2jax_config.json   the ModelConfig fields (plus "format": "gr2jax")
  params/              an orbax StandardCheckpointer tree (the param pytree of WORKSPACE.md)
  (tokenizer files)    copied by weights_conversion/convert_hf.py when the HF dir had them
The config is not named `config.json` so that transformers' Auto* classes never mistake the
directory for an HF one.

Writes are atomic: everything goes to a hidden temp directory next to the target, which is renamed
into place only when complete; an existing checkpoint is replaced only after the new one is
complete, so a crash never leaves a half-written or lost checkpoint at `path`.
"""

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from gr2jax.model.config import ModelConfig

CONFIG_FILE = "gr2jax_config.json"
PARAMS_DIR = "params"
_FORMAT = "gr2jax"


class CheckpointError(ValueError):
  """A checkpoint is missing, incomplete or unreadable; the message names the path."""


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
  """The JSON-able dict of a ModelConfig (tuples become lists)."""
  d = dataclasses.asdict(config)
  d["eos_token_ids"] = list(config.eos_token_ids)
  return {"format": _FORMAT, **d}


def config_from_dict(d: Mapping[str, Any], source: str = "config") -> ModelConfig:
  """Inverse of `config_to_dict`; unknown or missing fields are an error naming `source`."""
  d = dict(d)
  if d.pop("format", None) != _FORMAT:
    raise CheckpointError(f"{source}: not a gr2jax config (missing \"format\": \"{_FORMAT}\")")
  names = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise CheckpointError(f"{source}: unknown ModelConfig field(s) {unknown}")
  d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
  try:
    return ModelConfig(**d)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{source}: {e}") from None


def write_checkpoint(directory: str, config: ModelConfig, params: Any) -> None:
  """Writes config + params into an existing, empty `directory` (no atomicity; see `save`).

  Args:
    directory: the (temporary) checkpoint directory.
    config: the model config.
    params: the param pytree (numpy or jax arrays).
  """
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(config_to_dict(config), f, indent=2)
  with ocp.StandardCheckpointer() as checkpointer:
    checkpointer.save(os.path.join(os.path.abspath(directory), PARAMS_DIR), params)
    checkpointer.wait_until_finished()


def atomic_directory(path: str, write: Callable[[str], None], *, overwrite: bool) -> None:
  """Runs `write(tmp_dir)` then renames tmp_dir to `path`; on any error removes tmp_dir.

  Args:
    path: the final directory.
    write: fills the temp directory (created empty, next to `path`, same filesystem).
    overwrite: replace an existing `path` (only after `write` succeeded); if False an existing
      `path` is an error raised before anything is written.

  Raises:
    FileExistsError: `path` exists and overwrite is False.
  """
  path = os.path.abspath(path)
  if os.path.exists(path) and not overwrite:
    raise FileExistsError(f"{path} already exists (refusing to overwrite)")
  parent, name = os.path.split(path)
  os.makedirs(parent, exist_ok=True)
  tmp = tempfile.mkdtemp(prefix=f".{name}.tmp-", dir=parent)
  try:
    write(tmp)
    if os.path.exists(path):
      old = tempfile.mkdtemp(prefix=f".{name}.old-", dir=parent)
      os.rename(path, os.path.join(old, name))
      os.rename(tmp, path)
      shutil.rmtree(old)
    else:
      os.rename(tmp, path)
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def save(path: str, config: ModelConfig, params: Any, *, overwrite: bool = True) -> None:
  """Atomically saves (config, params) as a gr2jax checkpoint directory at `path`.

  Args:
    path: the checkpoint directory.
    config: the model config.
    params: the param pytree.
    overwrite: replace an existing checkpoint at `path` once the new one is complete.
  """
  atomic_directory(path, lambda tmp: write_checkpoint(tmp, config, params), overwrite=overwrite)


def load_config(path: str) -> ModelConfig:
  """Reads `<path>/gr2jax_config.json`.

  Raises:
    CheckpointError: the file is missing or invalid.
  """
  file = os.path.join(path, CONFIG_FILE)
  if not os.path.isfile(file):
    raise CheckpointError(f"{path}: not a gr2jax checkpoint (no {CONFIG_FILE})")
  try:
    with open(file) as f:
      d = json.load(f)
  except json.JSONDecodeError as e:
    raise CheckpointError(f"{file}:{e.lineno}: invalid JSON ({e.msg})") from None
  return config_from_dict(d, source=file)


def restore(path: str, shardings: Any = None) -> tuple[ModelConfig, Any]:
  """Restores (config, params) from a gr2jax checkpoint directory.

  Args:
    path: the checkpoint directory (as written by `save` or convert_hf.py).
    shardings: optional pytree of `jax.sharding.Sharding` with the param tree's structure; each
      array is restored directly into its sharding. Default: the first device.

  Returns:
    (config, params) with params a pytree of jax Arrays in the stored dtype.

  Raises:
    CheckpointError: missing, incomplete or corrupt checkpoint, or a shardings tree that does not
      match the stored params.
  """
  config = load_config(path)
  params_dir = os.path.join(os.path.abspath(path), PARAMS_DIR)
  if not os.path.isdir(params_dir):
    raise CheckpointError(f"{path}: no {PARAMS_DIR}/ directory (incomplete checkpoint)")
  with ocp.StandardCheckpointer() as checkpointer:
    try:
      metadata = checkpointer.metadata(params_dir).item_metadata
    except Exception as e:  # orbax raises a variety of types for damaged metadata
      raise CheckpointError(f"{params_dir}: unreadable orbax metadata: {e}") from e
    if metadata is None:
      raise CheckpointError(f"{params_dir}: unreadable orbax metadata (corrupt checkpoint?)")
    metadata = metadata.tree
    if shardings is None:
      device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
      shardings = jax.tree.map(lambda _: device, metadata)
    try:
      target = jax.tree.map(lambda m, s: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=s),
                            metadata, shardings)
    except ValueError as e:
      raise CheckpointError(f"{params_dir}: shardings tree does not match the params: {e}") from e
    try:
      params = checkpointer.restore(params_dir, target)
    except Exception as e:  # tensorstore / orbax errors on missing or damaged data files
      raise CheckpointError(
        f"{params_dir}: cannot restore params (corrupt checkpoint?): {e}") from e
  return config, params


def load_model(path: str, shardings: Any = None, param_dtype: str | None = None
               ) -> tuple[ModelConfig, Any]:
  """Loads (config, params) from a gr2jax checkpoint or a local HF Qwen3 directory.

  An HF directory (config.json + safetensors or pytorch_model*.bin) is converted in memory with
  the same table as weights_conversion/convert_hf.py.

  Args:
    path: a gr2jax checkpoint directory or an HF model directory.
    shardings: optional pytree of shardings for the params (see `restore`).
    param_dtype: HF directories only: 'float32' or 'bfloat16' (default: the checkpoint's dtype).

  Returns:
    (config, params) with params a pytree of jax Arrays.

  Raises:
    CheckpointError: `path` is neither kind of directory, or the checkpoint is damaged.
  """
  if os.path.isfile(os.path.join(path, CONFIG_FILE)):
    if param_dtype is not None:
      raise CheckpointError(f"{path}: param_dtype applies to HF directories only")
    return restore(path, shardings)
  if os.path.isfile(os.path.join(path, "config.json")):
    from weights_conversion import convert_hf  # lazy: needs the repo root on sys.path

    config, params = convert_hf.load_hf(path, param_dtype=param_dtype)
    if shardings is None:
      return config, jax.tree.map(jax.numpy.asarray, params)
    return config, jax.tree.map(lambda x, s: jax.device_put(np.asarray(x), s), params, shardings)
  raise CheckpointError(f"{path}: neither a gr2jax checkpoint ({CONFIG_FILE}) nor an HF "
                        "directory (config.json)")
