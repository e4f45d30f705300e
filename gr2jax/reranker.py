"""A trained re-ranker: the model, the data build it was trained on, and decoding requests.

`load_reranker(export, workdir)` loads an export and the data build it records (tokenizer,
catalogue, prompt, evidence thresholds: data/requests.py `Rendering`); `rerank_lines` answers
JSONL lines or request dicts in input order, each an answer row or a named error row
(data/requests.py). The offline tool (gr2jax/apps/rerank.py) and the server (gr2jax/apps/serve/)
are both this object behind another front.
"""

import dataclasses
from collections.abc import Iterable

from gr2jax.data import batches
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.progress import progress


@dataclasses.dataclass(frozen=True)
class Reranker:
  """Everything decoding a request needs: the model and the data build it was trained on.

  Attributes:
    params, model_config: the model (AR, or diffusion when model_config.mask_token_id is set).
    tokenizer: the data build's tokenizer.
    rendering: how the data build renders a request (data/requests.py).
    max_new_tokens: response cap.
  """

  params: dict
  model_config: object
  tokenizer: object
  rendering: requests_lib.Rendering
  max_new_tokens: int


def load_reranker(ckpt: str, data_config, workdir: str, *, items: str = "",
                  max_new_tokens: int = 0) -> Reranker:
  """The Reranker of a checkpoint and the data build (in `workdir`) it was trained on.

  Args:
    ckpt: the model export (gr2jax checkpoint or HF directory).
    data_config: the data build's config (`config.data`; the one the model was trained with).
    workdir: the workdir of that data build (built here if missing; cached otherwise).
    items: a user-supplied items.jsonl ('' = the build's catalogue).
    max_new_tokens: response cap; 0 = the build's R (data/lengths.py, as the training runs).
  """
  from gr2jax import exports, load
  from gr2jax.data import pipeline
  from gr2jax.data import tokenizer as tokenizer_lib

  summary = pipeline.run(data_config, workdir)
  model_config, params = load.load_model(ckpt)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  rendering = requests_lib.load_rendering(summary, data_config, items)
  exports.check_data_build(ckpt, exports.data_build_record(tok, rendering.prompt))
  if not max_new_tokens:
    max_new_tokens = lengths_lib.static_lengths(summary)[1]
  return Reranker(params, model_config, tok, rendering, max_new_tokens)


def decode_requests(requests: list[requests_lib.Request], reranker: Reranker, *, batch_size: int,
                    tau: float = 1.0, max_steps_per_block: int = 64,
                    desc: str = "rerank") -> list[dict]:
  """Renders, decodes (batched, one static prompt width) and answers readable requests."""
  from gr2jax.train import evaluation, inputs

  if not requests:
    return []
  rendered = requests_lib.render(requests, reranker.rendering)
  encoded = batches.encode_examples(rendered, [0] * len(rendered), reranker.tokenizer)
  prompt_len = lengths_lib.round_up(max(len(e.prompt) for e in encoded))
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
      rows.append(requests_lib.answer_row(requests[first + i], text, rendered[first + i].labels))
    bar.update(len(chunk))
  bar.close()
  return rows


def rerank_lines(lines: Iterable, reranker: Reranker, *, batch_size: int = 64, tau: float = 1.0,
                 max_steps_per_block: int = 64) -> list[dict]:
  """Every request line answered or an error row, in input order (module docstring)."""
  rendering = reranker.rendering
  parsed = requests_lib.read_requests(lines, rendering.catalogue, rendering.num_candidates,
                                      rendering.needs_sids)
  good = [r for r in parsed if isinstance(r, requests_lib.Request)]
  answered = iter(decode_requests(good, reranker, batch_size=batch_size, tau=tau,
                                  max_steps_per_block=max_steps_per_block))
  return [next(answered) if isinstance(r, requests_lib.Request) else r for r in parsed]
