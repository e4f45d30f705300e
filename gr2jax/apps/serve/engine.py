"""The server's one adapter onto the re-ranking library: load, parse, warm, rank.

The server answers a request exactly as the offline tool (gr2jax/apps/rerank.py) does, with the
same two calls of gr2jax/decoding/reranker.py's Reranker: `parse` is Reranker.prepare (read and
validated by gr2jax/data/requests.py, rendered into the data build's prompt with its exact
evidence thresholds, encoded) plus the compiled width that holds it, and `rank` is Reranker.rows
(the model's policy decodes the batch at the export's decode spec: AR, block diffusion,
constrained answers; texts, parsed answers, an invalid answer falling back to D's order).

Shapes are static: `rank` answers a list of requests with Reranker.rows as one [bucket,
prompt_len] batch, rows past the list repeating its last prompt (as the offline tool pads its last
batch); a repeated row finishes when its source does, so padding never lengthens the decode loop.
`warm(bucket, prompt_len)` runs that very program once, so serving never compiles.

The engine holds the serve spec's decoder choice (auto.py: `choice`, auto.Fixed or auto.Auto)
and asks it which decoder serves each bucket. serve.mode='auto': the engine holds its drafter and
AR verifier once and decodes each bucket with the exact decoder a cost table chose for it
(`use_costs`; `time_decoders` measures one bucket's); every row says which decoder wrote it.
"""

import dataclasses
import logging
import os

import jax
import numpy as np

from gr2jax import exports
from gr2jax import workdir as workdir_lib
from gr2jax.apps.serve import auto
from gr2jax.apps.serve import spec as spec_lib
from gr2jax.data import requests as requests_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.model import decode_core

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
  compile of the process: JAX reads the setting once). A directory that cannot be created (a
  read-only workdir) is logged and served without; an existing read-only one is still read."""
  try:
    os.makedirs(directory, exist_ok=True)
  except OSError as e:
    logging.warning("serve.compilation_cache=%s: cannot create it (%s); serving without the "
                    "persistent compilation cache", directory, e.strerror)
    return
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)


InputError = requests_lib.RequestError  # a request the model cannot answer: kind (ERROR_KINDS
#                                        or 'prompt_too_long') and the field at fault


def check_fits(decoders: dict, prompt_lengths: tuple[int, ...], build_width: int) -> None:
  """The serve spec's prompt widths and response cap against the build and the models, before
  anything compiles: a server that starts can answer the build's prompts.

  Args:
    decoders: the engine's decoders (name -> Reranker; each policy's models and response cap,
      serve.max_new_tokens or the build's R).
    prompt_lengths: the compiled prompt widths (serve.prompt_lengths, or the build's P).
    build_width: the build's prompt width P (its longest prompt, data/lengths.py).

  Raises:
    ValueError: one line naming the field and the bound: serve.prompt_lengths whose widest is
      below P (the build's longer prompts would fit no compiled width; below all of them,
      /healthz said ready and every request got a 422 blaming its history), serve.max_new_tokens
      whose response after the widest prompt needs more positions than a model has
      (decode_core.slots_needed against max_position_embeddings), with the largest that fits.
  """
  widest = max(prompt_lengths)
  if widest < build_width:
    raise ValueError(f"serve.prompt_lengths={tuple(prompt_lengths)!r}: the widest, {widest}, is "
                     f"shorter than the build's prompt width P={build_width} (its longest "
                     "prompt), so the build's longer prompts would fit no compiled width: "
                     f"include {build_width} (serve.prompt_lengths=() compiles P alone)")
  models = [(name, config, r.policy.max_new_tokens) for r in decoders.values()
            for name, config in r.policy.models]
  for name, config, n in models:
    need = decode_core.slots_needed(config, widest, n)
    if need > config.max_position_embeddings:
      most = min(decode_core.most_new_tokens(c, widest) for _, c, _ in models)
      fix = (f"set serve.max_new_tokens <= {most}" if most >= 1 else
             f"no response fits after {widest} tokens: lower serve.prompt_lengths")
      raise ValueError(f"serve.max_new_tokens: a response cap of {n} tokens (0 = the build's R) "
                       f"after prompts of width {widest} (serve.prompt_lengths) needs {need} "
                       f"positions; {name} has {config.max_position_embeddings} "
                       f"(max_position_embeddings): {fix}")


class Engine:
  """A trained re-ranker and the data build it was trained on, behind four calls.

  Args:
    reranker: reranker.Reranker (the model's params and policy, tokenizer, rendering).
    prompt_lengths: the compiled prompt widths P, each a multiple of lengths.LENGTH_MULTIPLE;
      the widest at least the build's (check_fits).
    name: the model's name in answers.
    choice: the decoder choice (auto.py): auto.Fixed() (the reranker's own decoder) or
      auto.Auto (a lossless reranker's exact decoders, chosen per bucket by a cost table).

  The event loop prepares requests (parse) while the worker decodes (rank): the reranker's
  tokenizer lock, shared by its decoders, keeps their tokenizer reads apart.
  """

  def __init__(self, reranker: reranker_lib.Reranker, *, prompt_lengths: tuple[int, ...],
               name: str, choice: auto.Choice = auto.FIXED):
    if not prompt_lengths or any(p < 1 for p in prompt_lengths):
      raise ValueError(f"serve.prompt_lengths={prompt_lengths!r}: need prompt widths >= 1")
    self.reranker = reranker
    self.prompt_lengths = tuple(sorted(set(prompt_lengths)))
    self.name = name
    self.choice = choice  # Auto: its costs replaced once settled (use_costs, settle)
    self.decoders = choice.decoders(reranker)
    check_fits(self.decoders, self.prompt_lengths, reranker.prompt_len)

  @classmethod
  def load(cls, spec: spec_lib.ServeSpec, *, workdir: str, data_config=None,
           decode=None) -> "Engine":
    """The engine of the spec's export and its data build (reranker.load_reranker: what the
    export records, unless given).

    Args:
      spec: the serve spec: its ckpt (the model export, AR or diffusion), prompt_lengths (() =
        the build's P, data/lengths.py), model_name ('' = from the export's metadata),
        items_file, max_new_tokens, verify_with (an AR export verifying ckpt's drafts: the
        lossless mode) and choice; '{workdir}' in its paths filled in with workdir
        (workdir.fill_path).
      workdir: the workdir of the data build (of an export without an inference bundle).
      data_config, decode: reranker.load_reranker's (the recipe's data build and decode spec).

    Raises:
      ValueError: reranker.load_reranker's; serve.prompt_lengths or serve.max_new_tokens the
        build and the model cannot serve (check_fits), before anything compiles.
    """
    ckpt = workdir_lib.fill_path(spec.ckpt, workdir)
    reranker = reranker_lib.load_reranker(
      ckpt, workdir=workdir, data_config=data_config, decode=decode, items=spec.items_file,
      max_new_tokens=spec.max_new_tokens,
      verify_with=workdir_lib.fill_path(spec.verify_with, workdir))
    name = spec.model_name
    if not name:
      meta = exports.load_metadata(ckpt)
      name = (f"{meta['stage']}-step{meta['step']}" if "stage" in meta
              else os.path.basename(os.path.normpath(ckpt)))
    return cls(reranker, prompt_lengths=spec.prompt_lengths or (reranker.prompt_len,),
               name=name, choice=spec.choice)

  @property
  def kind(self) -> str:
    """'lossless' (draft and verify), 'diffusion' or 'ar' (the policy's kind)."""
    return self.reranker.policy.kind

  @property
  def num_candidates(self) -> int:
    return self.reranker.rendering.num_candidates

  def parse(self, obj: dict) -> reranker_lib.Prepared:
    """Validates, renders and tokenizes one request object ({"id", "history", "candidates"}):
    Reranker.prepare, at the smallest compiled prompt width that holds it (its prompt_len).

    Raises:
      InputError: naming the field (requests.parse_request's checks, then a prompt longer than
        every compiled prompt length).
    """
    prepared = self.reranker.prepare(obj)
    length = len(prepared.encoded.prompt)
    fits = [p for p in self.prompt_lengths if p >= length]
    if not fits:
      raise InputError("prompt_too_long",
                       f"the request's prompt is {length} tokens, longer than the "
                       f"compiled prompt lengths {self.prompt_lengths} (serve.prompt_lengths); "
                       "send fewer history items", "history")
    return dataclasses.replace(prepared, prompt_len=fits[0])

  def example(self, index: int = 0) -> dict:
    """A valid request of the catalogue's items from its `index`-th on (the warm-up's and a
    client's template; distinct indices give distinct requests)."""
    r = self.reranker.rendering
    usable = np.flatnonzero(r.catalogue.sids[:, 0] >= 0) if r.needs_sids else np.arange(
      r.catalogue.catalog.num_items)
    items = [int(i) for i in np.roll(usable, -index)[:r.num_candidates + 3]]
    return {"id": "example", "history": items[r.num_candidates:],
            "candidates": items[:r.num_candidates]}

  def decoder(self, bucket: int) -> str:
    """The decoder of a bucket, as the decoder choice says (the one there is, or the cost
    table's cheapest)."""
    return self.choice.decoder(bucket, self.decoders)

  def use_costs(self, table: auto.CostTable) -> None:
    """Decodes each bucket of the table with its cheapest decoder from now on (auto.Auto)."""
    self.choice = self.choice.with_costs(table)

  def settle(self, injected: auto.CostTable | None, buckets: tuple[int, ...]) -> None:
    """After the warm-up: the decoder choice settled over the injected cost table, else each
    bucket's decoders timed at the first prompt width (the build's P by default); nothing to do
    for a fixed decoder."""
    self.choice = self.choice.settled(
      injected, lambda b: self.time_decoders(b, self.prompt_lengths[0]), buckets)

  def _rows(self, batch: list, bucket: int, prompt_len: int, decoder: str) -> reranker_lib.Ranked:
    return self.decoders[decoder].rows(batch, batch_rows=bucket, prompt_len=prompt_len)

  def rank(self, batch: list[reranker_lib.Prepared], bucket: int, prompt_len: int) -> list[dict]:
    """Decodes requests together as one [bucket, prompt_len] batch (Reranker.rows).

    Args:
      batch: at most `bucket` Prepared requests, each with prompt_len >= its own.
      bucket: the compiled batch size.
      prompt_len: the compiled prompt width.

    Returns:
      Per request: {"ranking" (ids as given, best first), "reasoning", "valid", "fallback",
      "response" (the raw text), "forwards" (its forward passes, prefill and commit forwards
      included), "tokens" (its response length), "decoder" (the one that wrote it)}.
    """
    if not 0 < len(batch) <= bucket:
      raise ValueError(f"rank: {len(batch)} requests for a batch of {bucket}")
    decoder = self.decoder(bucket)
    got = self._rows(batch, bucket, prompt_len, decoder)
    decoded = got.answers.decoded
    return [{"ranking": row["ranking"], "reasoning": row["reasoning"],
             "valid": row["kind"] == "valid", "fallback": row["fallback"],
             "response": row["response"], "forwards": int(decoded.nfe[i]),
             "tokens": int(decoded.lengths[i]), "decoder": decoder}
            for i, row in enumerate(got.rows)]

  def _examples(self, n: int, prompt_len: int) -> list[reranker_lib.Prepared]:
    """n distinct example requests, prepared, each prompt cut to prompt_len."""
    prepared = [self.reranker.prepare(self.example(i)) for i in range(n)]
    return [dataclasses.replace(p, encoded=dataclasses.replace(
      p.encoded, prompt=p.encoded.prompt[:prompt_len]), prompt_len=prompt_len) for p in prepared]

  def warm(self, bucket: int, prompt_len: int) -> None:
    """Compiles (or loads from the persistent cache) each decoder's [bucket, prompt_len]
    program."""
    examples = self._examples(1, prompt_len)
    for decoder in self.decoders:
      self._rows(examples, bucket, prompt_len, decoder)

  def time_decoders(self, bucket: int, prompt_len: int) -> dict[str, float]:
    """Seconds per [bucket, prompt_len] batch of each decoder (warm), on a warm-up batch of
    `bucket` distinct requests (auto.measure)."""
    examples = self._examples(bucket, prompt_len)
    return auto.measure(lambda decoder: self._rows(examples, bucket, prompt_len, decoder),
                        self.decoders)
