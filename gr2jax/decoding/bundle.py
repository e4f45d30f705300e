"""The inference bundle: what a stage's export carries so that it re-ranks with nothing else.

A training stage's export (train/loop.py) holds, beside its params, model config and metadata
(the data build's config, whose prompt section is the PromptConfig, and the decode spec):
  tokenizer.json, ...        the data build's tokenizer files (where a converted checkpoint keeps
                             its own; load.find_tokenizer finds them there)
  inference/bundle.json      P and R (data/lengths.static_lengths), the build's exact evidence
                             thresholds (data/requests.build_thresholds, full precision) and its
                             example settings the rendering reads (requests.RENDERING_SETTINGS)
  inference/<items file>     the build's catalogue (titles, brands, categories, ASIN order)
  inference/sids.npy         the semantic IDs its prompts were rendered with

`write(directory, summary, data_config)` copies them from a data build (pipeline.run's summary)
into an export being written; `read(export, data_config, items)` gives the tokenizer, the
request Rendering and P, R back with no workdir, raw data or pipeline run, or None for an export
written before exports carried a bundle (decoding/reranker.py then builds the data build).
"""

import dataclasses
import json
import os
import shutil

import numpy as np

from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline, raw, rqvae
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib

DIRECTORY = "inference"
BUNDLE_FILE = "bundle.json"
SIDS_FILE = "sids.npy"
FORMAT = 1


@dataclasses.dataclass(frozen=True)
class Inference:
  """What decoding requests for a model reads of the data build it was trained on.

  Attributes:
    tokenizer: the build's tokenizer.
    rendering: how the build renders a request (data/requests.py).
    prompt_len: P, the build's static prompt width.
    response_len: R, the build's static response width (the default response cap).
  """

  tokenizer: object
  rendering: requests_lib.Rendering
  prompt_len: int
  response_len: int


def write(directory: str, summary: dict, data_config) -> None:
  """Copies a data build's inference bundle (module docstring) into `directory`.

  Args:
    directory: the export being written (exports.save's write_more).
    summary: the data build's pipeline.run summary.
    data_config: its config (the prompt).
  """
  rendering = requests_lib.load_rendering(summary, data_config)
  paths = summary["paths"]
  for name in sorted(os.listdir(paths["tokenizer"])):
    source = os.path.join(paths["tokenizer"], name)
    if os.path.isfile(source):
      shutil.copyfile(source, os.path.join(directory, name))
  inference = os.path.join(directory, DIRECTORY)
  os.makedirs(inference)
  items = os.path.basename(paths["items"])
  shutil.copyfile(paths["items"], os.path.join(inference, items))
  shutil.copyfile(paths["sids"], os.path.join(inference, SIDS_FILE))
  p, r = lengths_lib.static_lengths(summary)
  settings = summary["examples"]["config"]
  record = {"format": FORMAT, "prompt_len": p, "response_len": r, "items_file": items,
            "thresholds": rendering.thresholds.tolist(),
            **{name: settings[name] for name in requests_lib.RENDERING_SETTINGS}}
  with open(os.path.join(inference, BUNDLE_FILE), "w") as f:
    json.dump(record, f, indent=1)


def read(export: str, data_config, items: str = "") -> Inference | None:
  """The inference bundle of an export (module docstring), or None when it has none.

  Args:
    export: the export directory.
    data_config: the data build's config (its prompt; the export records it).
    items: a user-supplied items.jsonl ('' = the build's catalogue), matched to the build's
      semantic IDs by ASIN.

  Raises:
    ValueError: a bundle of another format (names the file and how to re-export).
  """
  inference = os.path.join(export, DIRECTORY)
  path = os.path.join(inference, BUNDLE_FILE)
  if not os.path.isfile(path):
    return None
  with open(path) as f:
    record = json.load(f)
  if record.get("format") != FORMAT:
    raise ValueError(f"{path}: inference bundle format {record.get('format')!r}, this version "
                     f"reads {FORMAT}; re-export the stage (--config.stages.<stage>.train."
                     "restart=True) or pass workdir= and data_config= of its data build")
  catalog = raw.load_catalog(os.path.join(inference, record["items_file"]))
  sids = rqvae.load_sids(os.path.join(inference, SIDS_FILE), catalog.num_items)
  rendering = requests_lib.make_rendering(catalog, sids, pipeline.prompt_config(data_config),
                                          np.asarray(record["thresholds"]), record, items)
  return Inference(tokenizer_lib.load_tokenizer(export), rendering, record["prompt_len"],
                   record["response_len"])
