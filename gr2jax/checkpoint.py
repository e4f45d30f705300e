"""Save / restore (config, params) with orbax, and `load_model` for orbax or HF directories.

A gr2jax checkpoint directory holds:
  gr2jax_config.json       the ModelConfig fields (plus "format": "gr2jax")
  params/<a.b>/            one orbax StandardCheckpointer item {"value": array} per param leaf
                           (path joined by '.', e.g. params/layers.q/), written one at a time
  params/manifest.json     [{path, shape, dtype}] of every leaf; written last (completion marker)
  (tokenizer files)        copied by weights_conversion/convert_hf.py when the HF dir had them
The config is not named `config.json` so that transformers' Auto* classes never mistake the
directory for an HF one. One item per leaf (rather than one orbax tree) because orbax stages a
whole item in host memory while writing it (measured: +1.2-2x the item size): converting a
3.1 GB bf16 checkpoint peaked at 2.85x its size as one tree, 0.95x leaf by leaf
(weights_conversion/convert_hf.py produces the leaves one at a time).

Writes are atomic: everything goes to a hidden temp directory next to the target, which is renamed
into place only when complete; an existing checkpoint is replaced only after the new one is
complete, so a crash never leaves a half-written or lost checkpoint at `path`.
"""

import dataclasses
import functools
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from gr2jax.model.config import ModelConfig

CONFIG_FILE = "gr2jax_config.json"
PARAMS_DIR = "params"
MANIFEST_FILE = "manifest.json"
_LEAF_KEY = "value"  # each leaf item is the orbax tree {"value": array}
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


def _leaf_dir(params_dir: str, path: tuple[str, ...]) -> str:
  return os.path.join(params_dir, ".".join(path))


def flatten(params: Mapping) -> list[tuple[tuple[str, ...], Any]]:
  """The nested param dict as [(key path, leaf)], in sorted key order."""
  return [(tuple(k.key for k in path), leaf)
          for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]]


def unflatten(leaves: Iterable[tuple[tuple[str, ...], Any]]) -> dict:
  """[(key path, leaf)] -> the nested param dict."""
  tree: dict = {}
  for path, leaf in leaves:
    node = tree
    for key in path[:-1]:
      node = node.setdefault(key, {})
    node[path[-1]] = leaf
  return tree


def write_checkpoint(directory: str, config: ModelConfig,
                     leaves: Iterable[tuple[tuple[str, ...], Any]]) -> None:
  """Writes config + params into an existing, empty `directory` (no atomicity; see `save`).

  Leaves are consumed one at a time and each is fully written before the next is requested, so
  a generator that builds leaves lazily never has two in memory.

  Args:
    directory: the (temporary) checkpoint directory.
    config: the model config.
    leaves: (key path, numpy or jax array) for every param leaf, e.g. `flatten(params)`.
  """
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(config_to_dict(config), f, indent=2)
  params_dir = os.path.join(os.path.abspath(directory), PARAMS_DIR)
  os.makedirs(params_dir)
  manifest = []
  with ocp.StandardCheckpointer() as checkpointer:
    for path, leaf in leaves:
      checkpointer.save(_leaf_dir(params_dir, path), {_LEAF_KEY: leaf})
      checkpointer.wait_until_finished()
      manifest.append({"path": list(path), "shape": list(leaf.shape),
                       "dtype": np.dtype(leaf.dtype).name})
      del leaf
  with open(os.path.join(params_dir, MANIFEST_FILE), "w") as f:
    json.dump(manifest, f, indent=1)


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
  atomic_directory(path, lambda tmp: write_checkpoint(tmp, config, flatten(params)),
                   overwrite=overwrite)


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


def _sharding_at(shardings: Any, path: tuple[str, ...], where: str):
  """The sharding for param `path` in a shardings pytree (CheckpointError if absent)."""
  try:
    return functools.reduce(lambda node, key: node[key], path, shardings)
  except (KeyError, TypeError):
    raise CheckpointError(f"{where}: shardings tree does not match the params: no entry for "
                          f"{'.'.join(path)}") from None


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
  manifest_file = os.path.join(params_dir, MANIFEST_FILE)
  if not os.path.isfile(manifest_file):
    raise CheckpointError(f"{path}: no {PARAMS_DIR}/{MANIFEST_FILE} (incomplete checkpoint)")
  try:
    with open(manifest_file) as f:
      manifest = [(tuple(e["path"]), tuple(e["shape"]), np.dtype(e["dtype"]))
                  for e in json.load(f)]
  except (ValueError, KeyError, TypeError) as e:
    raise CheckpointError(f"{manifest_file}: invalid manifest ({e})") from None
  if shardings is None:
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    shardings = unflatten((p, device) for p, _, _ in manifest)
  stored = sorted(p for p, _, _ in manifest)
  wanted = sorted(p for p, _ in flatten(shardings))
  if stored != wanted:
    raise CheckpointError(f"{params_dir}: shardings tree does not match the params: stored "
                          f"{['.'.join(p) for p in stored]}, shardings for "
                          f"{['.'.join(p) for p in wanted]}")
  leaves = []
  with ocp.StandardCheckpointer() as checkpointer:
    for p, shape, dtype in manifest:
      leaf_dir = _leaf_dir(params_dir, p)
      sharding = _sharding_at(shardings, p, params_dir)
      try:
        target = {_LEAF_KEY: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)}
        leaf = checkpointer.restore(leaf_dir, target)[_LEAF_KEY]
      except Exception as e:  # orbax / tensorstore raise many types for missing or damaged files
        raise CheckpointError(
          f"{leaf_dir}: cannot restore param {'.'.join(p)} (corrupt checkpoint?): {e}") from e
      if leaf.shape != shape or leaf.dtype != dtype:
        raise CheckpointError(f"{leaf_dir}: stored {leaf.shape} {leaf.dtype}, manifest says "
                              f"{shape} {dtype}")
      leaves.append((p, leaf))
  params = unflatten(leaves)
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

    config = convert_hf.read_config(path, param_dtype)
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    with convert_hf.HFWeights(path) as weights:  # one host leaf at a time
      leaves = [(p, jax.device_put(leaf, device if shardings is None
                                   else _sharding_at(shardings, p, path)))
                for p, leaf in convert_hf.iter_leaves(config, weights)]
    return config, unflatten(leaves)
  raise CheckpointError(f"{path}: neither a gr2jax checkpoint ({CONFIG_FILE}) nor an HF "
                        "directory (config.json)")
