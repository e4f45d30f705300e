"""The server's one adapter onto the re-ranking library: load, parse, warm, rank.

Every call the server makes into the offline re-ranking tool (gr2jax/rerank.py: the catalogue,
request parsing and validation, rendering a request into the data build's prompt with its exact
evidence thresholds, the answer row) and into the checkpoint's decoder
(train/evaluation.decode_batch) is in this module, so the HTTP, batching and metrics code never
sees them. A request is answered exactly as `rerank.rerank_lines` answers it: the same rendered
prompt, the same decoder and decode spec (eval tau, step cap), the same validation, and an
invalid answer falls back to D's order.

Shapes are static: `rank` decodes a list of requests as one [bucket, prompt_len] batch, rows past
the list repeating its last prompt (inputs.prompt_arrays, as the offline tool pads its last
batch); a repeated row finishes when its source does, so padding never lengthens the decode loop.
`warm(bucket, prompt_len)` runs that very program once, so serving never compiles.
"""

import dataclasses
import os
import re
import threading

import jax
import numpy as np

from gr2jax import rerank
from gr2jax.data import batches, prompts
from gr2jax.train import evaluation, inputs

_FIELD = re.compile(r"^(id|history|candidates)(\[\d+\])?(?!\w)")
_counts = {"compiles": 0, "cache_hits": 0}


def _on_duration(event: str, duration: float, **kwargs) -> None:
  del duration, kwargs
  if event == "/jax/core/compile/backend_compile_duration":
    _counts["compiles"] += 1


def _on_event(event: str, **kwargs) -> None:
  del kwargs
  if event == "/jax/compilation_cache/cache_hits":
    _counts["cache_hits"] += 1


jax.monitoring.register_event_duration_secs_listener(_on_duration)
jax.monitoring.register_event_listener(_on_event)


def compile_count() -> int:
  """XLA programs this process has compiled or loaded from the persistent cache so far."""
  return _counts["compiles"]


def cache_hits() -> int:
  """Programs this process has loaded from the persistent compilation cache so far."""
  return _counts["cache_hits"]


def use_compilation_cache(directory: str) -> None:
  """JAX's persistent compilation cache in `directory`, every program cached (before the first
  compile of the process: JAX reads the setting once)."""
  os.makedirs(directory, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


def _field_of(obj, error: dict) -> str:
  """The request field an error row of rerank.read_requests is about."""
  if error["kind"] == "missing_field":
    return next(f for f in rerank.REQUIRED_FIELDS if f not in obj)
  found = _FIELD.match(error["message"])
  if found:
    return found.group(0)
  return "candidates" if error["kind"] == "wrong_candidate_count" else "body"


class InputError(ValueError):
  """A request the model cannot answer.

  Attributes:
    kind: rerank.ERROR_KINDS or 'prompt_too_long'.
    field: the request field at fault ('history[3]', 'candidates', ...).
  """

  def __init__(self, kind: str, field: str, message: str):
    super().__init__(message)
    self.kind = kind
    self.field = field


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A validated request, rendered and tokenized.

  Attributes:
    request: the parsed request (rerank.Request).
    encoded: its tokenized prompt and candidate labels (batches.EncodedExample).
    labels: [N] the candidates' answer labels.
    prompt_len: the smallest compiled prompt length that holds it.
    history_dropped: oldest history items cut, as the data build cuts to its max_history.
  """

  request: rerank.Request
  encoded: batches.EncodedExample
  labels: tuple
  prompt_len: int
  history_dropped: int


class Engine:
  """A trained re-ranker and the data build it was trained on, behind four calls.

  Args:
    reranker: rerank.Reranker (the model, tokenizer, catalogue, prompt, evidence settings).
    tau: diffusion commit threshold (the recipe's eval_tau; ignored for AR).
    max_steps_per_block: diffusion denoising-step cap per block.
    prompt_lengths: the compiled prompt widths P, each a multiple of inputs.LENGTH_MULTIPLE.
    name: the model's name in answers.
  """

  def __init__(self, reranker: rerank.Reranker, *, tau: float, max_steps_per_block: int,
               prompt_lengths: tuple[int, ...], name: str):
    if not prompt_lengths or any(p < 1 for p in prompt_lengths):
      raise ValueError(f"serve.prompt_lengths={prompt_lengths!r}: need prompt widths >= 1")
    self.reranker = reranker
    self.tau = tau
    self.max_steps_per_block = max_steps_per_block
    self.prompt_lengths = tuple(sorted(set(prompt_lengths)))
    self.name = name
    self._sids = np.maximum(reranker.catalogue.sids, 0)
    self._tokenizer_lock = threading.Lock()  # encode on the event loop, decode on the worker

  @classmethod
  def load(cls, ckpt: str, workdir: str, data_config, decode, *, items: str = "",
           max_new_tokens: int = 0, prompt_lengths: tuple[int, ...] = (),
           name: str = "") -> "Engine":
    """The engine of an export and its data build (rerank.load_reranker).

    Args:
      ckpt: the model export (AR or diffusion).
      workdir: the workdir of the export's data build.
      data_config: the data build's config (gr2jax.recipe.data_config of the model's recipe).
      decode: the recipe's DecodeSpec (eval_tau, max_steps_per_block).
      items: a user-supplied items.jsonl ('' = the build's catalogue).
      max_new_tokens: response cap (0 = the build's R).
      prompt_lengths: compiled prompt widths (() = the build's P, recipe.lengths).
      name: the model's name in answers ('' = from the export's metadata).
    """
    from gr2jax import checkpoint
    from gr2jax import recipe as recipe_lib
    from gr2jax.data import pipeline

    reranker = rerank.load_reranker(ckpt, data_config, workdir, items=items,
                                    max_new_tokens=max_new_tokens)
    if not prompt_lengths:
      prompt_lengths = (recipe_lib.lengths(pipeline.run(data_config, workdir))[0],)
    if not name:
      meta = checkpoint.load_metadata(ckpt)
      name = (f"{meta['stage']}-step{meta['step']}" if "stage" in meta
              else os.path.basename(os.path.normpath(ckpt)))
    return cls(reranker, tau=decode.eval_tau, max_steps_per_block=decode.max_steps_per_block,
               prompt_lengths=prompt_lengths, name=name)

  @property
  def kind(self) -> str:
    """'diffusion' or 'ar'."""
    return "ar" if self.reranker.model_config.mask_token_id is None else "diffusion"

  @property
  def num_candidates(self) -> int:
    return self.reranker.num_candidates

  def _render(self, obj: dict) -> tuple[rerank.Request, batches.EncodedExample, tuple]:
    """The request, its prompt tokenized as batches.encode_examples tokenizes prompts (the
    other fields empty: nothing else is decoded) and its candidates' labels."""
    r = self.reranker
    [parsed] = rerank.read_requests([obj], r.catalogue, r.num_candidates, r.needs_sids)
    if not isinstance(parsed, rerank.Request):
      raise InputError(parsed["error"]["kind"], _field_of(obj, parsed["error"]),
                       parsed["error"]["message"])
    [example] = rerank.to_examples([parsed], r)
    rendered = prompts.render_example(example, r.catalogue.catalog, self._sids, r.prompt)
    with self._tokenizer_lock:
      ids = r.tokenizer([rendered.prompt], add_special_tokens=False)["input_ids"][0]
    empty = np.zeros((0,), np.int32)
    encoded = batches.EncodedExample(np.asarray(ids, np.int32), empty, empty,
                                     np.zeros((0, 0), np.int32), 0)
    return parsed, encoded, rendered.labels

  def parse(self, obj: dict) -> Prepared:
    """Validates, renders and tokenizes one request object ({"id", "history", "candidates"}).

    Raises:
      InputError: naming the field (rerank.parse_request's checks, then a prompt longer than
        every compiled prompt length).
    """
    parsed, encoded, labels = self._render(obj)
    fits = [p for p in self.prompt_lengths if p >= len(encoded.prompt)]
    if not fits:
      raise InputError("prompt_too_long", "history",
                       f"the request's prompt is {len(encoded.prompt)} tokens, longer than the "
                       f"compiled prompt lengths {self.prompt_lengths} (serve.prompt_lengths); "
                       "send fewer history items")
    return Prepared(parsed, encoded, labels, fits[0],
                    max(len(parsed.history) - self.reranker.max_history, 0))

  def example(self) -> dict:
    """A valid request of the catalogue's first items (the warm-up's and a client's template)."""
    r = self.reranker
    usable = np.flatnonzero(r.catalogue.sids[:, 0] >= 0) if r.needs_sids else np.arange(
      r.catalogue.catalog.num_items)
    items = [int(i) for i in usable[:r.num_candidates + 3]]
    return {"id": "example", "history": items[r.num_candidates:],
            "candidates": items[:r.num_candidates]}

  def _decode(self, encoded: list, bucket: int, prompt_len: int) -> tuple[list[str], dict]:
    r = self.reranker
    config = r.model_config
    tokens, lengths = inputs.prompt_arrays(encoded, bucket, prompt_len, config.pad_token_id)
    out = evaluation.decode_batch(r.params, config, tokens, lengths,
                                  max_new_tokens=r.max_new_tokens, tau=self.tau,
                                  max_steps_per_block=self.max_steps_per_block)
    n = len(encoded)
    with self._tokenizer_lock:
      texts = evaluation.response_texts(r.tokenizer, out["tokens"][:n], out["lengths"][:n])
    return texts, out

  def rank(self, batch: list[Prepared], bucket: int, prompt_len: int) -> list[dict]:
    """Decodes requests together as one [bucket, prompt_len] batch.

    Args:
      batch: at most `bucket` Prepared requests, each with prompt_len >= its own.
      bucket: the compiled batch size.
      prompt_len: the compiled prompt width.

    Returns:
      Per request: {"ranking" (ids as given, best first), "reasoning", "valid", "fallback",
      "response" (the raw text), "forwards" (its forward passes, prefill and commit forwards
      included), "tokens" (its response length)}.
    """
    if not 0 < len(batch) <= bucket:
      raise ValueError(f"rank: {len(batch)} requests for a batch of {bucket}")
    texts, out = self._decode([p.encoded for p in batch], bucket, prompt_len)
    rows = []
    for i, (p, text) in enumerate(zip(batch, texts, strict=True)):
      row = rerank.answer_row(p.request, text, p.labels)
      rows.append({"ranking": row["ranking"], "reasoning": row["reasoning"],
                   "valid": row["kind"] == "valid", "fallback": row["fallback"],
                   "response": text, "forwards": int(out["nfe"][i]),
                   "tokens": int(out["lengths"][i])})
    return rows

  def warm(self, bucket: int, prompt_len: int) -> None:
    """Compiles (or loads from the persistent cache) the [bucket, prompt_len] program."""
    _, encoded, _ = self._render(self.example())
    encoded = dataclasses.replace(encoded, prompt=encoded.prompt[:prompt_len])
    self._decode([encoded], bucket, prompt_len)
