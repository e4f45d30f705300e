"""The export format: save / restore (config, params) + metadata as a gr2jax directory (orbax).

A gr2jax checkpoint directory holds:
  gr2jax_config.json       the ModelConfig fields (plus "format": "gr2jax")
  params/<a.b>/            one orbax StandardCheckpointer item {"value": array} per param leaf
                           (path joined by '.', e.g. params/layers.q/), written one at a time
  gr2jax_metadata.json     {"params_sha256": digest of every leaf's bytes, in manifest order}
                           plus what the writer records (a training stage's export: its stage,
                           kind "ar" | "diffusion", step, data build and run record; with its
                           inference bundle, `bundle_sha256`, decoding/bundle.py); older
                           directories lack it (`load_metadata` gives {})
  params/manifest.json     [{path, shape, dtype}] of every leaf; written last (completion marker)
  (tokenizer files)        copied by weights_conversion/convert_hf.py when the HF dir had them,
                           and by a training stage with its inference bundle (decoding/bundle.py)
  inference/               a training stage's export: what serving it reads besides the params
                           (decoding/bundle.py)
The config is not named `config.json` so that transformers' Auto* classes never mistake the
directory for an HF one. One item per leaf (rather than one orbax tree) because orbax stages a
whole item in host memory while writing it (measured: +1.2-2x the item size): converting a
3.1 GB bf16 checkpoint peaked at 2.85x its size as one tree, 0.95x leaf by leaf
(weights_conversion/convert_hf.py produces the leaves one at a time).

Writes are atomic (`atomic_directory`, also used by every converter and exporter): everything goes
to a hidden temp directory next to the target, which is renamed into place only when complete; an
existing checkpoint is replaced only after the new one is complete, so a crash never leaves a
half-written or lost checkpoint at `path`. While writing, the target is locked
(`gr2jax.workdir.lock_file` on the sibling `.<name>.lock`): a second writer of the same path gets
an "in use by pid N" error. Temp siblings (`.<name>.tmp-<pid>-<hex>`, `.<name>.old-<pid>-<hex>`)
left by a killed writer are removed by the next write of that path (a previous checkpoint parked
in an `.old-` sibling by a writer killed mid-swap is first moved back). SIGTERM (when no other
handler is installed) and SIGINT raise in the main thread, so the temp directory is removed before
the process exits. Directories are created with the normal umask permissions (not 0700).

orbax is imported where params are written or restored (`_checkpointer`), not with this module:
what reads only an export's config, metadata or content digest (the step digests, the results
stamp, an application that has not loaded a model yet) loads no checkpointing library.
"""

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import secrets
import shutil
import signal
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import jax
import numpy as np

from gr2jax import files, workdir
from gr2jax.model import config as config_lib
from gr2jax.model.config import ModelConfig

CONFIG_FILE = "gr2jax_config.json"
METADATA_FILE = "gr2jax_metadata.json"
PARAMS_DIR = "params"
MANIFEST_FILE = "manifest.json"
_LEAF_KEY = "value"  # each leaf item is the orbax tree {"value": array}
_FORMAT = "gr2jax"

log = logging.getLogger(__name__)


class CheckpointError(ValueError):
  """A checkpoint is missing, incomplete or unreadable; the message names the path."""


def config_to_dict(config: ModelConfig) -> dict[str, Any]:
  """The JSON-able dict of a ModelConfig (tuples become lists)."""
  d = dataclasses.asdict(config)
  d["eos_token_ids"] = list(config.eos_token_ids)
  return {"format": _FORMAT, **d}


def config_from_dict(d: Mapping[str, Any], source: str = "config") -> ModelConfig:
  """Inverse of `config_to_dict`; unknown fields and missing ones without a default are an error
  naming `source`. A retired field (model/config.py RETIRED_FIELDS, which older exports record) is
  read at its retired value and refused at any other."""
  if not isinstance(d, Mapping):
    raise CheckpointError(f"{source}: not a gr2jax config (a JSON object), got "
                          f"{type(d).__name__}")
  d = dict(d)
  if d.pop("format", None) != _FORMAT:
    raise CheckpointError(f"{source}: not a gr2jax config (missing \"format\": \"{_FORMAT}\")")
  try:
    config_lib.check_retired_fields(d, source)
  except ValueError as e:
    raise CheckpointError(str(e)) from None
  for field in config_lib.RETIRED_FIELDS:
    d.pop(field, None)
  names = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(d) - names)
  if unknown:
    raise CheckpointError(f"{source}: unknown ModelConfig field(s) {unknown}")
  d["eos_token_ids"] = tuple(d.get("eos_token_ids", ()))
  try:
    return ModelConfig(**d)
  except (TypeError, ValueError) as e:
    raise CheckpointError(f"{source}: {e}") from None


def _checkpointer():
  """An orbax StandardCheckpointer (orbax imported here, module docstring)."""
  import orbax.checkpoint as ocp

  return ocp.StandardCheckpointer()


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
                     leaves: Iterable[tuple[tuple[str, ...], Any]],
                     metadata: Mapping[str, Any] | None = None) -> None:
  """Writes config + params into an existing, empty `directory` (no atomicity; see `save`).

  Leaves are consumed one at a time and each is fully written before the next is requested, so
  a generator that builds leaves lazily never has two in memory.

  Args:
    directory: the (temporary) checkpoint directory.
    config: the model config.
    leaves: (key path, numpy or jax array) for every param leaf, e.g. `flatten(params)`.
    metadata: JSON-able fields recorded in gr2jax_metadata.json next to the params digest.
  """
  with open(os.path.join(directory, CONFIG_FILE), "w") as f:
    json.dump(config_to_dict(config), f, indent=2)
  params_dir = os.path.join(os.path.abspath(directory), PARAMS_DIR)
  os.makedirs(params_dir)
  manifest, digest = [], hashlib.sha256()
  with _checkpointer() as checkpointer:
    for path, leaf in leaves:
      checkpointer.save(_leaf_dir(params_dir, path), {_LEAF_KEY: leaf})
      checkpointer.wait_until_finished()
      manifest.append({"path": list(path), "shape": list(leaf.shape),
                       "dtype": np.dtype(leaf.dtype).name})
      digest.update(".".join(path).encode())
      digest.update(np.ascontiguousarray(np.asarray(leaf)).reshape(-1).view(np.uint8).data)
      del leaf
  with open(os.path.join(directory, METADATA_FILE), "w") as f:
    json.dump({"params_sha256": digest.hexdigest(), **(metadata or {})}, f, indent=1)
  with open(os.path.join(params_dir, MANIFEST_FILE), "w") as f:
    json.dump(manifest, f, indent=1)


def _temp_sibling(parent: str, name: str, kind: str) -> str:
  """Creates the empty directory `.{name}.{kind}-{pid}-{hex}` in `parent` (umask permissions)."""
  while True:
    path = os.path.join(parent, f".{name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}")
    try:
      os.mkdir(path)
      return path
    except FileExistsError:
      continue


def _clean_stale_siblings(parent: str, name: str, path: str) -> None:
  """Removes temp siblings of `path` left by killed writers (call with the target locked).

  A writer killed between parking the old directory and renaming the new one into place leaves
  `path` missing and the previous directory in `.{name}.old-*/{name}`: it is moved back first.
  """
  pattern = re.compile(rf"\.{re.escape(name)}\.(tmp|old)-\d+-[0-9a-f]{{8}}")
  stale = sorted(e for e in os.listdir(parent) if pattern.fullmatch(e))
  for entry in stale:
    parked = os.path.join(parent, entry, name)
    if pattern.fullmatch(entry)[1] == "old" and not os.path.exists(path) and os.path.isdir(parked):
      log.warning("%s: restoring the previous directory from %s (a writer was killed mid-swap)",
                  path, entry)
      os.rename(parked, path)
  for entry in stale:
    log.warning("%s: removing %s left by an interrupted write", path, entry)
    shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


def _raise_exit(signum, frame) -> None:
  del frame
  raise SystemExit(128 + signum)


@contextlib.contextmanager
def _exit_on_sigterm() -> Iterator[None]:
  """Makes SIGTERM raise SystemExit(143) in the main thread (so `finally`/`except` clean up).

  Only when SIGTERM has its default action (a caller's own handler, e.g. a training loop that
  checkpoints on SIGTERM, is left alone) and only in the main thread (signals go there). SIGINT
  already raises KeyboardInterrupt.
  """
  if (threading.current_thread() is not threading.main_thread()
      or signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL):
    yield
    return
  signal.signal(signal.SIGTERM, _raise_exit)
  try:
    yield
  finally:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def atomic_directory(path: str, write: Callable[[str], None], *, overwrite: bool) -> None:
  """Runs `write(tmp_dir)` then renames tmp_dir to `path`; on any error removes tmp_dir.

  The target is locked while this runs, stale temp siblings of earlier killed writers are
  removed first, and SIGTERM / SIGINT remove the temp directory before the process exits (module
  docstring).

  Args:
    path: the final directory.
    write: fills the temp directory (created empty, next to `path`, same filesystem).
    overwrite: replace an existing `path` (only after `write` succeeded); if False an existing
      `path` is an error raised before anything is written.

  Raises:
    FileExistsError: `path` exists and overwrite is False.
    gr2jax.workdir.InUseError: another live process is writing `path`.
  """
  path = os.path.abspath(path)
  parent, name = os.path.split(path)
  os.makedirs(parent, exist_ok=True)
  with workdir.lock_file(os.path.join(parent, f".{name}.lock"), path), _exit_on_sigterm():
    _clean_stale_siblings(parent, name, path)
    if os.path.exists(path) and not overwrite:
      raise FileExistsError(f"{path} already exists (refusing to overwrite)")
    tmp = _temp_sibling(parent, name, "tmp")
    try:
      write(tmp)
      if os.path.exists(path):
        old = _temp_sibling(parent, name, "old")
        parked = os.path.join(old, name)
        os.rename(path, parked)
        try:
          os.rename(tmp, path)
        except BaseException:
          if not os.path.exists(path):
            os.rename(parked, path)  # interrupted mid-swap: the previous directory stays
          raise
        shutil.rmtree(old)
      else:
        os.rename(tmp, path)
    except BaseException:
      shutil.rmtree(tmp, ignore_errors=True)
      raise


def save(path: str, config: ModelConfig, params: Any, *, overwrite: bool = True,
         metadata: Mapping[str, Any] | None = None,
         write_more: Callable[[str], None] | None = None) -> None:
  """Atomically saves (config, params) as a gr2jax checkpoint directory at `path`.

  Args:
    path: the checkpoint directory.
    config: the model config.
    params: the param pytree.
    overwrite: replace an existing checkpoint at `path` once the new one is complete.
    metadata: JSON-able fields for gr2jax_metadata.json (module docstring).
    write_more: called with the directory being written, after the params, to add files that
      land with them atomically (a stage export's inference bundle, decoding/bundle.py).
  """
  def write(tmp: str) -> None:
    write_checkpoint(tmp, config, flatten(params), metadata)
    if write_more is not None:
      write_more(tmp)

  atomic_directory(path, write, overwrite=overwrite)


def load_metadata(path: str) -> dict[str, Any]:
  """The gr2jax_metadata.json of a checkpoint directory; {} when it has none (a directory
  written before the file existed, or an HF directory).

  Raises:
    CheckpointError: the file exists but is not a JSON object.
  """
  file = os.path.join(path, METADATA_FILE)
  if not os.path.isfile(file):
    return {}
  try:
    with open(file) as f:
      d = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise CheckpointError(f"{file}: invalid JSON ({e})") from None
  if not isinstance(d, dict):
    raise CheckpointError(f"{file}: not a JSON object")
  return d


def update_metadata(path: str, fields: Mapping[str, Any]) -> None:
  """Sets `fields` in the gr2jax_metadata.json of the checkpoint directory `path` (written
  atomically, files.atomic_write; the other fields, the params digest among them, kept): what a
  writer adds to a finished export (decoding/bundle.py: the digest of its bundle record).

  Raises:
    CheckpointError: the file exists but is not a JSON object.
  """
  files.atomic_write(os.path.join(path, METADATA_FILE),
                     json.dumps({**load_metadata(path), **fields}, indent=1))


def content_digest(path: str) -> str:
  """A digest that changes when the model stored at `path` changes, read without the weights:
  the recorded params digest of a gr2jax directory (older ones: its config + manifest), or an HF
  directory's config.json with the names and sizes of its files."""
  recorded = load_metadata(path).get("params_sha256") if os.path.isdir(path) else None
  if recorded:
    return recorded
  digest = hashlib.sha256()
  if os.path.isfile(os.path.join(path, CONFIG_FILE)):
    sources = [os.path.join(path, CONFIG_FILE), os.path.join(path, PARAMS_DIR, MANIFEST_FILE)]
  elif os.path.isfile(os.path.join(path, "config.json")):
    sources = [os.path.join(path, "config.json")]
    for name in sorted(os.listdir(path)):
      digest.update(f"{name}:{os.path.getsize(os.path.join(path, name))};".encode())
  else:
    raise CheckpointError(f"{path}: neither a gr2jax checkpoint ({CONFIG_FILE}) nor an HF "
                          "directory (config.json)")
  for file in sources:
    if not os.path.isfile(file):
      raise CheckpointError(f"{path}: no {os.path.relpath(file, path)} (incomplete checkpoint)")
    with open(file, "rb") as f:
      digest.update(f.read())
  return digest.hexdigest()


def vocab_digest(tokenizer) -> str:
  """The sha256 of a tokenizer's vocabulary ({token: id}, added tokens included, sorted): what
  `vocab_sha256` means wherever it is recorded (exports, Table 2's provenance)."""
  vocab = sorted(tokenizer.get_vocab().items())
  return hashlib.sha256(json.dumps(vocab, ensure_ascii=False).encode()).hexdigest()


def sids_digest(sids: np.ndarray) -> str:
  """The sha256 of a data build's semantic IDs (their int32 [I, L + 1] shape and values, row
  major): what `sids_sha256` means in a data build record. Two builds of the same catalogue can
  hold same-shaped SIDs that give the items other codes; this tells them apart."""
  sids = np.ascontiguousarray(sids, np.int32)
  digest = hashlib.sha256(json.dumps(list(sids.shape)).encode())
  digest.update(sids.reshape(-1).view(np.uint8).data)
  return digest.hexdigest()


def data_build_record(tokenizer, prompt, sids: np.ndarray | None = None) -> dict[str, Any]:
  """What a model's inputs depend on in its data build: the tokenizer (`vocab_sha256`, the
  vocab_digest; `vocab`, its size), the prompt format (data/prompts.PromptConfig) and, when
  given, the semantic IDs its prompts show (`sids_sha256`, the sids_digest: a stage's export
  records it; its run record, like every run recorded before the field, does not)."""
  prompt = json.loads(json.dumps(dataclasses.asdict(prompt)))
  record = {"vocab_sha256": vocab_digest(tokenizer), "vocab": len(tokenizer.get_vocab()),
            "prompt": prompt}
  return record if sids is None else {**record, "sids_sha256": sids_digest(sids)}


def recorded_vocab_digest(record: Mapping[str, Any]) -> str | None:
  """The vocabulary digest of a data build record (`data_build_record`); exports written before
  the field's name said what it hashes call it `tokenizer_sha256`."""
  return record.get("vocab_sha256", record.get("tokenizer_sha256"))


def data_build_differences(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
  """How two data build records (`data_build_record`) differ, one phrase per field, a's value
  first: the tokenizer (digest and size), the semantic IDs (when both records hold their digest)
  and each prompt field."""
  digest_a, digest_b = recorded_vocab_digest(a), recorded_vocab_digest(b)
  problems = [f"tokenizer vocab_sha256 {digest_a[:16]} (vocab {a['vocab']}) vs "
              f"{digest_b[:16]} (vocab {b['vocab']})"] if digest_a != digest_b else []
  sids_a, sids_b = a.get("sids_sha256"), b.get("sids_sha256")
  if sids_a and sids_b and sids_a != sids_b:
    problems.append(f"semantic IDs sids_sha256 {sids_a[:16]} vs {sids_b[:16]}")
  prompt_a, prompt_b = a["prompt"], b["prompt"]
  for field in sorted(set(prompt_a) | set(prompt_b)):
    if prompt_a.get(field) != prompt_b.get(field):
      problems.append(f"prompt.{field} {prompt_a.get(field)!r} vs {prompt_b.get(field)!r}")
  return problems


def check_data_build(path: str, current: Mapping[str, Any]) -> None:
  """Refuses to use the checkpoint at `path` with a data build other than its training one.

  Args:
    path: a checkpoint directory; one that records no data build (an older export, a converted
      or HF checkpoint) is not checked.
    current: `data_build_record` of the data build about to feed the model.

  Raises:
    ValueError: the tokenizers, the semantic IDs (when both records hold their digest) or the
      prompt formats differ; names both.
  """
  recorded = load_metadata(path).get("data_build") if os.path.isdir(path) else None
  problems = data_build_differences(recorded, current) if recorded else []
  if problems:
    raise ValueError(f"{path} was trained on another data build than this one (checkpoint vs "
                     f"this run): {'; '.join(problems)}. Pass the data settings of its training "
                     "run (--config.data...) or use its workdir")


def check_same_build(drafter_path: str, verifier_path: str) -> None:
  """Refuses a drafter and a verifier export (draft-and-verify, gr2jax/diffusion/speculative.py)
  trained on different data builds.

  Both exports' gr2jax_metadata.json "data_build" records (`data_build_record`: the
  tokenizer digest and the prompt format) must be equal; an export without a record (older, or
  converted) is not checked, as `check_data_build`.

  Raises:
    ValueError: the tokenizers or prompt formats differ; names both exports and each difference.
  """
  records = [load_metadata(p).get("data_build") for p in (drafter_path, verifier_path)]
  problems = data_build_differences(*records) if all(records) else []
  if problems:
    raise ValueError(f"drafter {drafter_path} and verifier {verifier_path} come from different "
                     f"data builds (drafter vs verifier): {'; '.join(problems)}")


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
  except UnicodeDecodeError as e:
    raise CheckpointError(f"{file}: not UTF-8 text ({e.reason} at byte {e.start})") from None
  return config_from_dict(d, source=file)


def sharding_at(shardings: Any, path: tuple[str, ...], where: str):
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
  with _checkpointer() as checkpointer:
    for p, shape, dtype in manifest:
      leaf_dir = _leaf_dir(params_dir, p)
      sharding = sharding_at(shardings, p, params_dir)
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
