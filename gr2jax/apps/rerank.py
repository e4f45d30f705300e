"""Re-ranking as a tool: JSONL requests in, the trained model's rankings and reasoning out.

  python experiments/run.py --config=rerank.py --workdir=W --config.rerank.ckpt=W/rl/export \
      --config.rerank.requests=req.jsonl --config.rerank.out=out.jsonl

  rows = gr2jax.rerank("req.jsonl", "W/rl/export")                    # the same in Python

Request and row formats: gr2jax/data/requests.py. `rerank_lines` is a loop over the model's
Reranker (gr2jax/decoding/reranker.py): Reranker.prepare reads, renders and encodes each request,
Reranker.rows answers them in batches (the server's engine makes the same two calls); a bad request
is an error row and never stops the batch. Output rows keep the input order, one per non-blank
line.
"""

import json
import os
import sys
import types
from collections.abc import Iterable

from gr2jax import files, load
from gr2jax import workdir as workdir_lib
from gr2jax.data import requests as requests_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.progress import progress
from gr2jax.tool_settings import RerankSettings


def _lines_of(requests) -> Iterable:
  if isinstance(requests, str | os.PathLike):
    with open(requests, encoding="utf-8", errors="replace") as f:
      return f.read().splitlines()
  return requests


def rerank(requests, model, *, batch_size: int = 64, **load) -> list[dict]:
  """Re-ranks requests with a trained model (gr2jax/data/requests.py for the formats).

    rows = gr2jax.rerank("requests.jsonl", "W/rl/export")
    rows = gr2jax.rerank("requests.jsonl", "W/rl/export", verify_with="W/ar_rl/export")

  Args:
    requests: a JSONL path, or an iterable of JSONL lines / request dicts.
    model: a reranker.Reranker, or an export path (a stage's export records its data build and
      decode spec; reranker.load_reranker).
    batch_size: decode batch size.
    **load: for an export path, reranker.load_reranker's keyword arguments: workdir (of an
      export without an inference bundle), data_config, decode (default: the export's record),
      items (a user-supplied items.jsonl), max_new_tokens (0 = the build's R), verify_with (an
      AR export verifying `model`'s drafts: the lossless mode, whose answers are that AR model's
      own).

  Returns:
    One row per non-blank request line, in order: an answer or a named error.

  Raises:
    TypeError: `requests` is a single request dict, or not a path or an iterable; loading
      arguments given with a Reranker (it is loaded already).
  """
  if isinstance(requests, dict) or not isinstance(requests, str | os.PathLike | Iterable):
    raise TypeError(f"rerank: requests must be a JSONL path or an iterable of JSONL lines / "
                    f"request dicts, got {type(requests).__name__} (wrap one request in a list)")
  if isinstance(model, reranker_lib.Reranker):
    if load:
      raise TypeError(f"rerank: {', '.join(sorted(load))} load an export; the model given is a "
                      "Reranker already (pass these to reranker.load_reranker)")
  else:
    model = reranker_lib.load_reranker(os.fspath(model), **load)
  return rerank_lines(_lines_of(requests), model, batch_size=batch_size)


def rerank_lines(lines: Iterable, reranker: reranker_lib.Reranker, *,
                 batch_size: int = 64) -> list[dict]:
  """Every request line answered or an error row, in input order (data/requests.py formats).

  Each line is prepared (Reranker.prepare; requests.read_lines: an error row where it is
  unreadable), and the readable ones answered (Reranker.rows) in batches of min(batch_size,
  their count) rows, the last padded, at one static prompt width: the build's P, or the longest
  prompt rounded up.

  Raises:
    ValueError: a Reranker without a request rendering (Reranker.prepare).
  """
  read = requests_lib.read_lines(lines, reranker.prepare)
  answered = iter(_rows([p for p in read if isinstance(p, reranker_lib.Prepared)], reranker,
                        batch_size))
  return [next(answered) if isinstance(p, reranker_lib.Prepared) else p for p in read]


def _rows(prepared: list, reranker: reranker_lib.Reranker, batch_size: int) -> list[dict]:
  """The answer rows of prepared requests, in batches (rerank_lines)."""
  if not prepared:
    return []
  prompt_len = max(p.prompt_len for p in prepared)
  batch_rows = min(batch_size, len(prepared))
  rows = []
  bar = progress(len(prepared), desc="rerank", unit="request")
  for first in range(0, len(prepared), batch_size):
    got = reranker.rows(prepared[first:first + batch_size], batch_rows=batch_rows,
                        prompt_len=prompt_len)
    rows += got.rows
    bar.update(len(got.rows))
  bar.close()
  return rows


def summarize(rows: list[dict]) -> dict:
  """Counts of answered / fallback / error rows and errors per kind."""
  errors = [r["error"]["kind"] for r in rows if "error" in r]
  answered = [r for r in rows if "error" not in r]
  return {"requests": len(rows), "answered": len(answered),
          "fallback": sum(r["fallback"] for r in answered), "errors": len(errors),
          "error_kinds": {k: errors.count(k) for k in requests_lib.ERROR_KINDS if k in errors}}


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
  """Writes the rows as JSONL to `path` atomically (files.atomic_write)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  files.atomic_write(path, "".join(json.dumps(row, default=str) + "\n" for row in rows))


def run(recipe, c, workdir: str) -> dict:
  """`--config=rerank.py`: reads c.requests, writes c.out, with the recipe's data build and
  decode spec (gr2jax/recipe.py).

  Args:
    recipe: the gr2jax.recipe.Recipe the model was trained with.
    c: the `rerank` block: a tool_settings.RerankSettings, or the command line's ConfigDict
      block (read with RerankSettings.of: every field checked, before anything loads);
      '{workdir}' in its paths filled in: workdir.fill_path.
    workdir: the workdir of the recipe's data build.
  """
  from gr2jax import recipe as recipe_lib

  c = c if isinstance(c, RerankSettings) else RerankSettings.of(c, "rerank.")
  if not c.requests:
    raise ValueError("rerank.py needs --config.rerank.requests=<JSONL of requests>")
  out = c.out or os.path.splitext(c.requests)[0] + ".ranked.jsonl"
  check_out_path(out, c.requests)
  ckpt, verify_with = (workdir_lib.fill_path(p, workdir) for p in (c.ckpt, c.verify_with))
  load.check_model_dir(ckpt, "rerank.ckpt")  # a misspelt export, before any data build
  if verify_with:
    load.check_model_dir(verify_with, "rerank.verify_with")
  reranker = reranker_lib.load_reranker(
    ckpt, workdir=workdir, data_config=recipe_lib.data_config(recipe), decode=recipe.decode,
    items=c.items_file, max_new_tokens=c.max_new_tokens, verify_with=verify_with)
  rows = rerank_lines(_lines_of(c.requests), reranker, batch_size=c.batch_size)
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
