"""A data build's request Rendering (data/requests.py), read from the build's own files.

The build side of re-ranking: `load_rendering(summary, data_config)` reads the catalogue and the
semantic IDs the build rendered its prompts with (`build_sids`) and its exact evidence thresholds
(`build_thresholds`). The summary keeps the thresholds rounded to 6 decimals and levels often sit
exactly on one, so they are recovered from the build's own TFDS records (`exact_thresholds`).

A stage's export carries what this computes in its inference bundle (decoding/bundle.write, called
by train/loop.py and weights_conversion/add_bundle.py), so serving reads neither this module nor
the pipeline, RQ-VAE and TFDS modules it imports; an export without a bundle reads it through
decoding/reranker.py when given the workdir of its data build.
"""

import pathlib

import numpy as np

from gr2jax.data import evidence as evidence_lib
from gr2jax.data import prompts, raw, rqvae, tfds_builder
from gr2jax.data.records import Catalog
from gr2jax.data.requests import Catalogue, Rendering, evidence_levels, make_rendering


def load_rendering(summary: dict, data_config, items: str = "") -> Rendering:
  """The Rendering of a data build (its pipeline.run summary and config).

  Args:
    summary: the data build's summary.
    data_config: its config (the prompt: prompts.prompt_config).
    items: a user-supplied items.jsonl ('' = the build's catalogue).
  """
  build_catalog, sids = build_sids(summary)
  thresholds = build_thresholds(summary, Catalogue.make(build_catalog, sids))
  return make_rendering(build_catalog, sids, prompts.prompt_config(data_config), thresholds,
                        summary["examples"]["config"], items)


def build_sids(summary: dict) -> tuple[Catalog, np.ndarray]:
  """The data build's catalogue and semantic IDs [I, L + 1], from the paths of its summary
  (`pipeline.run(...)['paths']`: items.jsonl.gz and the sids.npy the prompts were rendered with).
  """
  catalog = raw.load_catalog(pathlib.Path(summary["paths"]["items"]))
  return catalog, rqvae.load_sids(summary["paths"]["sids"], catalog.num_items)


def exact_thresholds(rounded: np.ndarray, levels: np.ndarray, buckets: np.ndarray,
                     unit: float = 1e-6) -> np.ndarray:
  """The build's evidence thresholds, recovered from the rounded ones its summary keeps.

  The summary rounds them to 6 decimals, and evidence levels often sit exactly on a threshold
  (a quantile of repeated values such as 1/3), so the rounded value would move such levels up a
  bucket. Within half a rounding unit of each rounded threshold, the build's own records say
  which levels were above it: the exact threshold is the largest level there that was not.

  Args:
    rounded: [3, 3] thresholds from the summary.
    levels: [M, 3] evidence levels of the build's records (requests.evidence_levels).
    buckets: [M, 3] the buckets the build gave them.
    unit: the rounding unit.

  Returns:
    [3, 3] thresholds that give every one of the records its build bucket.
  """
  out = np.asarray(rounded, np.float64).copy()
  for k in range(out.shape[0]):
    v, b = levels[:, k], buckets[:, k]
    for j in range(out.shape[1]):
      near = (np.abs(v - out[k, j]) <= unit / 2) & (v > 0)
      below = near & (b < j + 2)  # bucket = 1 + the number of thresholds a level exceeds
      if below.any():
        out[k, j] = v[below].max()
      elif near.any():  # every level there was above: the lowest threshold the rounding allows
        out[k, j] -= unit / 2
  return out


def build_thresholds(summary: dict, catalogue: Catalogue,
                     limit: int = 5000) -> np.ndarray:
  """The data build's exact evidence thresholds (exact_thresholds on its first `limit` training
  records; the records' history and candidates are the build's own)."""
  cfg = summary["examples"]["config"]
  rounded = np.asarray([summary["examples"]["evidence_thresholds"][k]
                        for k in evidence_lib.KINDS], np.float64)
  source = tfds_builder.data_source(summary["paths"]["tfds"], "train")
  records = [source[i] for i in range(min(limit, len(source)))]
  levels = evidence_levels([r["history"] for r in records],
                           np.stack([r["candidates"] for r in records]), catalogue,
                           cfg["max_history"], cfg["evidence_decay"], cfg["evidence_window"])
  buckets = np.stack([r["evidence"] for r in records])
  return exact_thresholds(rounded, levels.reshape(-1, 3), buckets.reshape(-1, 3))
