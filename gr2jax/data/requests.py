"""Re-ranking requests: read and check them against a catalogue, render them as the data build
rendered its training examples, and turn a model's response into the answer row.

A request is one JSON object, `{"id": ..., "history": [item, ...] (oldest first),
"candidates": [item, ...] (D's order)}`; an item is its index in the catalogue (the line order of
`items.jsonl(.gz)`) or its ASIN. The catalogue is the data build's or a user-supplied
`items.jsonl` (same format, gr2jax/data/raw.py); when the prompt shows semantic IDs, every item
needs one of the data build's (matched by ASIN).

A request is rendered exactly as the model saw its training data (`Rendering`): the data build's
prompt config, and the per-candidate evidence buckets of gr2jax/data/evidence.py with the exact
thresholds the build fit on its training lists over the last `max_history` items
(gr2jax/data/build_rendering.py reads them from a data build; an export's inference bundle,
gr2jax/decoding/bundle.py, carries them). This module reads no data build: serving imports it.

Rows: an answer `{"line", "id", "ranking": [items best first, as given], "ranking_slots",
"reasoning", "kind": answer validity, "fallback": bool, "response"}` (an invalid answer falls back
to D's order), or an error `{"line", "id", "error": {"kind": ERROR_KINDS, "message"}}`.
"""

import dataclasses
import json
import pathlib
from collections.abc import Callable, Iterable

import numpy as np

from gr2jax.data import answer, prompts, raw
from gr2jax.data import evidence as evidence_lib
from gr2jax.data.records import Catalog, RerankExample
from gr2jax.data.split import PAD

ERROR_KINDS = ("malformed_json", "not_an_object", "missing_field", "bad_field", "unknown_item",
               "no_semantic_id", "wrong_candidate_count", "duplicate_candidates")
REQUIRED_FIELDS = ("id", "history", "candidates")
# The data build's example settings a Rendering reads (its fields after the thresholds, in order).
RENDERING_SETTINGS = ("evidence_decay", "evidence_window", "max_history", "num_candidates")


class RequestError(ValueError):
  """A bad request.

  Attributes:
    kind: one of ERROR_KINDS.
    field: the request field at fault ('history[3]', 'candidates', 'id', or 'body' for the
      request as a whole).
  """

  def __init__(self, kind: str, message: str, field: str = "body"):
    super().__init__(message)
    self.kind = kind
    self.field = field


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
      raise RequestError("bad_field", f"{field}: item ids are ints or ASIN strings, got {value!r}",
                         field)
    if isinstance(value, str):
      if value not in self.asin_index:
        raise RequestError("unknown_item", f"{field}: ASIN {value!r} is not in the catalogue",
                           field)
      item = self.asin_index[value]
    else:
      if not 0 <= value < self.catalog.num_items:
        raise RequestError("unknown_item", f"{field}: item {value} is outside the catalogue's "
                                           f"0..{self.catalog.num_items - 1}", field)
      item = value
    if needs_sids and self.sids[item, 0] < 0:
      raise RequestError("no_semantic_id", f"{field}: item {value!r} has no semantic ID in the "
                                           "data build the model was trained on", field)
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


@dataclasses.dataclass(frozen=True)
class Rendering:
  """How the data build turns a request into a prompt.

  Attributes:
    catalogue: the items requests may name.
    prompt: the data build's PromptConfig.
    thresholds: [3, 3] evidence bucket thresholds fit by the data build (exact, not the
      summary's rounded ones: build_rendering.build_thresholds).
    evidence_decay, evidence_window: the data build's evidence settings.
    max_history: history items an example keeps (the evidence sees the last evidence_window).
    num_candidates: N.
  """

  catalogue: Catalogue
  prompt: prompts.PromptConfig
  thresholds: np.ndarray
  evidence_decay: float
  evidence_window: int
  max_history: int
  num_candidates: int

  @property
  def needs_sids(self) -> bool:
    """The prompt shows semantic IDs, so every item of a request needs one."""
    return self.prompt.answer_format == "sid" or "sid" in self.prompt.fields


def request_line(item) -> str:
  """A request as its JSONL line: a line as given, a request dict written as JSON.

  Raises:
    RequestError: malformed_json, for a value JSON cannot write.
  """
  if isinstance(item, str):
    return item
  try:
    return json.dumps(item)
  except (TypeError, ValueError) as e:
    raise RequestError("malformed_json", str(e)) from None


def parse_request(line, lineno: int, catalogue: Catalogue, num_candidates: int,
                  needs_sids: bool) -> Request:
  """Reads and checks one request: a JSONL line or a request dict (request_line).

  Raises:
    RequestError: with the kind of the first problem found.
  """
  line = request_line(line)
  try:
    obj = json.loads(line)
  except (json.JSONDecodeError, RecursionError) as e:
    raise RequestError("malformed_json", f"not a JSON line: {e}") from None
  if not isinstance(obj, dict):
    raise RequestError("not_an_object", f"expected a JSON object, got {type(obj).__name__}")
  missing = [f for f in REQUIRED_FIELDS if f not in obj]
  if missing:
    raise RequestError("missing_field", f"missing field(s) {missing}", missing[0])
  if isinstance(obj["id"], dict | list):
    raise RequestError("bad_field", f"id must be a string or number, got {obj['id']!r}", "id")
  for field in ("history", "candidates"):
    if not isinstance(obj[field], list):
      raise RequestError("bad_field", f"{field} must be a list of item ids, "
                                      f"got {type(obj[field]).__name__}", field)
  history = [catalogue.resolve(v, f"history[{i}]", needs_sids)
             for i, v in enumerate(obj["history"])]
  candidates = [catalogue.resolve(v, f"candidates[{i}]", needs_sids)
                for i, v in enumerate(obj["candidates"])]
  if len(candidates) != num_candidates:
    raise RequestError("wrong_candidate_count", f"{len(candidates)} candidates; the model was "
                                                f"trained on lists of {num_candidates}",
                       "candidates")
  seen = {}
  for i, item in enumerate(candidates):
    if item in seen:
      raise RequestError("duplicate_candidates", f"candidates[{i}] repeats candidates"
                                                 f"[{seen[item]}] (item {item})",
                         f"candidates[{i}]")
    seen[item] = i
  return Request(lineno, obj["id"], np.asarray(history, np.int32),
                 np.asarray(candidates, np.int32), tuple(obj["candidates"]))


def _request_id(line):
  """The id of an unreadable request (a line or a dict) when one can be read, else None."""
  try:
    obj = json.loads(request_line(line))
  except (ValueError, RecursionError):  # RequestError included
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
  return read_lines(lines, lambda line, lineno: parse_request(line, lineno, catalogue,
                                                              num_candidates, needs_sids))


def read_lines(lines: Iterable, read: Callable[[object, int], object]) -> list:
  """read(line, lineno) of each non-blank line (lineno 1-based), or its error row where it
  raises a RequestError, in input order: how read_requests and the offline tool (with
  Reranker.prepare) read their input."""
  out = []
  for lineno, line in enumerate(lines, start=1):
    if isinstance(line, str) and not line.strip():
      continue
    try:
      out.append(read(line, lineno))
    except RequestError as e:
      out.append(error_row(lineno, _request_id(line), e))
  return out


def error_row(lineno: int, request_id, error: RequestError) -> dict:
  return {"line": lineno, "id": request_id,
          "error": {"kind": error.kind, "field": error.field, "message": str(error)}}


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


def to_examples(requests: list[Request], rendering: Rendering) -> list[RerankExample]:
  """RerankExamples of requests, with the evidence buckets the data build would compute."""
  if not requests:
    return []
  candidates = np.stack([r.candidates for r in requests])
  levels = evidence_levels([r.history for r in requests], candidates, rendering.catalogue,
                           rendering.max_history, rendering.evidence_decay,
                           rendering.evidence_window)
  buckets = evidence_lib.bucketize(levels, rendering.thresholds)
  width = rendering.max_history
  return [RerankExample(user=-1, split="request",
                        history=r.history[-width:] if width else r.history[:0],
                        candidates=candidates[e], target_position=-1,
                        retriever_scores=np.zeros(len(candidates[e]), np.float32),
                        evidence=buckets[e]) for e, r in enumerate(requests)]


def render(requests: list[Request], rendering: Rendering) -> list[prompts.RenderedExample]:
  """The rendered prompts (and answer labels) of requests, as the data build renders them."""
  sids = np.maximum(rendering.catalogue.sids, 0)
  return [prompts.render_example(e, rendering.catalogue.catalog, sids, rendering.prompt)
          for e in to_examples(requests, rendering)]


def make_rendering(build_catalog: Catalog, sids: np.ndarray, prompt: prompts.PromptConfig,
                   thresholds: np.ndarray, settings, items: str = "") -> Rendering:
  """The Rendering of a build's catalogue and semantic IDs, its prompt, its exact evidence
  thresholds and `settings` (a mapping holding RENDERING_SETTINGS: the build's examples config).

  Args:
    items: a user-supplied items.jsonl ('' = the build's catalogue), matched to the build's
      semantic IDs by ASIN.
  """
  catalog = raw.load_catalog(pathlib.Path(items)) if items else build_catalog
  return Rendering(Catalogue.make(catalog, sids, build_catalog), prompt,
                   np.asarray(thresholds, np.float64),
                   *(settings[name] for name in RENDERING_SETTINGS))


def answer_row(request: Request, response: str, result: answer.AnswerResult) -> dict:
  """The output row of an answered request: its response and the parsed answer (the reranker's
  read_answers; an invalid answer's ranking is D's order)."""
  slots = [int(s) for s in result.ranking]
  return {"line": request.line, "id": request.id,
          "ranking": [request.candidate_ids[s] for s in slots], "ranking_slots": slots,
          "reasoning": answer.reasoning_text(response), "kind": result.kind,
          "fallback": result.kind != "valid", "response": response}
