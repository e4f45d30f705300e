"""Re-ranking as a tool: JSONL requests in, the trained model's rankings and reasoning out.

  python experiments/run.py --config=rerank.py --workdir=W --config.rerank.ckpt=W/rl/export \
      --config.rerank.requests=req.jsonl --config.rerank.out=out.jsonl

  rows = gr2jax.rerank("req.jsonl", "W/rl/export", workdir="W")       # the same path in Python

A request is one JSON object per line, `{"id": ..., "history": [item, ...] (oldest first),
"candidates": [item, ...] (D's order)}`; an item is its index in the catalogue (the line order of
`items.jsonl(.gz)`) or its ASIN. The catalogue is the data build's (`data.data_dir`) or a
user-supplied `items.jsonl` (same format, gr2jax/data/raw.py); the model still needs the
semantic IDs of the data build when its prompt shows them, so such items must then be in the
build's catalogue (matched by ASIN).

Each request is rendered exactly as the model saw its training data: the data build's prompt
config (pipeline.prompt_config(config.data)), its tokenizer, and the per-candidate evidence
buckets of gr2jax/data/evidence.py with the thresholds the build fit on its training lists
(summary['examples']['evidence_thresholds']) over the last `max_history` items. Requests are
decoded in batches by the checkpoint's own decoder (train/evaluation.decode_batch: AR or block
diffusion), each answer is validated by data/answer.parse_answer, and an invalid one falls back
to D's order. Output rows (input order, one per non-blank line):

  {"line", "id", "ranking": [items best first, as given], "ranking_slots", "reasoning",
   "kind": answer validity, "fallback": bool, "response": the raw text}
  {"line", "id" (null when unreadable), "error": {"kind": ERROR_KINDS, "message": ...}}

A bad request is an error row and never stops the batch.
"""

import dataclasses
import json
import os
import pathlib
import sys
import types
from collections.abc import Iterable

import numpy as np

from gr2jax.data import answer, batches, prompts, raw, rqvae
from gr2jax.data import evidence as evidence_lib
from gr2jax.data.records import Catalog, RerankExample
from gr2jax.data.split import PAD
from gr2jax.progress import progress

ERROR_KINDS = ("malformed_json", "not_an_object", "missing_field", "bad_field", "unknown_item",
               "no_semantic_id", "wrong_candidate_count", "duplicate_candidates")
REQUIRED_FIELDS = ("id", "history", "candidates")


class RequestError(ValueError):
  """A bad request; `kind` is one of ERROR_KINDS."""

  def __init__(self, kind: str, message: str):
    super().__init__(message)
    self.kind = kind


@dataclasses.dataclass(frozen=True)
class Catalogue:
  """The items requests may name.

  Attributes:
    catalog: item metadata (the evidence reads brands and category paths).
    sids: [I, L] int32 semantic IDs of the data build, -1 rows for items it does not have.
    asin_index: ASIN -> item index.
    features: the interned brand / category ids the evidence compares (evidence.item_features).
  """

  catalog: Catalog
  sids: np.ndarray
  asin_index: dict
  features: evidence_lib.ItemFeatures

  @classmethod
  def make(cls, catalog: Catalog, sids: np.ndarray, sid_catalog: Catalog | None = None):
    """The catalogue of `catalog`; `sids` belong to `sid_catalog` (default: `catalog` itself)
    and are matched to `catalog`'s items by ASIN."""
    if sid_catalog is not None and sid_catalog.asins != catalog.asins:
      build = {a: i for i, a in enumerate(sid_catalog.asins)}
      rows = np.asarray([build.get(a, -1) for a in catalog.asins])
      sids = np.where(rows[:, None] >= 0, sids[np.maximum(rows, 0)], -1).astype(np.int32)
    return cls(catalog, np.asarray(sids, np.int32), {a: i for i, a in enumerate(catalog.asins)},
               evidence_lib.item_features(catalog))

  def resolve(self, value, field: str, needs_sids: bool) -> int:
    """The item index of a request's item id (an index or an ASIN).

    Raises:
      RequestError: unknown_item, bad_field (neither int nor str), no_semantic_id.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
      raise RequestError("bad_field", f"{field}: item ids are ints or ASIN strings, got {value!r}")
    if isinstance(value, str):
      if value not in self.asin_index:
        raise RequestError("unknown_item", f"{field}: ASIN {value!r} is not in the catalogue")
      item = self.asin_index[value]
    else:
      if not 0 <= value < self.catalog.num_items:
        raise RequestError("unknown_item", f"{field}: item {value} is outside the catalogue's "
                                           f"0..{self.catalog.num_items - 1}")
      item = value
    if needs_sids and self.sids[item, 0] < 0:
      raise RequestError("no_semantic_id", f"{field}: item {value!r} has no semantic ID in the "
                                           "data build the model was trained on")
    return item


@dataclasses.dataclass(frozen=True)
class Request:
  """One readable request.

  Attributes:
    line: 1-based line number in the input.
    id: the request's id, as given.
    history: [h] int32 item indices, oldest first.
    candidates: [N] int32 item indices in D's order.
    candidate_ids: the candidates' ids as given (rankings are reported in these).
  """

  line: int
  id: object
  history: np.ndarray
  candidates: np.ndarray
  candidate_ids: tuple


def parse_request(line: str, lineno: int, catalogue: Catalogue, num_candidates: int,
                  needs_sids: bool) -> Request:
  """Reads and checks one JSONL request line.

  Raises:
    RequestError: with the kind of the first problem found.
  """
  try:
    obj = json.loads(line)
  except (json.JSONDecodeError, RecursionError) as e:
    raise RequestError("malformed_json", f"not a JSON line: {e}") from None
  if not isinstance(obj, dict):
    raise RequestError("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
  missing = [f for f in REQUIRED_FIELDS if f not in obj]
  if missing:
    raise RequestError("missing_field", f"missing field(s) {missing}")
  if isinstance(obj["id"], dict | list):
    raise RequestError("bad_field", f"id must be a string or number, got {obj['id']!r}")
  for field in ("history", "candidates"):
    if not isinstance(obj[field], list):
      raise RequestError("bad_field", f"{field} must be a list of item ids, "
                                      f"got {type(obj[field]).__name__}")
  history = [catalogue.resolve(v, f"history[{i}]", needs_sids)
             for i, v in enumerate(obj["history"])]
  candidates = [catalogue.resolve(v, f"candidates[{i}]", needs_sids)
                for i, v in enumerate(obj["candidates"])]
  if len(candidates) != num_candidates:
    raise RequestError("wrong_candidate_count", f"{len(candidates)} candidates; the model was "
                                                f"trained on lists of {num_candidates}")
  seen = {}
  for i, item in enumerate(candidates):
    if item in seen:
      raise RequestError("duplicate_candidates", f"candidates[{i}] repeats candidates"
                                                 f"[{seen[item]}] (item {item})")
    seen[item] = i
  return Request(lineno, obj["id"], np.asarray(history, np.int32),
                 np.asarray(candidates, np.int32), tuple(obj["candidates"]))


def _request_id(line: str):
  """The id of an unreadable request when one can be read, else None."""
  try:
    obj = json.loads(line)
  except (ValueError, RecursionError):
    return None
  value = obj.get("id") if isinstance(obj, dict) else None
  return value if isinstance(value, str | int | float) else None


def read_requests(lines: Iterable, catalogue: Catalogue, num_candidates: int,
                  needs_sids: bool) -> list:
  """Requests and error rows, in input order (blank lines skipped).

  Args:
    lines: JSONL lines (str) or already-decoded request dicts.
    catalogue: the items requests may name.
    num_candidates: N the model was trained with.
    needs_sids: the prompt shows SIDs, so every item needs one.

  Returns:
    One Request or error row ({"line", "id", "error": {"kind", "message"}}) per non-blank line.
  """
  out = []
  for lineno, line in enumerate(lines, start=1):
    if not isinstance(line, str):
      try:
        line = json.dumps(line)
      except (TypeError, ValueError) as e:
        out.append(error_row(lineno, None, RequestError("malformed_json", str(e))))
        continue
    if not line.strip():
      continue
    try:
      out.append(parse_request(line, lineno, catalogue, num_candidates, needs_sids))
    except RequestError as e:
      out.append(error_row(lineno, _request_id(line), e))
  return out


def error_row(lineno: int, request_id, error: RequestError) -> dict:
  return {"line": lineno, "id": request_id, "error": {"kind": error.kind, "message": str(error)}}


@dataclasses.dataclass(frozen=True)
class Reranker:
  """Everything decoding a request needs: the model and the data build it was trained on.

  Attributes:
    params, model_config: the model (AR, or diffusion when model_config.mask_token_id is set).
    tokenizer: the data build's tokenizer.
    catalogue: the items requests may name.
    prompt: the data build's PromptConfig.
    thresholds: [3, 3] evidence bucket thresholds fit by the data build (evidence.fit_thresholds).
    evidence_decay, evidence_window: the data build's evidence settings.
    max_history: history items an example keeps (the evidence sees the last evidence_window).
    num_candidates: N.
    max_new_tokens: response cap.
  """

  params: dict
  model_config: object
  tokenizer: object
  catalogue: Catalogue
  prompt: prompts.PromptConfig
  thresholds: np.ndarray
  evidence_decay: float
  evidence_window: int
  max_history: int
  num_candidates: int
  max_new_tokens: int

  @property
  def needs_sids(self) -> bool:
    return self.prompt.answer_format == "sid" or "sid" in self.prompt.fields


def evidence_levels(histories: list, candidates: np.ndarray, catalogue: Catalogue,
                    max_history: int, decay: float, window: int) -> np.ndarray:
  """[E, N, 3] evidence.compute levels of item histories (oldest first) against candidates,
  with the histories cut to their last `max_history` items and right-aligned as in
  data/examples.py (evidence.compute looks at the last `window` of them)."""
  histories_arr = np.full((len(histories), max(max_history, 1)), PAD, np.int32)
  for e, history in enumerate(histories):
    h = np.asarray(history, np.int32)[-max_history:] if max_history else []
    histories_arr[e, histories_arr.shape[1] - len(h):] = h
  return evidence_lib.compute(catalogue.features, histories_arr, np.asarray(candidates, np.int32),
                              decay, window).values


def to_examples(requests: list[Request], reranker: Reranker) -> list[RerankExample]:
  """RerankExamples of requests, with the evidence buckets the data build would compute."""
  if not requests:
    return []
  candidates = np.stack([r.candidates for r in requests])
  levels = evidence_levels([r.history for r in requests], candidates, reranker.catalogue,
                           reranker.max_history, reranker.evidence_decay,
                           reranker.evidence_window)
  buckets = evidence_lib.bucketize(levels, reranker.thresholds)
  width = reranker.max_history
  return [RerankExample(user=-1, split="request",
                        history=r.history[-width:] if width else r.history[:0],
                        candidates=candidates[e], target_position=-1,
                        retriever_scores=np.zeros(len(candidates[e]), np.float32),
                        evidence=buckets[e]) for e, r in enumerate(requests)]


def reasoning_text(response: str) -> str:
  """The text of the `<think>` block of a response ('' when there is none; up to the end of
  the response when it was left open)."""
  start = response.find(prompts.THINK_START)
  if start < 0:
    return ""
  body = response[start + len(prompts.THINK_START):]
  end = body.find(prompts.THINK_END)
  return (body if end < 0 else body[:end]).strip()


def answer_row(request: Request, response: str, labels: tuple[str, ...]) -> dict:
  """The output row of an answered request (invalid answers fall back to D's order)."""
  result = answer.parse_answer(response, labels)
  slots = [int(s) for s in result.ranking]
  return {"line": request.line, "id": request.id,
          "ranking": [request.candidate_ids[s] for s in slots], "ranking_slots": slots,
          "reasoning": reasoning_text(response), "kind": result.kind,
          "fallback": result.kind != "valid", "response": response}


def decode_requests(requests: list[Request], reranker: Reranker, *, batch_size: int,
                    tau: float = 1.0, max_steps_per_block: int = 64,
                    desc: str = "rerank") -> list[dict]:
  """Renders, decodes (batched, one static prompt width) and answers readable requests."""
  from gr2jax.train import evaluation, inputs

  if not requests:
    return []
  examples = to_examples(requests, reranker)
  sids = np.maximum(reranker.catalogue.sids, 0)
  rendered = [prompts.render_example(e, reranker.catalogue.catalog, sids, reranker.prompt)
              for e in examples]
  encoded = batches.encode_examples(rendered, [0] * len(rendered), reranker.tokenizer)
  prompt_len = inputs.round_up(max(len(e.prompt) for e in encoded))
  config = reranker.model_config
  rows = []
  bar = progress(len(requests), desc=desc, unit="request")
  for first in range(0, len(requests), batch_size):
    chunk = encoded[first:first + batch_size]
    tokens, lengths = inputs.prompt_arrays(chunk, min(batch_size, len(encoded)), prompt_len,
                                           config.pad_token_id)
    out = evaluation.decode_batch(reranker.params, config, tokens, lengths,
                                  max_new_tokens=reranker.max_new_tokens, tau=tau,
                                  max_steps_per_block=max_steps_per_block)
    texts = evaluation.response_texts(reranker.tokenizer, out["tokens"][:len(chunk)],
                                      out["lengths"][:len(chunk)])
    for i, text in enumerate(texts):
      rows.append(answer_row(requests[first + i], text, rendered[first + i].labels))
    bar.update(len(chunk))
  bar.close()
  return rows


def rerank_lines(lines: Iterable, reranker: Reranker, *, batch_size: int = 64, tau: float = 1.0,
                 max_steps_per_block: int = 64) -> list[dict]:
  """Every request line answered or an error row, in input order (module docstring)."""
  parsed = read_requests(lines, reranker.catalogue, reranker.num_candidates,
                         reranker.needs_sids)
  good = [r for r in parsed if isinstance(r, Request)]
  answered = iter(decode_requests(good, reranker, batch_size=batch_size, tau=tau,
                                  max_steps_per_block=max_steps_per_block))
  return [next(answered) if isinstance(r, Request) else r for r in parsed]


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
    levels: [M, 3] evidence levels of the build's records (evidence_levels).
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


def build_thresholds(summary: dict, data_config, catalogue: Catalogue,
                     limit: int = 5000) -> np.ndarray:
  """The data build's exact evidence thresholds (exact_thresholds on its first `limit` training
  records; the records' history and candidates are the build's own)."""
  from gr2jax.data import tfds_builder

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


def load_reranker(ckpt: str, data_config, workdir: str, *, items: str = "",
                  max_new_tokens: int = 0) -> Reranker:
  """The Reranker of a checkpoint and the data build (in `workdir`) it was trained on.

  Args:
    ckpt: the model export (gr2jax checkpoint or HF directory).
    data_config: the data build's config (`config.data`; the one the model was trained with).
    workdir: the workdir of that data build (built here if missing; cached otherwise).
    items: a user-supplied items.jsonl ('' = the build's catalogue).
    max_new_tokens: response cap; 0 = the build's R (recipe.lengths, as the training runs).
  """
  from gr2jax import checkpoint
  from gr2jax import recipe as recipe_lib
  from gr2jax.data import pipeline
  from gr2jax.data import tokenizer as tokenizer_lib

  summary = pipeline.run(data_config, workdir)
  model_config, params = checkpoint.load_model(ckpt)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  build_catalog, sids = build_sids(summary)
  catalog = raw.load_catalog(pathlib.Path(items)) if items else build_catalog
  prompt = pipeline.prompt_config(data_config)
  checkpoint.check_data_build(ckpt, checkpoint.data_build_record(tok, prompt))
  stats = summary["examples"]
  if not max_new_tokens:
    max_new_tokens = recipe_lib.lengths(summary)[1]
  cfg = stats["config"]
  thresholds = build_thresholds(summary, data_config, Catalogue.make(build_catalog, sids))
  return Reranker(params, model_config, tok, Catalogue.make(catalog, sids, build_catalog), prompt,
                  thresholds, cfg["evidence_decay"], cfg["evidence_window"], cfg["max_history"],
                  cfg["num_candidates"], max_new_tokens)


def _lines_of(requests) -> Iterable:
  if isinstance(requests, str | os.PathLike):
    with open(requests, encoding="utf-8", errors="replace") as f:
      return f.read().splitlines()
  return requests


def rerank(requests, model, *, workdir: str | None = None, data_config=None, items: str = "",
           batch_size: int = 64, tau: float = 1.0, max_steps_per_block: int = 64,
           max_new_tokens: int = 0) -> list[dict]:
  """Re-ranks requests with a trained model (module docstring for formats).

  Args:
    requests: a JSONL path, or an iterable of JSONL lines / request dicts.
    model: a Reranker, or a checkpoint path (then `workdir` names its data build).
    workdir: the data build's workdir (with a checkpoint path).
    data_config: the data build's config (with a checkpoint path; gr2jax.recipe.data_config of
      the model's recipe).
    items: a user-supplied items.jsonl ('' = the build's catalogue).
    batch_size: decode batch size.
    tau: diffusion commit threshold (ignored for AR models).
    max_steps_per_block: diffusion denoising-step cap per block.
    max_new_tokens: response cap (0 = the build's longest training response).

  Returns:
    One row per non-blank request line, in order: an answer or a named error.
  """
  if not isinstance(model, Reranker):
    if workdir is None or data_config is None:
      raise ValueError("rerank(requests, <checkpoint path>) needs workdir= and data_config= "
                       "(the data build the model was trained on: "
                       "gr2jax.recipe.data_config(recipe))")
    model = load_reranker(str(model), data_config, workdir, items=items,
                          max_new_tokens=max_new_tokens)
  return rerank_lines(_lines_of(requests), model, batch_size=batch_size, tau=tau,
                      max_steps_per_block=max_steps_per_block)


def summarize(rows: list[dict]) -> dict:
  """Counts of answered / fallback / error rows and errors per kind."""
  errors = [r["error"]["kind"] for r in rows if "error" in r]
  answered = [r for r in rows if "error" not in r]
  return {"requests": len(rows), "answered": len(answered),
          "fallback": sum(r["fallback"] for r in answered), "errors": len(errors),
          "error_kinds": {k: errors.count(k) for k in ERROR_KINDS if k in errors}}


def check_out_path(out: str, requests: str) -> None:
  """Refuses an output path before anything is decoded: the requests file itself, a directory,
  or a path whose nearest existing parent directory is not writable.

  Raises:
    ValueError: names rerank.out and the reason.
  """
  if os.path.exists(out) and os.path.exists(requests) and os.path.samefile(out, requests):
    raise ValueError(f"rerank.out={out!r} is the requests file; writing it would overwrite "
                     "the requests (name another file)")
  if os.path.isdir(out):
    raise ValueError(f"rerank.out={out!r} is a directory; name a JSONL file")
  parent = os.path.dirname(os.path.abspath(out))
  while not os.path.exists(parent):
    parent = os.path.dirname(parent)
  if not os.path.isdir(parent) or not os.access(parent, os.W_OK | os.X_OK):
    raise ValueError(f"rerank.out={out!r}: cannot write under {parent!r}")


def write_rows(rows: list[dict], path: str) -> None:
  """Writes the rows as JSONL to `path` through a temp sibling, removed on any failure."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp-{os.getpid()}"
  try:
    with open(tmp, "w") as f:
      for row in rows:
        f.write(json.dumps(row, default=str) + "\n")
    os.replace(tmp, path)
  except BaseException:
    if os.path.isfile(tmp):
      os.remove(tmp)
    raise


def run(recipe, c, workdir: str) -> dict:
  """`--config=rerank.py`: reads c.requests, writes c.out, with the recipe's data build and
  decode spec (gr2jax/recipe.py).

  Args:
    recipe: the gr2jax.recipe.Recipe the model was trained with.
    c: the `rerank` block (ckpt, requests, out, items_file, batch_size, max_new_tokens).
    workdir: the workdir of the recipe's data build.
  """
  from gr2jax import recipe as recipe_lib
  from gr2jax.train import config_checks

  if not c.requests:
    raise ValueError("rerank.py needs --config.rerank.requests=<JSONL of requests>")
  config_checks.check_stage_config(types.SimpleNamespace(rerank=c))  # sizes, named
  out = c.out or os.path.splitext(c.requests)[0] + ".ranked.jsonl"
  check_out_path(out, c.requests)
  reranker = load_reranker(c.ckpt.format(workdir=workdir), recipe_lib.data_config(recipe),
                           workdir, items=c.items_file, max_new_tokens=c.max_new_tokens)
  rows = rerank_lines(_lines_of(c.requests), reranker, batch_size=c.batch_size,
                      tau=recipe.decode.eval_tau,
                      max_steps_per_block=recipe.decode.max_steps_per_block)
  write_rows(rows, out)
  summary = summarize(rows) | {"out": out}
  print(json.dumps(summary), flush=True)
  return summary


class _CallableModule(types.ModuleType):
  """`gr2jax.rerank(...)` calls `rerank` above: the package exports this module under its own
  name (so `from gr2jax import rerank` is the same object whatever was imported first) and the
  module calls through to its function."""

  def __call__(self, *args, **kwargs):
    return rerank(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
