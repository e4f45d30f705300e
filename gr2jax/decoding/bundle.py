"""The inference bundle: what a stage's export carries so that it re-ranks with nothing else.

A training stage's export (train/loop.py) holds, beside its params, model config and metadata
(the data build's config, whose prompt section is the PromptConfig; the decode spec; the data
build record; the run record, whose `lengths` are the P, R it was trained with):
  tokenizer.json, ...        the data build's tokenizer files (where a converted checkpoint keeps
                             its own; load.find_tokenizer finds them there)
  inference/bundle.json      `format`; `prompt_len`, `response_len`: P and R
                             (data/lengths.static_lengths); `thresholds`: the build's exact
                             evidence thresholds (data/build_rendering.py, full precision); its
                             example settings the rendering reads (requests.RENDERING_SETTINGS);
                             `items_file`; `files`: the sha256 of every file above and below,
                             by its path in the export
  inference/<items file>     the build's catalogue (titles, brands, categories, ASIN order)
  inference/sids.npy         the semantic IDs its prompts were rendered with

bundle.json is itself protected: its sha256 is recorded in the export's gr2jax_metadata.json
(`bundle_sha256`, RECORD_DIGEST), so an edited value (thresholds change every rendered prompt)
is refused. Exports written before the field read as before (their bundle.json unchecked);
weights_conversion/add_bundle.py rewrites their bundle and records it.

`write(export, summary, rendering)` copies them from a data build into an export (the build's
Rendering comes from data/build_rendering.py: this module reads no data build, so serving an
export imports neither the pipeline nor TFDS). `read(export, data_config, items)` checks them and
gives the tokenizer, the request Rendering, P, R and the data build record back. It returns None
only for an export that never had a bundle (no inference/ directory; decoding/reranker.py then
needs the workdir of its data build). Anything else wrong is a one-line ValueError naming the
file and the field: a missing bundle.json or listed file, a bundle.json or a file whose sha256 is
not the recorded one, bad JSON, a field missing or of the wrong type or range, settings other
than the export's data config's (naming this run's value and the export's), widths other than
its run record's. A bundle of another format (format 1 recorded no digests) is refused with the
command that writes a new one (`rebundle_command`).
"""

import dataclasses
import json
import math
import os
import shutil

import numpy as np

from gr2jax import exports
from gr2jax import files as files_lib
from gr2jax.data import evidence, prompts, raw
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib

DIRECTORY = "inference"
BUNDLE_FILE = "bundle.json"
SIDS_FILE = "sids.npy"
FORMAT = 2
RECORD_DIGEST = "bundle_sha256"  # gr2jax_metadata.json's field: the sha256 of bundle.json
THRESHOLDS_SHAPE = (len(evidence.KINDS), evidence.NUM_BUCKETS - 2)  # bucket 0 = no match


@dataclasses.dataclass(frozen=True)
class Inference:
  """What decoding requests for a model reads of the data build it was trained on.

  Attributes:
    tokenizer: the build's tokenizer.
    rendering: how the build renders a request (data/requests.py).
    prompt_len: P, the build's static prompt width.
    response_len: R, the build's static response width (the default response cap).
    data_build: the build's exports.data_build_record (tokenizer, prompt, SIDs), checked against
      the export's own by the reranker.
  """

  tokenizer: object
  rendering: requests_lib.Rendering
  prompt_len: int
  response_len: int
  data_build: dict


def rebundle_command(export: str, workdir: str = "") -> str:
  """The command that writes an export's inference bundle from its data build (in `workdir`,
  when known)."""
  return (f"python weights_conversion/add_bundle.py --export={export} "
          f"--workdir={workdir or '<the workdir of its data build>'}")


def is_bundle_file(name: str) -> bool:
  """Whether `name` (a path in an export, '/'-separated) is one `write` writes: a file of
  inference/ or a tokenizer file beside the params (anything but the config, the metadata and
  params/)."""
  return (name.startswith(DIRECTORY + "/")
          or ("/" not in name and name not in (exports.CONFIG_FILE, exports.METADATA_FILE)))


def write(export: str, summary: dict, rendering: requests_lib.Rendering) -> None:
  """Writes a data build's inference bundle (module docstring) into `export`: the tokenizer
  files beside the params, then inference/ at once (exports.atomic_directory: an interrupted
  write leaves the inference/ the export had, or none; an existing one is replaced), then the
  sha256 of its bundle.json in the export's metadata (RECORD_DIGEST).

  Args:
    export: the export (one being written: exports.save's write_more; or a finished one:
      weights_conversion/add_bundle.py).
    summary: the data build's pipeline.run summary (its files, P and R).
    rendering: the build's Rendering of its own catalogue (build_rendering.load_rendering): the
      exact thresholds and the settings.
  """
  paths = summary["paths"]
  digests = {}
  for name in sorted(os.listdir(paths["tokenizer"])):
    source = os.path.join(paths["tokenizer"], name)
    if os.path.isfile(source):
      shutil.copyfile(source, os.path.join(export, name))
      digests[name] = files_lib.file_sha256(os.path.join(export, name))
  items = os.path.basename(paths["items"])
  p, r = lengths_lib.static_lengths(summary)

  def fill(directory: str) -> None:
    for name, source in ((items, paths["items"]), (SIDS_FILE, paths["sids"])):
      shutil.copyfile(source, os.path.join(directory, name))
      digests[f"{DIRECTORY}/{name}"] = files_lib.file_sha256(os.path.join(directory, name))
    record = {"format": FORMAT, "prompt_len": p, "response_len": r, "items_file": items,
              "thresholds": rendering.thresholds.tolist(),
              **{name: getattr(rendering, name) for name in requests_lib.RENDERING_SETTINGS},
              "files": dict(sorted(digests.items()))}
    with open(os.path.join(directory, BUNDLE_FILE), "w") as f:
      json.dump(record, f, indent=1)

  exports.atomic_directory(os.path.join(export, DIRECTORY), fill, overwrite=True)
  exports.update_metadata(export, {RECORD_DIGEST: files_lib.file_sha256(
    os.path.join(export, DIRECTORY, BUNDLE_FILE))})


def read(export: str, data_config, items: str = "") -> Inference | None:
  """The checked inference bundle of an export (module docstring), or None when it never had
  one (no inference/ directory).

  Args:
    export: the export directory.
    data_config: the data build's config (its prompt and example settings; the export records
      it).
    items: a user-supplied items.jsonl ('' = the build's catalogue), matched to the build's
      semantic IDs by ASIN.

  Raises:
    ValueError: one line naming the file and the field (module docstring).
  """
  inference = os.path.join(export, DIRECTORY)
  if not os.path.isdir(inference):
    return None
  path = os.path.join(inference, BUNDLE_FILE)
  _check_record_digest(path, export)
  record = _load_record(path, export)
  _check_fields(record, path, export)
  _check_against_export(record, path, export, data_config)
  _check_files(record, path, export)
  catalog = raw.load_catalog(os.path.join(inference, record["items_file"]))
  sids = _load_sids(os.path.join(inference, SIDS_FILE), catalog.num_items, export)
  prompt = prompts.prompt_config(data_config)
  rendering = requests_lib.make_rendering(catalog, sids, prompt, np.asarray(record["thresholds"]),
                                          record, items)
  tokenizer = tokenizer_lib.load_tokenizer(export)
  return Inference(tokenizer, rendering, record["prompt_len"], record["response_len"],
                   exports.data_build_record(tokenizer, prompt, sids))


def _check_record_digest(path: str, export: str) -> None:
  """bundle.json is the one the export records (RECORD_DIGEST; unchecked for an export written
  before the field: add_bundle.py records it)."""
  want = exports.load_metadata(export).get(RECORD_DIGEST)
  if want is None or not os.path.isfile(path):
    return
  got = files_lib.file_sha256(path)
  if got != want:
    raise ValueError(f"{path}: sha256 {got[:16]}... is not the {want[:16]}... the export records "
                     f"({exports.METADATA_FILE} field {RECORD_DIGEST!r}): the bundle was edited "
                     f"or damaged (its values render every prompt); write it again: "
                     f"{rebundle_command(export)}")


def _load_record(path: str, export: str) -> dict:
  """bundle.json as a dict, its format checked first."""
  if not os.path.isfile(path):
    raise ValueError(f"{path}: missing: the export has an {DIRECTORY}/ directory without its "
                     f"bundle file (an incomplete bundle); write it again: "
                     f"{rebundle_command(export)}")
  try:
    with open(path) as f:
      record = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path}: not a JSON bundle ({e}); write it again: "
                     f"{rebundle_command(export)}") from None
  if not isinstance(record, dict):
    raise ValueError(f"{path}: not a JSON object but {type(record).__name__}; write it again: "
                     f"{rebundle_command(export)}")
  if record.get("format") != FORMAT:
    raise ValueError(f"{path}: field 'format' is {record.get('format')!r}, this version reads "
                     f"inference bundle format {FORMAT} (format 1 recorded no file digests); "
                     f"write it again: {rebundle_command(export)}")
  return record


def _is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value) -> bool:
  return (isinstance(value, int | float) and not isinstance(value, bool)
          and math.isfinite(value))


def _is_width(value) -> bool:
  return _is_int(value) and value > 0 and value % lengths_lib.LENGTH_MULTIPLE == 0


def _is_file_name(value) -> bool:
  return (isinstance(value, str) and value not in ("", ".", "..", BUNDLE_FILE, SIDS_FILE)
          and os.path.basename(value) == value)


def _is_thresholds(value) -> bool:
  return (isinstance(value, list) and len(value) == THRESHOLDS_SHAPE[0]
          and all(isinstance(row, list) and len(row) == THRESHOLDS_SHAPE[1]
                  and all(_is_number(v) for v in row) for row in value))


def _is_export_path(name) -> bool:
  return (isinstance(name, str) and name == os.path.normpath(name) and not os.path.isabs(name)
          and name.split("/")[0] != "..")


def _is_digest(value) -> bool:
  return (isinstance(value, str) and len(value) == 64
          and all(c in "0123456789abcdef" for c in value))


def _is_files(value) -> bool:
  return (isinstance(value, dict) and all(_is_export_path(k) and _is_digest(v)
                                          for k, v in value.items()))


# bundle.json's fields besides `format`: (what the value must be, its check).
FIELDS = {
  "prompt_len": (f"a positive multiple of {lengths_lib.LENGTH_MULTIPLE}", _is_width),
  "response_len": (f"a positive multiple of {lengths_lib.LENGTH_MULTIPLE}", _is_width),
  "items_file": (f"the name of a file in {DIRECTORY}/", _is_file_name),
  "thresholds": (f"a {list(THRESHOLDS_SHAPE)} list of lists of finite numbers", _is_thresholds),
  "evidence_decay": ("a number in (0, 1]", lambda v: _is_number(v) and 0 < v <= 1),
  "evidence_window": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
  "max_history": ("an integer >= 0", lambda v: _is_int(v) and v >= 0),
  "num_candidates": ("an integer >= 1", lambda v: _is_int(v) and v >= 1),
  "files": ("{path in the export: sha256 hex}", _is_files),
}


def _check_fields(record: dict, path: str, export: str) -> None:
  """Every field of FIELDS present, of its type and range."""
  for name, (what, check) in FIELDS.items():
    if name not in record:
      raise ValueError(f"{path}: field {name!r} is missing; write the bundle again: "
                       f"{rebundle_command(export)}")
    if not check(record[name]):
      shown = repr(record[name])
      shown = shown if len(shown) <= 80 else shown[:77] + "..."
      raise ValueError(f"{path}: field {name!r} must be {what}, got {shown}")


def _check_against_export(record: dict, path: str, export: str, data_config) -> None:
  """The settings are those of the data config this run passes (`data_config`: the recipe's, with
  its command-line overrides, or the export's own), P and R those it was trained with (its run
  record's `lengths`, run_identity.run_record; unchecked where it has none). A setting
  of this run's other than the bundle's, where the export's metadata records the bundle's, is this
  run's to change: the message names both sides."""
  metadata = exports.load_metadata(export)
  recorded = metadata.get("data_config") or {}
  for name in requests_lib.RENDERING_SETTINGS:
    want = getattr(data_config, name, None)
    if want is None or record[name] == want:
      continue
    if recorded.get(name) == record[name]:  # the export agrees with itself: this run differs
      raise ValueError(f"{path}: this run's data.{name} is {want!r} (the recipe or a "
                       f"--config.data.{name} override), the export's is {record[name]!r} (its "
                       f"bundle and {exports.METADATA_FILE} data_config): the export is fine; "
                       f"drop the override or pass --config.data.{name}={record[name]!r}")
    if recorded.get(name) == want:  # the bundle is not its export's
      raise ValueError(f"{path}: field {name!r} is {record[name]!r}, the export's data build has "
                       f"{want!r} ({exports.METADATA_FILE} data_config.{name}); write the bundle "
                       f"again: {rebundle_command(export)}")
    raise ValueError(f"{path}: field {name!r} is {record[name]!r}, this run's data.{name} is "
                     f"{want!r} and the export records no data_config: pass the value it was "
                     f"trained with, or write its bundle again from its data build: "
                     f"{rebundle_command(export)}")
  lengths = (metadata.get("run") or {}).get("lengths")
  recorded = lengths if isinstance(lengths, list) and len(lengths) == 2 else ()
  for name, want in zip(("prompt_len", "response_len"), recorded, strict=False):
    if record[name] != want:
      raise ValueError(f"{path}: field {name!r} is {record[name]}, the export was trained with "
                       f"{want} ({exports.METADATA_FILE} run.lengths [P, R])")


def _check_files(record: dict, path: str, export: str) -> None:
  """Every file the bundle needs is listed, present and has its recorded sha256."""
  digests = record["files"]
  needed = {f"{DIRECTORY}/{record['items_file']}", f"{DIRECTORY}/{SIDS_FILE}",
            *tokenizer_lib.FILES}
  unlisted = sorted(needed - digests.keys())
  if unlisted:
    raise ValueError(f"{path}: field 'files' has no digest of {', '.join(unlisted)}; write the "
                     f"bundle again: {rebundle_command(export)}")
  missing = [name for name in sorted(digests) if not os.path.isfile(os.path.join(export, name))]
  if missing:
    raise ValueError(f"{export}: missing {', '.join(missing)} (listed in {DIRECTORY}/"
                     f"{BUNDLE_FILE} field 'files'): an incomplete export; write its bundle "
                     f"again: {rebundle_command(export)}")
  for name, want in sorted(digests.items()):
    got = files_lib.file_sha256(os.path.join(export, name))
    if got != want:
      raise ValueError(f"{os.path.join(export, name)}: sha256 {got[:16]}... is not the "
                       f"{want[:16]}... that {DIRECTORY}/{BUNDLE_FILE} records (field 'files'): "
                       f"the file was changed or damaged; write the bundle again: "
                       f"{rebundle_command(export)}")


def _load_sids(path: str, num_items: int, export: str) -> np.ndarray:
  """[I, L + 1] int32 semantic IDs of a checked bundle (its digest matched: the file the data
  build wrote, whose rows data/rqvae.py checked)."""
  sids = np.load(path, allow_pickle=False)
  if sids.ndim != 2 or sids.shape[0] != num_items or not np.issubdtype(sids.dtype, np.integer):
    raise ValueError(f"{path}: {sids.dtype} {list(sids.shape)} semantic IDs, the catalogue has "
                     f"{num_items} items; write the bundle again: {rebundle_command(export)}")
  return sids.astype(np.int32)
