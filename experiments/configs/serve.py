"""Re-ranking as a service (gr2jax/serve/server.py): an HTTP server over a trained re-ranker.

  python experiments/run.py --config=serve.py --workdir=W --config.serve.ckpt=W/rl/export \
      --config.serve.port=8000

The data build (prompt, tokenizer, evidence thresholds, SIDs) and the decode spec are the
recipe's, as for the offline tool (rerank.py): pass the variant and overrides of the model's
training run (its data build is reused from W's cache). Every (batch bucket x prompt length)
program is compiled before /healthz reports ready, with JAX's persistent compilation cache in W.
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def serve_block() -> ml_collections.ConfigDict:
  """The `serve` block: every field of the server, with its default."""
  s = ml_collections.ConfigDict()
  s.ckpt = os.path.join("{workdir}", "rl", "export")  # the model export (AR or diffusion)
  s.host = "127.0.0.1"  # address to listen on (loopback; a replica behind a balancer: 0.0.0.0)
  s.port = 8000  # TCP port (0 = a free port, printed at start)
  s.batch_buckets = (1, 2, 4, 8, 16, 32, 64)  # compiled batch sizes; a batch decodes in the
  #                                             smallest that holds it, padded with repeated rows
  s.prompt_lengths = ()  # compiled prompt widths (() = the data build's P, recipe.lengths)
  s.window_ms = 5.0  # how long the oldest queued request waits for others to share its batch
  s.queue_bound = 256  # admitted requests not yet answered; beyond it: 503 + Retry-After
  s.timeout_s = 30.0  # a request not answered this long after admission gets a 504
  s.retry_after_s = 1  # the Retry-After of a 503 (seconds)
  s.max_body_bytes = 1 << 20  # larger request bodies get a 413
  s.drain_timeout_s = 60.0  # SIGTERM: the longest wait for admitted requests before exiting
  s.keep_alive_s = 75.0  # idle keep-alive connections are closed after this (above a load
  #                        balancer's idle timeout, often 60 s, so it never reuses a closing one)
  s.items_file = ""  # a user-supplied items.jsonl ('' = the data build's catalogue)
  s.max_new_tokens = 0  # response cap (0 = the build's response length R)
  s.model_name = ""  # the answers' "model" ('' = <stage>-step<step> from the export's metadata)
  s.compilation_cache = os.path.join("{workdir}", "serve", "jax_cache")  # JAX's persistent
  #                                                       compilation cache ('' = off)
  return s


def get_config(variant: str = ""):
  c = get_recipe("serve", variant)
  c.serve = serve_block()
  return c
