"""The server's Prometheus metrics (prometheus_client), in a registry of their own.

  gr2jax_serve_requests_total{endpoint, outcome}  HTTP requests by outcome: ok, bad_request,
                                                  overloaded, not_ready, timeout, error
  gr2jax_serve_answers_total{result}              answered requests: valid | fallback
  gr2jax_serve_valid_rate, _fallback_rate         their fractions so far
  gr2jax_serve_queue_seconds                      admission -> its batch's decode starts
  gr2jax_serve_decode_seconds                     one batch's decode (per batch)
  gr2jax_serve_request_seconds{endpoint}          end to end in the server, answered requests
  gr2jax_serve_batch_size                         requests per decoded batch (before padding)
  gr2jax_serve_batches_total{bucket}              decoded batches per compiled batch size
  gr2jax_serve_decoder_batches_total{decoder}     decoded batches per decoder (engine.py's
                                                  names: ar, diffusion, lossless_k<K>)
  gr2jax_serve_forwards_total, _tokens_total      forward passes and response tokens answered
  gr2jax_serve_forwards_per_token                 their ratio so far (AR: ~1; diffusion: < 1)
  gr2jax_serve_queue_depth                        admitted requests not yet answered
  gr2jax_serve_compiles_after_ready_total         XLA compiles while serving (must stay 0)
"""

import threading

import prometheus_client as prom
from prometheus_client.core import CounterMetricFamily

OUTCOMES = ("ok", "bad_request", "overloaded", "not_ready", "timeout", "error")
_LATENCY = (.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60)


class Metrics:
  """Every metric of one server.

  Args:
    batch_buckets: the compiled batch sizes (the batch-size histogram's buckets).
    depth: () -> the current queue depth.
    compiles: () -> compiles since the server became ready.
    decoders: the engine's decoder names (the per-decoder counter's labels).
  """

  def __init__(self, batch_buckets: tuple[int, ...], depth, compiles,
               decoders: tuple[str, ...] = ()):
    prom.disable_created_metrics()  # no *_created series: rates come from the counters
    self.registry = prom.CollectorRegistry(auto_describe=True)
    r = self.registry
    self.requests = prom.Counter("gr2jax_serve_requests", "HTTP requests by outcome",
                                 ["endpoint", "outcome"], registry=r)
    self.answers = prom.Counter("gr2jax_serve_answers", "answered requests by validity",
                                ["result"], registry=r)
    self.queue = prom.Histogram("gr2jax_serve_queue_seconds", "admission to decode start",
                                buckets=_LATENCY, registry=r)
    self.decode = prom.Histogram("gr2jax_serve_decode_seconds", "one batch's decode",
                                 buckets=_LATENCY, registry=r)
    self.latency = prom.Histogram("gr2jax_serve_request_seconds", "answered, end to end in the "
                                  "server",
                                  ["endpoint"], buckets=_LATENCY, registry=r)
    self.batch_size = prom.Histogram("gr2jax_serve_batch_size", "requests per decoded batch",
                                     buckets=tuple(batch_buckets), registry=r)
    self.batches = prom.Counter("gr2jax_serve_batches", "decoded batches per compiled size",
                                ["bucket"], registry=r)
    self.decoder_batches = prom.Counter("gr2jax_serve_decoder_batches", "decoded batches per "
                                        "decoder", ["decoder"], registry=r)
    self.forwards = prom.Counter("gr2jax_serve_forwards", "forward passes of answered requests",
                                 registry=r)
    self.tokens = prom.Counter("gr2jax_serve_tokens", "response tokens of answered requests",
                               registry=r)
    prom.Gauge("gr2jax_serve_valid_rate", "valid answers / answers",
               registry=r).set_function(lambda: self._share("valid"))
    prom.Gauge("gr2jax_serve_fallback_rate", "fallback answers / answers",
               registry=r).set_function(lambda: self._share("fallback"))
    prom.Gauge("gr2jax_serve_forwards_per_token", "forwards / response tokens",
               registry=r).set_function(self._forwards_per_token)
    prom.Gauge("gr2jax_serve_queue_depth", "admitted requests not yet answered",
               registry=r).set_function(depth)
    r.register(_CompileCounter(compiles))
    self._lock = threading.Lock()
    self._counts = {"valid": 0, "fallback": 0, "forwards": 0, "tokens": 0}
    for endpoint in ("rerank", "rerank_batch"):
      for outcome in OUTCOMES:
        self.requests.labels(endpoint, outcome)
    for result in ("valid", "fallback"):
      self.answers.labels(result)
    for bucket in batch_buckets:
      self.batches.labels(str(bucket))
    for decoder in decoders:
      self.decoder_batches.labels(decoder)

  def _share(self, key: str) -> float:
    with self._lock:
      total = self._counts["valid"] + self._counts["fallback"]
      return self._counts[key] / total if total else 0.0

  def _forwards_per_token(self) -> float:
    with self._lock:
      return self._counts["forwards"] / self._counts["tokens"] if self._counts["tokens"] else 0.0

  def on_batch(self, requests: int, bucket: int, decode_s: float, rows: list[dict]) -> None:
    """Records one decoded batch (the batcher's hook, on the worker thread)."""
    self.batch_size.observe(requests)
    self.batches.labels(str(bucket)).inc()
    self.decoder_batches.labels(rows[0]["decoder"]).inc()  # one decoder writes a batch
    self.decode.observe(decode_s)
    valid = sum(row["valid"] for row in rows)
    forwards = sum(row["forwards"] for row in rows)
    tokens = sum(row["tokens"] for row in rows)
    with self._lock:
      self._counts["valid"] += valid
      self._counts["fallback"] += len(rows) - valid
      self._counts["forwards"] += forwards
      self._counts["tokens"] += tokens
    self.answers.labels("valid").inc(valid)
    self.answers.labels("fallback").inc(len(rows) - valid)
    self.forwards.inc(forwards)
    self.tokens.inc(tokens)

  def text(self) -> bytes:
    """The Prometheus text exposition of every metric."""
    return prom.generate_latest(self.registry)


class _CompileCounter:
  """A collector of one counter read at scrape time: compiles since the server became ready."""

  def __init__(self, compiles):
    self._compiles = compiles

  def describe(self):
    return [CounterMetricFamily("gr2jax_serve_compiles_after_ready",
                                          "XLA compiles while serving")]

  def collect(self):
    yield CounterMetricFamily("gr2jax_serve_compiles_after_ready",
                                        "XLA compiles while serving", value=self._compiles())
