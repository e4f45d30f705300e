"""THE inference object: a trained re-ranker answering encoded examples and requests.

A `Reranker` (like gemma's `Sampler`) holds the model's params in the decoders' layout, its
policy (policy.py: AR, block diffusion at the spec's eval tau, or the lossless draft-and-verify
pair), the data build's tokenizer and request rendering, and the prompt width P, and answers a
batch of encoded examples in one call, `Reranker.answer`: prompt arrays of one static shape
[rows, P], steering (the answer constraint of the examples' candidates when the spec is
constrained; a given reasoning), policy.decode, then `read_answers` (texts, then
data/answer.parse_answer). The evaluation (evaluation.py), the offline tool (rerank_lines,
gr2jax/apps/rerank.py), the server (gr2jax/apps/serve/engine.py), the tables and Table 2's rows
all answer through it, so they answer a request identically.

`load_reranker(export)` builds one from an export and the data build and decode spec it records
(the tokenizer, catalogue, prompt and evidence thresholds of data/requests.py `Rendering`; the
export metadata written by gr2jax/train/loop.py): from the export alone when it carries its
inference bundle (bundle.py, checked; every stage export does), else, for an export written
before exports carried the bundle and only when the caller names the workdir, from its data
build, built or reused there (the only path that imports the data pipeline). `Reranker.of` builds
one from in-memory parts (a policy, params, tokenizer and P; no rendering where only a TFDS
split's encoded examples are answered). `rerank_lines` answers JSONL lines or request dicts in
input order, each an answer row or a named error row (data/requests.py).
"""

import contextlib
import dataclasses
import os
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

import ml_collections
import numpy as np

from gr2jax import exports, load
from gr2jax.data import answer, batches
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import bundle, prompt_io
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import speculative
from gr2jax.progress import progress


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
  (evaluation.evaluate, decode_requests / rerank_lines, the server's engine).

  Attributes:
    params: the model's params in the decoders' layout (policy.decoding_params; {"drafter",
      "verifier"} in the lossless mode).
    policy: the model's policy (its config, the decode spec, the response cap R).
    tokenizer: the data build's tokenizer.
    rendering: how the data build renders a request (data/requests.py); None for a Reranker
      that answers encoded examples only (a TFDS split: evaluation, the tables), which cannot
      read requests (rerank_lines).
    prompt_len: P, the data build's static prompt width (a longer request prompt is rounded up
      to data/lengths.LENGTH_MULTIPLE instead).
  """

  params: dict
  policy: policy_lib.Policy
  tokenizer: object
  rendering: requests_lib.Rendering | None
  prompt_len: int

  @classmethod
  def of(cls, policy: policy_lib.Policy, params: dict, tokenizer, prompt_len: int,
         rendering: requests_lib.Rendering | None = None) -> "Reranker":
    """A Reranker from in-memory parts: `params` in the export's layout (turned into the
    decoders' once, policy.decoding_params); rendering as the attribute's."""
    return cls(policy.decoding_params(params), policy, tokenizer, rendering, prompt_len)

  def answer(self, encoded: Sequence[batches.EncodedExample],
             labels: Sequence[tuple[str, ...]], *, rows: int, prompt_len: int = 0,
             given_reasoning: bool = False, tokenizer_lock=None) -> Answers:
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
      tokenizer_lock: held while the tokenizer is read (the server encodes on another thread);
        None: no lock.
    """
    policy, n = self.policy, len(encoded)
    lock = tokenizer_lock or contextlib.nullcontext()
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
      named (another data build: speculative.check_same_build; a drafter without a mask token,
      a verifier that is not AR, decode.draft_k over the drafter's block size:
      speculative.check_pair); decode.constrained with a model that is not block diffusion.
  """
  export = os.fspath(export)
  load.check_model_dir(export, "export")  # before a data build for a misspelt path
  if verify_with:
    load.check_model_dir(verify_with, "verify_with")
  data_config = _recorded(export, "data_config", data_config)
  if not isinstance(data_config, ml_collections.ConfigDict):
    data_config = ml_collections.ConfigDict(data_config)
  decode = _recorded(export, "decode", decode)
  if not isinstance(decode, DecodeSpec):
    decode = DecodeSpec(**decode)
  inference = (bundle.read(export, data_config, items)
               or _from_data_build(export, data_config, workdir, items))
  model_config, params = load.load_model(export)
  exports.check_data_build(export, inference.data_build)
  verifier_config = None
  if verify_with:
    speculative.check_same_build(export, verify_with)
    verifier_config, verifier_params = load.load_model(verify_with)
    speculative.check_pair(f"the lossless mode (drafter {export}, verifier verify_with="
                           f"{verify_with}, decode.draft_k={decode.draft_k})", model_config,
                           verifier_config, decode.draft_k)
    params = {"drafter": params, "verifier": verifier_params}
  policy = policy_lib.make_policy(model_config, decode,
                                  max_new_tokens or inference.response_len,
                                  verifier_config=verifier_config)
  if decode.constrained and not isinstance(policy, policy_lib.DiffusionPolicy):
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


def decode_requests(requests: list[requests_lib.Request], reranker: Reranker, *, batch_size: int,
                    desc: str = "rerank") -> list[dict]:
  """Renders, answers (Reranker.answer: batches of min(batch_size, len(requests)) rows, the last
  padded; one static prompt width) and writes the rows of readable requests."""
  if not requests:
    return []
  rendered = requests_lib.render(requests, reranker.rendering)
  encoded = batches.encode_examples(rendered, [0] * len(rendered), reranker.tokenizer)
  prompt_len = max(reranker.prompt_len,
                   lengths_lib.round_up(max(len(e.prompt) for e in encoded)))
  rows_per_batch = min(batch_size, len(encoded))
  rows = []
  bar = progress(len(requests), desc=desc, unit="request")
  for first in range(0, len(requests), batch_size):
    chunk = slice(first, first + batch_size)
    got = reranker.answer(encoded[chunk], [r.labels for r in rendered[chunk]],
                          rows=rows_per_batch, prompt_len=prompt_len)
    rows += [requests_lib.answer_row(request, text, result)
             for request, text, result in zip(requests[chunk], got.texts, got.results,
                                              strict=True)]
    bar.update(len(got.texts))
  bar.close()
  return rows


def rerank_lines(lines: Iterable, reranker: Reranker, *, batch_size: int = 64) -> list[dict]:
  """Every request line answered or an error row, in input order (data/requests.py formats)."""
  rendering = reranker.rendering
  parsed = requests_lib.read_requests(lines, rendering.catalogue, rendering.num_candidates,
                                      rendering.needs_sids)
  good = [r for r in parsed if isinstance(r, requests_lib.Request)]
  answered = iter(decode_requests(good, reranker, batch_size=batch_size))
  return [next(answered) if isinstance(r, requests_lib.Request) else r for r in parsed]
