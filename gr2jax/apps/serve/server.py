"""Re-ranking as a service: FastAPI on uvicorn, one decode worker, Prometheus metrics.

  python experiments/run.py --config=serve.py --workdir=W --config.serve.ckpt=W/rl/export \
      --config.serve.port=8000

  POST /v1/rerank        {"id"?, "history": [item, ...], "candidates": [N items in D's order]}
                         -> {"id", "ranking", "reasoning", "valid", "fallback", "model",
                             "history_dropped", "timings": {"queue_ms", "decode_ms"}}
  POST /v1/rerank:batch  [request, ...] -> [answer, ...] (all answered, or one error for all)
  GET  /healthz          200 {"status": "ready", ...} once every shape is compiled, else 503;
                         "mode", the decoder of each batch bucket and (serve.mode='auto',
                         auto.py) the cost table it was chosen from
  GET  /metrics          Prometheus text (gr2jax/apps/serve/metrics.py)

Items are catalogue indices or ASINs, as in the offline tool (gr2jax/apps/rerank.py), and answers
mean what its rows mean: `ranking` holds the candidates as given, best first; an invalid answer
(`valid` false) falls back to D's order (`fallback` true). A history longer than the data
build's max_history is cut oldest-first as the build cuts it, and `history_dropped` says how
many items went. The event loop validates (pydantic, then the engine's catalogue and prompt
checks), admits into the bounded queue and answers; the one decode worker (batching.py) owns
the devices. Errors never take the server down:

  400 a body that is not JSON this server reads (malformed, not UTF-8, an integer past
  Python's 4,300 digits, nesting past its recursion limit); 404 / 405 an unknown path or
  method; 413 a body over serve.max_body_bytes; 415 a Content-Type other than JSON (a body
  without one is read as JSON); 422 a field of the wrong type (a string with a lone UTF-16
  surrogate included), a missing field, an unknown item, a wrong number of candidates,
  duplicated candidates, a prompt longer than every compiled length
  503 + Retry-After: the queue is full, or the server is warming up or draining
  504: the request waited past serve.timeout_s
  Every error body is {"error": {"kind", "field", "message"}}, and every error of a rerank
  endpoint is counted in /metrics. HEAD answers wherever GET does.

SIGTERM stops accepting connections, answers every admitted request, then exits (uvicorn's
graceful shutdown, then the worker drains).
"""

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import time
from typing import Annotated

import fastapi
import pydantic
import uvicorn
from fastapi import exceptions as fastapi_exceptions
from fastapi import responses
from starlette import exceptions as starlette_exceptions

from gr2jax import load
from gr2jax import workdir as workdir_lib
from gr2jax.apps.serve import batching
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.apps.serve import metrics as metrics_lib
from gr2jax.apps.serve import spec as spec_lib


def _item_id(value):
  """An item id or request id: an int (not a bool) or a string of text (no lone UTF-16
  surrogate such as "\\ud800", which JSON can spell but no answer could carry back)."""
  if isinstance(value, bool) or not isinstance(value, int | str):
    raise ValueError(f"expected an int or a string, got {json.dumps(value)[:80]}")
  if isinstance(value, str):
    try:
      value.encode("utf-8")
    except UnicodeEncodeError:
      raise ValueError(f"{json.dumps(value)[:80]} holds a lone UTF-16 surrogate, which is not "
                       "text: send valid Unicode") from None
  return value


_ItemId = Annotated[int | str, pydantic.PlainValidator(_item_id, json_schema_input_type=int | str)]


class RerankRequest(pydantic.BaseModel):
  """One request; the engine checks the items against the catalogue."""

  id: _ItemId | None = None
  history: list[_ItemId]
  candidates: list[_ItemId]


class Timings(pydantic.BaseModel):
  queue_ms: float
  decode_ms: float


class Answer(pydantic.BaseModel):
  id: _ItemId
  ranking: list[_ItemId]
  reasoning: str
  valid: bool
  fallback: bool
  model: str
  history_dropped: int
  timings: Timings


class _Refused(Exception):
  """An HTTP error answer: status, body, headers, and the metrics outcome."""

  def __init__(self, status: int, outcome: str, kind: str, message: str, field: str = "",
               headers: dict | None = None):
    super().__init__(message)
    self.status, self.outcome, self.headers = status, outcome, headers or {}
    self.body = {"error": {"kind": kind, "field": field, "message": message}}


def _endpoint(path: str) -> str | None:
  """The metrics' endpoint label of a request path (None: not a rerank endpoint)."""
  return {"/v1/rerank": "rerank", "/v1/rerank:batch": "rerank_batch"}.get(path)


def _unreadable(exc: BaseException | None) -> str:
  """Why a body that FastAPI could not parse is not JSON this server reads."""
  if isinstance(exc, UnicodeDecodeError):
    return f"the body is not UTF-8 ({exc.reason} at byte {exc.start})"
  if isinstance(exc, RecursionError):
    return "the JSON nests deeper than the parser's recursion limit"
  if isinstance(exc, ValueError):  # e.g. an integer past Python's int_max_str_digits
    return f"not JSON this server reads: {str(exc).split(';')[0]}"
  return f"the body could not be read: {exc!r}"


def _field(loc) -> str:
  """'candidates[3]' / '[2].history' of a pydantic error location (after 'body')."""
  out = ""
  for part in loc[1:] if loc and loc[0] == "body" else loc:
    out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
  return out or "body"


class _BodyLimit:
  """ASGI middleware: reads each request body (at most `limit` bytes, declared or streamed)
  before the application sees it; a larger one gets a 413 without being read further, and
  `on_refused(path)` is called (the metrics count it)."""

  def __init__(self, app, limit: int, on_refused):
    self.app, self.limit, self.on_refused = app, limit, on_refused

  async def __call__(self, scope, receive, send):
    if scope["type"] != "http":
      return await self.app(scope, receive, send)
    declared = dict(scope["headers"]).get(b"content-length", b"0")
    if declared.isdigit() and int(declared) > self.limit:
      return await self._refuse(scope, send)
    chunks, size, more = [], 0, True
    while more:
      message = await receive()
      if message["type"] != "http.request":  # the client went away: nothing to answer
        return None
      chunks.append(message.get("body", b""))
      size += len(chunks[-1])
      more = message.get("more_body", False)
      if size > self.limit:
        return await self._refuse(scope, send)
    replayed = iter([{"type": "http.request", "body": b"".join(chunks), "more_body": False}])

    async def replay():
      return next(replayed, None) or await receive()

    return await self.app(scope, replay, send)

  async def _refuse(self, scope, send):
    self.on_refused(scope["path"])
    body = json.dumps(_Refused(413, "bad_request", "body_too_large", "the body exceeds "
                               f"serve.max_body_bytes={self.limit}", "body").body)
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body.encode()})


def make_app(engine: engine_lib.Engine, settings: spec_lib.ServeSpec, *, load_s: float = 0.0,
             on_warm_failure=lambda: None) -> fastapi.FastAPI:
  """The FastAPI application of an engine.

  Args:
    engine: the model (gr2jax/apps/serve/engine.py).
    settings: the serve spec (its serving fields; the engine holds the decoder choice).
    load_s: seconds the engine took to load (reported by /healthz).
    on_warm_failure: called on the worker when the warm-up raises (run() stops uvicorn).
  """
  state = {"startup": {}, "draining": False, "baseline": None}
  compiles_after = lambda: (0 if state["baseline"] is None
                            else engine_lib.compile_count() - state["baseline"])
  metrics = metrics_lib.Metrics(settings.batch_buckets, lambda: batcher.depth, compiles_after,
                                tuple(engine.decoders))
  batcher = batching.Batcher(engine.rank, buckets=settings.batch_buckets,
                             window_s=settings.window_ms / 1e3, queue_bound=settings.queue_bound,
                             on_batch=metrics.on_batch)
  ids = itertools.count()
  injected = engine.choice.read_costs(batcher.buckets, engine.decoders)  # auto's file

  def warm():
    start, compiles, hits = (time.perf_counter(), engine_lib.compile_count(),
                             engine_lib.cache_hits())
    try:
      for length in engine.prompt_lengths:
        for bucket in batcher.buckets:
          engine.warm(bucket, length)
      engine.settle(injected, batcher.buckets)
    except BaseException:
      on_warm_failure()
      raise
    state["baseline"] = engine_lib.compile_count()
    state["startup"] = {
      "load_s": round(load_s, 3), "warm_s": round(time.perf_counter() - start, 3),
      "programs": len(batcher.buckets) * len(engine.prompt_lengths) * len(engine.decoders),
      "compiles": state["baseline"] - compiles, "cache_hits": engine_lib.cache_hits() - hits}
    logging.warning("ready: %s (%s) %s", engine.name, engine.kind, json.dumps(state["startup"]))

  @contextlib.asynccontextmanager
  async def lifespan(app):
    batcher.start(warm)
    yield
    state["draining"] = True
    await asyncio.get_running_loop().run_in_executor(None, batcher.stop)
    logging.warning("drained: every admitted request answered")

  app = fastapi.FastAPI(title="gr2jax re-ranker", lifespan=lifespan,
                        strict_content_type=False)  # a body without Content-Type is JSON
  app.state.batcher, app.state.metrics = batcher, metrics

  def count_bad(path: str) -> None:
    if (endpoint := _endpoint(path)) is not None:
      metrics.requests.labels(endpoint, "bad_request").inc()

  app.add_middleware(_BodyLimit, limit=settings.max_body_bytes, on_refused=count_bad)

  def refused(e: _Refused) -> responses.JSONResponse:
    return responses.JSONResponse(e.body, status_code=e.status, headers=e.headers)

  @app.exception_handler(starlette_exceptions.HTTPException)
  async def http_error(request: fastapi.Request, exc: starlette_exceptions.HTTPException):
    """FastAPI's own errors in the server's format: a body it could not parse (400), an
    unknown path (404) or method (405)."""
    if exc.status_code == 400:
      e = _Refused(400, "bad_request", "malformed_json", _unreadable(exc.__cause__), "body")
    else:
      kind = {404: "not_found", 405: "method_not_allowed"}.get(exc.status_code, "http_error")
      e = _Refused(exc.status_code, "bad_request", kind,
                   f"{request.method} {request.url.path}: {exc.detail}", "path",
                   dict(exc.headers or {}))
    count_bad(request.url.path)
    return refused(e)

  @app.exception_handler(fastapi_exceptions.RequestValidationError)
  async def invalid(request: fastapi.Request, exc: fastapi_exceptions.RequestValidationError):
    first = exc.errors()[0] if exc.errors() else {"type": "", "loc": (), "msg": "invalid"}
    content_type = request.headers.get("content-type", "application/json")
    if "json" not in content_type:
      e = _Refused(415, "bad_request", "not_json", f"Content-Type {content_type!r}: send "
                   "application/json", "body")
    elif first["type"] == "json_invalid":
      detail = first.get("ctx", {}).get("error", first["msg"])
      e = _Refused(400, "bad_request", "malformed_json", f"not JSON: {detail}", "body")
    else:
      kind = "missing_field" if first["type"] == "missing" else "bad_field"
      field = _field(first["loc"])
      e = _Refused(422, "bad_request", kind, f"{field}: {first['msg']}", field)
    count_bad(request.url.path)
    return refused(e)

  async def answer(requests: list[RerankRequest], prefix) -> list[dict]:
    retry = {"Retry-After": str(settings.retry_after_s)}
    if batcher.depth + len(requests) > settings.queue_bound:  # shed load before any work
      raise _Refused(503, "overloaded", "overloaded", f"{batcher.depth} requests in flight; "
                     f"the queue holds {settings.queue_bound} (serve.queue_bound)", headers=retry)
    prepared = []
    for i, r in enumerate(requests):
      obj = r.model_dump()
      obj["id"] = f"req-{next(ids)}" if obj["id"] is None else obj["id"]
      try:
        prepared.append(engine.parse(obj))
      except engine_lib.InputError as e:
        message = str(e) if str(e).startswith(e.field) else f"{e.field}: {e}"
        raise _Refused(422, "bad_request", e.kind, prefix(i) + message,
                       prefix(i) + e.field) from None
    try:
      futures = batcher.submit(prepared, [p.prompt_len for p in prepared], settings.timeout_s)
    except batching.NotReady as e:
      raise _Refused(503, "not_ready", "not_ready", str(e), headers=retry) from None
    except batching.Overloaded as e:
      raise _Refused(503, "overloaded", "overloaded", str(e), headers=retry) from None
    try:
      results = await asyncio.wait_for(
        asyncio.gather(*[asyncio.wrap_future(f) for f in futures]), settings.timeout_s)
    except (TimeoutError, batching.DeadlineExceeded) as e:
      raise _Refused(504, "timeout", "timeout",
                     f"no answer within serve.timeout_s={settings.timeout_s} ({e})") from None
    return [{"id": p.request.id, "ranking": row["ranking"], "reasoning": row["reasoning"],
             "valid": row["valid"], "fallback": row["fallback"], "model": engine.name,
             "history_dropped": p.history_dropped,
             "timings": {"queue_ms": 1e3 * queue_s, "decode_ms": 1e3 * decode_s}}
            for p, (row, queue_s, decode_s, _) in zip(prepared, results, strict=True)]

  async def measured(endpoint: str, requests: list[RerankRequest], prefix,
                     body) -> responses.Response:
    """The response to `requests`, made here (the body rendered too), then counted."""
    start = time.perf_counter()
    try:
      rows = await answer(requests, prefix)
      out, outcome = responses.JSONResponse(body(rows)), "ok"
    except _Refused as e:
      out, outcome = refused(e), e.outcome
    except Exception as e:  # a decode failure: answered, counted, and the server goes on
      logging.exception("request failed")
      out, outcome = refused(_Refused(500, "error", "internal", repr(e))), "error"
    metrics.requests.labels(endpoint, outcome).inc()
    if outcome == "ok":
      metrics.latency.labels(endpoint).observe(time.perf_counter() - start)
      for row in rows:
        metrics.queue.observe(row["timings"]["queue_ms"] / 1e3)
    return out

  @app.post("/v1/rerank", response_model=Answer)
  async def rerank_one(request: RerankRequest):
    return await measured("rerank", [request], lambda i: "", lambda rows: rows[0])

  @app.post("/v1/rerank:batch", response_model=list[Answer])
  async def rerank_batch(requests: list[RerankRequest]):
    if not 0 < len(requests) <= settings.queue_bound:
      e = _Refused(422, "bad_request", "bad_batch_size", f"a batch holds 1..serve.queue_bound="
                   f"{settings.queue_bound} requests, got {len(requests)}", "body")
      metrics.requests.labels("rerank_batch", "bad_request").inc()
      return refused(e)
    return await measured("rerank_batch", requests, lambda i: f"[{i}].", lambda rows: rows)

  @app.api_route("/healthz", methods=["GET", "HEAD"])
  async def healthz():
    if batcher.warm_error is not None:
      status = "failed"
    elif state["draining"]:
      status = "draining"
    else:
      status = "ready" if batcher.ready.is_set() else "warming_up"
    body = {"status": status, "model": engine.name, "kind": engine.kind,
            "batch_buckets": list(batcher.buckets), "prompt_lengths": list(engine.prompt_lengths),
            "queue_depth": batcher.depth, "startup": state["startup"],
            "mode": engine.choice.mode,
            "decoders": {str(b): d for b, d in
                         engine.choice.chosen(batcher.buckets, engine.decoders).items()},
            "cost_table": engine.choice.report()}
    return responses.JSONResponse(body, status_code=200 if status == "ready" else 503)

  @app.api_route("/metrics", methods=["GET", "HEAD"])
  async def prometheus_metrics():
    return responses.Response(metrics.text(), media_type="text/plain; version=0.0.4")

  return app


def bind(host: str, port: int) -> socket.socket:
  """A TCP socket bound to host:port (0 = a free port; read it with getsockname()), not yet
  listening: bound before the model loads, it holds the port while connections are still
  refused; uvicorn listens on it once it serves.

  Raises:
    OSError: one line naming host:port and serve.port (in use, or not an address here).
  """
  family = socket.AF_INET6 if ":" in host else socket.AF_INET
  sock = socket.socket(family, socket.SOCK_STREAM)
  sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
  try:
    sock.bind((host, port))
  except OSError as e:
    sock.close()
    raise type(e)(e.errno, f"serve.port={port}: cannot listen on {host}:{port} ({e.strerror}): "
                  "another process holds the port, or the host is not an address here; pick "
                  "another --config.serve.port (0 = a free one) or --config.serve.host") from None
  return sock


def make_server(engine: engine_lib.Engine, settings: spec_lib.ServeSpec, *,
                load_s: float = 0.0) -> uvicorn.Server:
  """The uvicorn server of an engine (graceful shutdown within settings.drain_timeout_s)."""
  holder = {}
  app = make_app(engine, settings, load_s=load_s,
                 on_warm_failure=lambda: setattr(holder["server"], "should_exit", True))
  config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="on",
                          timeout_graceful_shutdown=settings.drain_timeout_s,
                          timeout_keep_alive=settings.keep_alive_s)
  holder["server"] = uvicorn.Server(config)
  return holder["server"]


def serve(engine: engine_lib.Engine, settings: spec_lib.ServeSpec, *, load_s: float = 0.0,
          sock: socket.socket | None = None) -> None:
  """Serves until SIGTERM / SIGINT (then drains), on `sock` (default: bind(settings' host and
  port)).

  Raises:
    RuntimeError: the warm-up failed (nothing was served).
  """
  server = make_server(engine, settings, load_s=load_s)
  sock = sock or bind(settings.host, settings.port)
  host, port = sock.getsockname()[:2]
  programs = len(settings.batch_buckets) * len(engine.prompt_lengths) * len(engine.decoders)
  print(f"serving {engine.name} ({engine.kind}, mode {engine.choice.mode}) on "
        f"http://{host}:{port} "
        f"(warming up {programs} programs)", flush=True)
  server.run(sockets=[sock])
  error = server.config.app.state.batcher.warm_error
  if error is not None:
    raise RuntimeError(f"warm-up failed: {error!r}") from error


def run(recipe, c, workdir: str) -> None:
  """`--config=serve.py`: loads `c.ckpt` with the recipe's data build and decode spec, serves.

  Args:
    recipe: the gr2jax.recipe.Recipe the model was trained with.
    c: the `serve` block: a spec.ServeSpec, or the command line's ConfigDict block (read
      with ServeSpec.of: every field checked, before the port and the model).
    workdir: the workdir of the recipe's data build (the persistent compilation cache too).
  """
  import os

  from gr2jax import recipe as recipe_lib

  spec = c if isinstance(c, spec_lib.ServeSpec) else spec_lib.ServeSpec.of(c, "serve.")
  for field in ("ckpt", "verify_with"):  # a misspelt export, before the port or a data build
    if getattr(spec, field):
      load.check_model_dir(workdir_lib.fill_path(getattr(spec, field), workdir), f"serve.{field}")
  sock = bind(spec.host, spec.port)  # a busy port stops here, before the model loads
  cache = workdir_lib.fill_path(spec.compilation_cache, workdir)
  if cache:
    engine_lib.use_compilation_cache(os.path.abspath(cache))
  start = time.perf_counter()
  engine = engine_lib.Engine.load(spec, workdir=workdir, data_config=recipe_lib.data_config(recipe),
                                  decode=recipe.decode)
  serve(engine, spec, load_s=time.perf_counter() - start, sock=sock)
