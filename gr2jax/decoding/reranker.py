"""THE inference object: a trained re-ranker answering encoded examples and requests.

A `Reranker` (like gemma's `Sampler`) holds the model's params in the decoders' layout, its
policy (policy.py: AR, block diffusion at the spec's eval tau, or the lossless draft-and-verify
pair), the data build's tokenizer (and the lock every read of it holds: a server encodes on one
thread while its worker decodes on another) and request rendering, and the prompt width P. It
answers a batch of encoded examples in one call, `Reranker.answer`: prompt arrays of one static
shape [rows, P], steering (the answer constraint of the examples' candidates when the spec is
constrained; a given reasoning), policy.decode, then `read_answers` (texts, then
data/answer.parse_answer). Requests go through it in two calls: `prepare` reads one (a JSONL
line or a request dict; data/requests.py, a RequestError naming the field), renders and encodes
it, and `rows` answers prepared requests as one batch with their answer rows. The evaluation
(evaluation.py), the offline tool (gr2jax/apps/rerank.py), the server
(gr2jax/apps/serve/engine.py), the tables and Table 2's rows all answer through it, so they answer
a request identically.

`load_reranker(export)` builds one from an export and the data build and decode spec it records
(the tokenizer, catalogue, prompt and evidence thresholds of data/requests.py `Rendering`; the
export metadata written by gr2jax/train/loop.py): from the export alone when it carries its
inference bundle (bundle.py, checked; every stage export does), else, for an export written
before exports carried the bundle and only when the caller names the workdir, from its data
build, built or reused there (the only path that imports the data pipeline). `Reranker.of` builds
one from in-memory parts (a policy, params, tokenizer and P; no rendering where only a TFDS
split's encoded examples are answered).
"""

import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from gr2jax import exports, load
from gr2jax.data import answer, batches, build_settings
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle, prompt_io
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import speculative


class Answers(NamedTuple):
  """A batch's answers, one per example (the batch's padding rows dropped).

  Attributes:
    decoded: the decode (policy.Decoded: tokens, lengths, forwards, denoising steps).
    texts: the responses as text (special tokens kept).
    results: the parsed answers (answer.AnswerResult; D's order where not valid).
    seconds: wall time of the decode call alone (steering, texts and parsing excluded).
  """

  decoded: policy_lib.Decoded
  texts: list[str]
  results: list[answer.AnswerResult]
  seconds: float


@dataclasses.dataclass(frozen=True)
class Prepared:
  """A request read, rendered and encoded (Reranker.prepare), ready for Reranker.rows.

  Attributes:
    request: the read request (requests.Request).
    encoded: its tokenized prompt and candidate labels (batches.EncodedExample).
    labels: [N] the candidates' answer labels (what the parser reads).
    prompt_len: the static prompt width it is answered at: the reranker's P, or its prompt
      rounded up to data/lengths.LENGTH_MULTIPLE where longer (a server sets its compiled
      width).
    history_dropped: oldest history items cut, as the data build cuts to its max_history.
  """

  request: requests_lib.Request
  encoded: batches.EncodedExample
  labels: tuple
  prompt_len: int
  history_dropped: int


class Ranked(NamedTuple):
  """Prepared requests answered as one batch (Reranker.rows).

  Attributes:
    rows: each request's answer row (requests.answer_row), in order.
    answers: the batch's Answers (the decode's per-row forwards and lengths, the texts).
  """

  rows: list[dict]
  answers: Answers


def read_answers(tokenizer, tokens: np.ndarray, lengths: np.ndarray,
                 labels: Sequence[tuple[str, ...]]) -> tuple[list[str], list]:
  """The one reading of decoded responses on the inference side: (texts, AnswerResults).

  Reranker.answer reads its decodes with it; the benchmarks that decode with a decoder's own
  traced loop (its commit steps, its draft statistics) read theirs with it too.

  Args:
    tokenizer: the data build's tokenizer.
    tokens: [E, N] int32 responses.
    lengths: [E] int32 tokens per response.
    labels: [E] the candidates' answer labels of each example, in D's order.
  """
  texts = prompt_io.response_texts(tokenizer, tokens, lengths)
  return texts, [answer.parse_answer(t, labels_i)
                 for t, labels_i in zip(texts, labels, strict=True)]


@dataclasses.dataclass(frozen=True)
class Reranker:
  """THE inference object: everything answering an encoded example or a request needs.

  Built from an export (load_reranker: the offline tool, the server) or from in-memory parts
  (Reranker.of: evaluation during training, the tables, Table 2's rows, the benchmarks);
  `answer` decodes and reads one batch, and every decode-and-answer path goes through it
  (evaluation.evaluate; `prepare` and `rows`: the offline tool, the server's engine).

  Attributes:
    params: the model's params in the decoders' layout (policy.decoding_params; {"drafter",
      "verifier"} in the lossless mode).
    policy: the model's policy (its config, the decode spec, the response cap R).
    tokenizer: the data build's tokenizer.
    rendering: how the data build renders a request (data/requests.py); None for a Reranker
      that answers encoded examples only (a TFDS split: evaluation, the tables), which cannot
      read requests (prepare).
    prompt_len: P, the data build's static prompt width (a longer request prompt is rounded up
      to data/lengths.LENGTH_MULTIPLE instead).
    tokenizer_lock: held while the tokenizer is read (a server encodes on its event loop while
      its worker decodes); dataclasses.replace keeps it, so the Rerankers of one server's
      decoders (serve/auto.py) share it with their tokenizer.
  """

  params: dict
  policy: policy_lib.Policy
  tokenizer: object
  rendering: requests_lib.Rendering | None
  prompt_len: int
  tokenizer_lock: contextlib.AbstractContextManager = dataclasses.field(
    default_factory=threading.Lock, compare=False, repr=False)

  @classmethod
  def of(cls, policy: policy_lib.Policy, params: dict, tokenizer, prompt_len: int,
         rendering: requests_lib.Rendering | None = None) -> "Reranker":
    """A Reranker from in-memory parts: `params` in the export's layout (turned into the
    decoders' once, policy.decoding_params); rendering as the attribute's."""
    return cls(policy.decoding_params(params), policy, tokenizer, rendering, prompt_len)

  def prepare(self, request, line: int = 1) -> Prepared:
    """Reads one request (requests.parse_request: a JSONL line or a request dict), renders it
    as the data build renders its examples and encodes it (batches.encode_examples: its prompt
    and its candidates' label tokens, what the answer constraint reads).

    Args:
      request: a JSONL line or a request dict.
      line: its 1-based line number in the input (the answer row's "line").

    Raises:
      requests.RequestError: naming the field at fault (ERROR_KINDS).
      ValueError: a Reranker without a rendering (it answers encoded examples only).
    """
    r = self.rendering
    if r is None:
      raise ValueError("this Reranker has no request rendering (built from in-memory parts "
                       "without one): it answers encoded examples only; load_reranker reads "
                       "requests")
    request = requests_lib.parse_request(request, line, r.catalogue, r.num_candidates,
                                         r.needs_sids)
    [rendered] = requests_lib.render([request], r)
    with self.tokenizer_lock:
      [encoded] = batches.encode_examples([rendered], [0], self.tokenizer)
    return Prepared(request, encoded, rendered.labels,
                    max(self.prompt_len, lengths_lib.round_up(len(encoded.prompt))),
                    max(len(request.history) - r.max_history, 0))

  def rows(self, prepared: Sequence[Prepared], *, batch_rows: int,
           prompt_len: int = 0) -> Ranked:
    """Answers prepared requests as one [batch_rows, prompt_len] batch (answer: rows past the
    list repeat its last prompt and are dropped) and writes their answer rows
    (requests.answer_row; an invalid answer falls back to D's order).

    Args:
      prepared: 1..batch_rows Prepared requests.
      batch_rows: the batch's static row count.
      prompt_len: the static prompt width (0 = the widest of the requests' own prompt_len).
    """
    got = self.answer([p.encoded for p in prepared], [p.labels for p in prepared],
                      rows=batch_rows,
                      prompt_len=prompt_len or max(p.prompt_len for p in prepared))
    return Ranked([requests_lib.answer_row(p.request, text, result)
                   for p, text, result in zip(prepared, got.texts, got.results, strict=True)],
                  got)

  def answer(self, encoded: Sequence[batches.EncodedExample],
             labels: Sequence[tuple[str, ...]], *, rows: int, prompt_len: int = 0,
             given_reasoning: bool = False) -> Answers:
    """Decodes encoded examples as one [rows, prompt_len] batch and reads their answers.

    Rows past the list repeat its last prompt (prompt_io.prompt_arrays) and are dropped from the
    answers; the batch is steered by the answer constraint of each example's candidates when the
    decode spec is constrained, and by each example's own reasoning when given_reasoning
    (prompt_io.steering); the responses are read by read_answers.

    Args:
      encoded: 1..rows batches.EncodedExample (their prompts and candidate label tokens).
      labels: each example's candidate answer labels, in D's order (what the parser reads).
      rows: the batch's static row count.
      prompt_len: the static prompt width (0 = self.prompt_len).
      given_reasoning: decode only the answer after each example's own reasoning tokens
        (teacher forcing; block diffusion only; the examples must carry reasoning).
    """
    policy, n, lock = self.policy, len(encoded), self.tokenizer_lock
    tokens, lengths = prompt_io.prompt_arrays(encoded, rows, prompt_len or self.prompt_len,
                                              policy.config.pad_token_id)
    with lock:
      steering = prompt_io.steering(policy, self.tokenizer, encoded, rows, given_reasoning)
    start = time.perf_counter()
    out = policy.decode(self.params, tokens, lengths, steering=steering)
    seconds = time.perf_counter() - start
    decoded = policy_lib.Decoded(*(x[:n] for x in out))
    with lock:
      texts, results = read_answers(self.tokenizer, decoded.tokens, decoded.lengths, labels)
    return Answers(decoded, texts, results, seconds)


def _recorded(export: str, field: str, given):
  """`given`, else what the export's metadata records under `field` (loop.export_metadata)."""
  if given is not None:
    return given
  value = exports.load_metadata(export).get(field) if os.path.isdir(export) else None
  if value is None:
    raise ValueError(f"{export}: records no {field} (an export written before exports recorded "
                     f"their recipe, or not a stage's export): pass {field}= (gr2jax.recipe."
                     "data_config(recipe) / recipe.decode of the recipe it was trained with)")
  return value


def load_reranker(export: str, *, workdir: str | None = None, data_config=None,
                  decode: DecodeSpec | None = None, items: str = "",
                  max_new_tokens: int = 0, verify_with: str = "") -> Reranker:
  """The Reranker of an export and the data build it was trained on.

  Args:
    export: a stage's export (W/<stage>/export), or any gr2jax / HF model directory with
      data_config, decode and workdir given.
    workdir: for an export that never had an inference bundle (no inference/, bundle.py): the
      workdir of its data build (built there if missing, cached otherwise); without it such an
      export is refused. An export with a bundle reads no workdir.
    data_config: the data build's config (its prompt); default the one the export records.
    decode: the decode spec; default the one the export records.
    items: a user-supplied items.jsonl ('' = the build's catalogue).
    max_new_tokens: response cap; 0 = the build's R (data/lengths.py, as the training runs).
    verify_with: an AR export of the same data build (e.g. W/ar_rl/export): the lossless mode,
      `export` (a block-diffusion model) drafts and this model verifies, so the answers are its
      own greedy answers (policy.LosslessPolicy).

  Raises:
    ValueError: the export records no data build / decode spec and none is given; its
      inference bundle is incomplete, damaged or not the export's (bundle.read); it never had
      one and no workdir is given; the data build is not the export's
      (exports.check_data_build); with verify_with, a pair the lossless mode cannot decode,
      named (another data build: exports.check_same_build; a drafter without a mask token,
      a verifier that is not AR, decode.draft_k over the drafter's block size:
      speculative.check_pair); decode.constrained with a model that is not block diffusion.
  """
  export = os.fspath(export)
  load.check_model_dir(export, "export")  # before a data build for a misspelt path
  if verify_with:
    load.check_model_dir(verify_with, "verify_with")
  data_config = build_settings.data_settings(_recorded(export, "data_config", data_config))
  decode = _recorded(export, "decode", decode)
  if not isinstance(decode, DecodeSpec):
    decode = DecodeSpec.from_record(decode)
  inference = (bundle.read(export, data_config, items)
               or _from_data_build(export, data_config, workdir, items))
  model_config, params = load.load_model(export)
  exports.check_data_build(export, inference.data_build)
  verifier_config = None
  if verify_with:
    exports.check_same_build(export, verify_with)
    verifier_config, verifier_params = load.load_model(verify_with)
    speculative.check_pair(f"the lossless mode (drafter {export}, verifier verify_with="
                           f"{verify_with}, decode.draft_k={decode.draft_k})", model_config,
                           verifier_config, decode.draft_k)
    params = {"drafter": params, "verifier": verifier_params}
  policy = policy_lib.make_policy(model_config, decode,
                                  max_new_tokens or inference.response_len,
                                  verifier_config=verifier_config)
  if decode.constrained and policy.kind != "diffusion":
    raise ValueError("decode.constrained=True constrains a block-diffusion decoder's answers; "
                     + ("the lossless mode answers as its AR verifier" if verify_with else
                        f"{export} is an AR model") + ": pass decode.constrained=False")
  return Reranker.of(policy, params, inference.tokenizer, inference.prompt_len,
                     inference.rendering)


def _from_data_build(export: str, data_config, workdir: str | None,
                     items: str) -> bundle.Inference:
  """What an export that never had an inference bundle reads, from its data build (pipeline.run
  in `workdir`, named by the caller: nothing is built or written otherwise).

  Raises:
    ValueError: no workdir is given (names the command that adds the export a bundle).
  """
  if workdir is None:
    raise ValueError(f"{export}: the export has no inference bundle ({bundle.DIRECTORY}/, "
                     f"written by training stages since exports carried one): add it with "
                     f"`{bundle.rebundle_command(export)}`, or pass workdir= of its data build")
  # The data build's modules (pipeline, RQ-VAE, TFDS) load only on this path: a bundled export
  # is served without them.
  from gr2jax.data import build_rendering, pipeline

  summary = pipeline.run(data_config, workdir)
  tokenizer = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  rendering = build_rendering.load_rendering(summary, data_config, items)
  _, sids = build_rendering.build_sids(summary)
  return bundle.Inference(tokenizer, rendering, *lengths_lib.static_lengths(summary),
                          exports.data_build_record(tokenizer, rendering.prompt, sids))
