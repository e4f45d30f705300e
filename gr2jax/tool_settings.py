"""The blocks of the checkpoint tools run on a recipe: `evaluate` (`--config=eval.py`, one
checkpoint evaluated: experiments/run.py) and `rerank` (`--config=rerank.py`, the offline
re-ranking tool: gr2jax/apps/rerank.py) and `serve` (`--config=serve.py`, the server:
gr2jax/apps/serve/, whose spec.ServeSpec adds the decoder choice).

Declared with the one settings schema (gr2jax/settings.py); this module imports nothing else of
gr2jax, so the named recipes (gr2jax/recipes.py) build their blocks from it without reaching an
application.
"""

import dataclasses
import os

from gr2jax import settings


@dataclasses.dataclass(frozen=True, kw_only=True)
class EvaluateSettings(settings.Settings):
  """`--config=eval.py`'s block: which checkpoint to evaluate, and where its results go."""

  WHERE = "evaluate."

  ckpt: str = settings.text("", doc="the checkpoint to evaluate (a gr2jax export or an HF "
                            "directory; eval.py refuses '')")
  out_dir: str = settings.text("", doc="where results go ('' = next to the checkpoint)")
  convert: bool = settings.flag(False, doc="convert an AR checkpoint to block diffusion (B = "
                                "decode.block_size)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RerankSettings(settings.Settings):
  """`--config=rerank.py`'s block: the offline re-ranking tool ('{workdir}' in its paths is
  filled in by the tool)."""

  WHERE = "rerank."

  ckpt: str = settings.text(os.path.join("{workdir}", "rl", "export"),
                            doc="the model export (AR or diffusion)", nonempty="an export path")
  requests: str = settings.text("", doc="JSONL of requests (rerank.py refuses '')")
  out: str = settings.text("", doc="output JSONL ('' = <requests>.ranked.jsonl)")
  items_file: str = settings.text("", doc="a user-supplied items.jsonl ('' = the data build's "
                                  "catalogue)")
  batch_size: int = settings.integer(64, doc="decode batch size (one compiled shape)", minimum=1)
  max_new_tokens: int = settings.integer(0, doc="response cap (0 = the build's response length "
                                         "R)", minimum=0)
  verify_with: str = settings.text("", doc="an AR export verifying ckpt's drafts, e.g. "
                                   "'{workdir}/ar_rl/export': the lossless mode ('' = ckpt's "
                                   "own decoder)")


SERVE_MODES = ("fixed", "auto")  # serve.mode: apps/serve/auto.py CHOICES' keys


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServeSettings(settings.Settings):
  """`--config=serve.py`'s block: the re-ranking server (gr2jax/apps/serve/; its typed spec,
  apps/serve/spec.ServeSpec, adds the decoder choice these fields make)."""

  WHERE = "serve."

  ckpt: str = settings.text(os.path.join("{workdir}", "rl", "export"),
                            doc="the model export (AR or diffusion)", nonempty="an export path")
  host: str = settings.text("127.0.0.1", doc="address to listen on (loopback; a replica behind a "
                            "balancer: 0.0.0.0)", nonempty="a host name or address")
  port: int = settings.integer(8000, doc="TCP port (0 = a free port, printed at start)",
                               minimum=0, maximum=65535)
  batch_buckets: tuple[int, ...] = settings.ints(
    (1, 2, 4, 8, 16, 32, 64), doc="compiled batch sizes; a batch decodes in the smallest that "
    "holds it, padded with repeated rows", minimum=1, ascending=True)
  prompt_lengths: tuple[int, ...] = settings.ints(
    (), doc="compiled prompt widths (() = the data build's P, data/lengths.py)", minimum=1)
  window_ms: float = settings.real(5.0, doc="how long the oldest queued request waits for "
                                   "others to share its batch", low=0)
  queue_bound: int = settings.integer(256, doc="admitted requests not yet answered; beyond it: "
                                      "503 + Retry-After", minimum=1)
  timeout_s: float = settings.real(30.0, doc="a request not answered this long after admission "
                                   "gets a 504", low=0, low_open=True)
  retry_after_s: int = settings.integer(1, doc="the Retry-After of a 503 (seconds)", minimum=1)
  max_body_bytes: int = settings.integer(1 << 20, doc="larger request bodies get a 413",
                                         minimum=1)
  drain_timeout_s: float = settings.real(60.0, doc="SIGTERM: the longest wait for admitted "
                                         "requests before exiting", low=0, low_open=True)
  keep_alive_s: float = settings.real(75.0, doc="idle keep-alive connections are closed after "
                                      "this (above a load balancer's idle timeout, often 60 s)",
                                      low=0, low_open=True)
  items_file: str = settings.text("", doc="a user-supplied items.jsonl ('' = the data build's "
                                  "catalogue)")
  max_new_tokens: int = settings.integer(0, doc="response cap (0 = the build's response length "
                                         "R)", minimum=0)
  verify_with: str = settings.text("", doc="an AR export verifying ckpt's drafts (the lossless "
                                   "mode; '' = off)")
  mode: str = settings.choice(
    "fixed", doc="'fixed': ckpt's own decoder (with verify_with: draft-and-verify at "
    "decode.draft_k); 'auto' (needs verify_with): per batch bucket the fastest exact decoder "
    "(apps/serve/auto.py)", choices=SERVE_MODES)
  draft_ks: tuple[int, ...] = settings.ints(
    (4, 8, 16), doc="'auto': the K's of draft-and-verify it chooses among", minimum=1,
    ascending=True)
  cost_table: str = settings.text("", doc="'auto': a JSON file {bucket: {decoder: seconds per "
                                  "batch}} to choose from ('' = timed at warm-up)")
  model_name: str = settings.text("", doc="the answers' \"model\" ('' = <stage>-step<step> from "
                                  "the export's metadata)")
  compilation_cache: str = settings.text(os.path.join("{workdir}", "serve", "jax_cache"),
                                         doc="JAX's persistent compilation cache ('' = off)")
