"""The HTTP server (gr2jax/apps/serve/server.py) over a real loopback socket: the offline tool's
answers, every bad input a 4xx naming the field (and the server still serving), 503 beyond the
queue bound with no admitted request lost, 504 past the deadline, Prometheus metrics that count
what was sent, and SIGTERM draining in-flight requests (a server process)."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading

import httpx
import pytest

from gr2jax import recipes
from gr2jax.apps import rerank
from gr2jax.apps.serve import server
from gr2jax.apps.serve.client import scrape, wait_ready
from tests.apps.serve.toy_server import Gated, ThreadServer, settings, toy_engine
from tests.apps.test_rerank import _good

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def engine(tok_dir):
  return toy_engine(tok_dir)


@pytest.fixture(scope="module")
def srv(engine):
  s = ThreadServer(engine, settings())
  yield s
  s.close()


@pytest.mark.parametrize("field,value", [("port", 70000), ("batch_buckets", (4, 2)),
                                         ("batch_buckets", ()), ("window_ms", -1.0),
                                         ("queue_bound", 0), ("timeout_s", 0.0),
                                         ("retry_after_s", True), ("host", "")])
def test_bad_settings_name_the_field(field, value):
  with pytest.raises(ValueError, match=rf"^serve\.{field}[= ]"):
    settings(**{field: value})


def test_a_busy_port_is_one_line_naming_serve_port_before_the_model_loads(tmp_path):
  busy = server.bind("127.0.0.1", 0)
  busy.listen(1)
  port = busy.getsockname()[1]
  block = recipes.config("", "serve").serve
  export = tmp_path / "export"  # a model directory whose loading would fail
  export.mkdir()
  (export / "gr2jax_config.json").write_text("{}")
  workdir = tmp_path / "W"
  workdir.mkdir()
  block.update(dict(port=port, ckpt=str(export)))
  try:
    with pytest.raises(OSError, match=rf"^\[Errno 98\] serve\.port={port}: cannot listen on "
                                      rf"127\.0\.0\.1:{port} .*--config\.serve\.port"):
      server.run(None, block, str(workdir))
  finally:
    busy.close()
  assert not os.listdir(workdir)  # nothing loaded, no compilation cache made


@pytest.mark.parametrize("field", ["ckpt", "verify_with"])
def test_a_misspelt_export_is_named_before_the_port_or_a_data_build(tmp_path, monkeypatch, field):
  """Serving from an empty workdir (a self-contained export's use) with a typo in serve.ckpt
  used to build a whole data build there first, then say the path was not a model."""
  from gr2jax.data import pipeline

  monkeypatch.setattr(pipeline, "run", lambda *a, **k: pytest.fail("a data build ran"))
  monkeypatch.setattr(server, "bind", lambda *a, **k: pytest.fail("the port was bound"))
  export = tmp_path / "run{1}" / "rl" / "export"  # braces in a path are the path's own
  export.mkdir(parents=True)
  (export / "gr2jax_config.json").write_text("{}")
  block = recipes.config("", "serve").serve
  block.update(dict(ckpt="{workdir}/rl/export", verify_with=""))
  block[field] = "{workdir}/rl/exprt"
  with pytest.raises(ValueError) as info:
    server.run(None, block, str(tmp_path / "run{1}"))
  assert str(info.value) == (f"serve.{field}={tmp_path}/run{{1}}/rl/exprt: does not exist (pass "
                             "a gr2jax export or an HF Qwen3 directory)")
  assert os.listdir(tmp_path / "run{1}") == ["rl"]


def _post_all(url: str, path: str, bodies: list) -> list[httpx.Response]:
  """POSTs every body at once (one connection each) and returns the responses in order."""

  async def go():
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
      return await asyncio.gather(*[client.post(path, json=b) for b in bodies])

  return asyncio.run(go())


def test_ready_after_warm_up(srv):
  assert srv.health["status"] == "ready" and srv.health["kind"] == "ar"
  startup = srv.health["startup"]
  assert startup["programs"] == 1 and startup["warm_s"] >= 0


def test_answers_are_the_offline_tools(srv, engine):
  requests = [_good(i) for i in range(9)]
  requests[2] = requests[2] | {"candidates": [f"B{i:09d}" for i in requests[2]["candidates"]]}
  offline = rerank.rerank_lines([json.dumps(r) for r in requests], engine.reranker,
                                batch_size=4)
  single = _post_all(srv.url, "/v1/rerank", requests[:6])
  batch = httpx.post(f"{srv.url}/v1/rerank:batch", json=requests[6:], timeout=60)
  assert [r.status_code for r in single] == [200] * 6 and batch.status_code == 200
  answers = [r.json() for r in single] + batch.json()
  for answer, want in zip(answers, offline, strict=True):
    assert answer["id"] == want["id"] and answer["ranking"] == want["ranking"]
    assert answer["reasoning"] == want["reasoning"]
    assert (answer["valid"], answer["fallback"]) == (want["kind"] == "valid", want["fallback"])
    assert answer["model"] == "toy" and answer["history_dropped"] == 0
    assert answer["timings"]["decode_ms"] > 0 and answer["timings"]["queue_ms"] >= 0
  assert httpx.post(f"{srv.url}/v1/rerank", json=_good(0) | {"id": None}).json()["id"]


GOOD = json.dumps(_good(0))
BAD = [  # (path, body, status, kind, field)
  ("/v1/rerank", b'{"history": [1], "candidates": [1, 2', 400, "malformed_json", "body"),
  ("/v1/rerank", json.dumps({"history": []}), 422, "missing_field", "candidates"),
  ("/v1/rerank", json.dumps(_good(0) | {"candidates": list(range(9))}), 422,
   "wrong_candidate_count", "candidates"),
  ("/v1/rerank", json.dumps(_good(0) | {"candidates": [*range(9), 2]}), 422,
   "duplicate_candidates", "candidates[9]"),
  ("/v1/rerank", json.dumps(_good(0) | {"candidates": [*range(9), 40]}), 422, "unknown_item",
   "candidates[9]"),
  ("/v1/rerank", json.dumps(_good(0) | {"history": [3, "NOPE"]}), 422, "unknown_item",
   "history[1]"),
  ("/v1/rerank", json.dumps(_good(0) | {"history": [1.5]}), 422, "bad_field", "history[0]"),
  ("/v1/rerank", json.dumps(_good(0) | {"candidates": "0123456789"}), 422, "bad_field",
   "candidates"),
  ("/v1/rerank", json.dumps(_good(0) | {"id": [1]}), 422, "bad_field", "id"),
  ("/v1/rerank", json.dumps([_good(0)]), 422, "bad_field", "body"),
  ("/v1/rerank:batch", json.dumps([_good(0), _good(1) | {"history": [99]}]), 422,
   "unknown_item", "[1].history[0]"),
  ("/v1/rerank:batch", json.dumps([_good(0), {"candidates": [True]}]), 422, "missing_field",
   "[1].history"),
  ("/v1/rerank:batch", "[]", 422, "bad_batch_size", "body"),
  ("/v1/rerank", b"x" * (2 << 20), 413, "body_too_large", "body"),
  ("/v1/rerank", json.dumps(_good(0) | {"id": "\ud800"}), 422, "bad_field", "id"),
  ("/v1/rerank:batch", json.dumps([_good(0), _good(1) | {"id": "a\ud800"}]), 422, "bad_field",
   "[1].id"),
  ("/v1/rerank", json.dumps(_good(0) | {"history": ["\udfff"]}), 422, "bad_field",
   "history[0]"),
]
UNREADABLE = [  # bodies FastAPI itself cannot parse: (body, what the message says)
  (GOOD[:-1] + ', "n": ' + "7" * 5001 + "}", "4300 digits"),
  (b"[" * 100_000 + b"]" * 100_000, "nests deeper"),
  (b'{"id": "\xff\xfe", "history": [], "candidates": []}', "not UTF-8"),
]


@pytest.mark.parametrize("path,body,status,kind,field", BAD)
def test_bad_input_names_the_field_and_the_server_goes_on(srv, path, body, status, kind, field):
  r = httpx.post(f"{srv.url}{path}", content=body, headers={"content-type": "application/json"})
  assert r.status_code == status, r.text
  error = r.json()["error"]
  assert (error["kind"], error["field"]) == (kind, field) and error["message"]
  assert httpx.post(f"{srv.url}/v1/rerank", content=GOOD, timeout=60).status_code == 200


@pytest.mark.parametrize("path", ["/v1/rerank", "/v1/rerank:batch"])
@pytest.mark.parametrize("body,says", UNREADABLE)
def test_unreadable_bodies_get_400_in_the_servers_format_and_are_counted(srv, path, body, says):
  before = scrape(srv.url)
  r = httpx.post(f"{srv.url}{path}", content=body, headers={"content-type": "application/json"})
  assert r.status_code == 400, r.text
  error = r.json()["error"]
  assert (error["kind"], error["field"]) == ("malformed_json", "body") and says in error["message"]
  key = ("gr2jax_serve_requests_total",
         (("endpoint", path.rsplit("/", 1)[1].replace(":", "_")), ("outcome", "bad_request")))
  assert scrape(srv.url)[key] - before.get(key, 0.0) == 1


def test_a_lone_surrogate_is_counted_as_a_bad_request_not_ok(srv):
  before = scrape(srv.url)
  r = httpx.post(f"{srv.url}/v1/rerank", content=json.dumps(_good(0) | {"id": "\ud800"}))
  assert r.status_code == 422 and "surrogate" in r.json()["error"]["message"]
  after = scrape(srv.url)
  for outcome, want in (("ok", 0), ("bad_request", 1), ("error", 0)):
    key = ("gr2jax_serve_requests_total", (("endpoint", "rerank"), ("outcome", outcome)))
    assert after[key] - before.get(key, 0.0) == want, outcome


def test_head_answers_where_get_does_and_unknown_routes_use_the_error_format(srv):
  for path in ("/healthz", "/metrics"):
    r = httpx.head(f"{srv.url}{path}")
    assert r.status_code == 200 and r.content == b""
  r = httpx.get(f"{srv.url}/nope")
  assert r.status_code == 404 and r.json()["error"]["kind"] == "not_found"
  r = httpx.delete(f"{srv.url}/v1/rerank")
  assert r.status_code == 405 and r.json()["error"]["kind"] == "method_not_allowed"
  assert "POST" in r.headers["allow"]


def test_a_streamed_body_over_the_limit_gets_413(srv):
  chunks = (b"[" * 65536 for _ in range(40))  # chunked: no Content-Length to refuse up front
  r = httpx.post(f"{srv.url}/v1/rerank", content=chunks,
                 headers={"content-type": "application/json"})
  assert r.status_code == 413 and r.json()["error"]["kind"] == "body_too_large"


def test_form_content_is_refused_with_415(srv):
  r = httpx.post(f"{srv.url}/v1/rerank", data={"history": "1"})
  assert r.status_code == 415 and "application/json" in r.json()["error"]["message"]


def test_metrics_parse_and_count_what_was_sent(srv):
  before = scrape(srv.url)
  ok = _post_all(srv.url, "/v1/rerank", [_good(i) for i in range(5)])
  bad = httpx.post(f"{srv.url}/v1/rerank", json=_good(0) | {"candidates": [1]})
  assert [r.status_code for r in ok] == [200] * 5 and bad.status_code == 422
  after = scrape(srv.url)

  def delta(name, **labels):
    key = (name, tuple(sorted(labels.items())))
    return after[key] - before.get(key, 0.0)

  assert delta("gr2jax_serve_requests_total", endpoint="rerank", outcome="ok") == 5
  assert delta("gr2jax_serve_requests_total", endpoint="rerank", outcome="bad_request") == 1
  assert delta("gr2jax_serve_request_seconds_count", endpoint="rerank") == 5  # answered
  assert (delta("gr2jax_serve_answers_total", result="valid")
          + delta("gr2jax_serve_answers_total", result="fallback")) == 5
  assert delta("gr2jax_serve_queue_seconds_count") == 5
  batches = delta("gr2jax_serve_batch_size_count")
  assert 2 <= batches <= 5 and delta("gr2jax_serve_batch_size_sum") == 5  # 5 > one bucket of 4
  assert delta("gr2jax_serve_batches_total", bucket="4") == batches
  assert after[("gr2jax_serve_queue_depth", ())] == 0
  assert after[("gr2jax_serve_compiles_after_ready_total", ())] == 0  # no shape compiled
  assert 0 < after[("gr2jax_serve_forwards_per_token", ())] <= 1.5
  assert after[("gr2jax_serve_fallback_rate", ())] + after[("gr2jax_serve_valid_rate", ())] == 1


def test_overload_answers_503_and_loses_no_admitted_request(engine):
  """8 requests at once against a queue of 3 whose decodes are held: 5 get 503 + Retry-After
  at once, the 3 admitted are all answered once decoding goes on."""
  gate = threading.Event()
  s = ThreadServer(Gated(engine, gate), settings(queue_bound=3))

  async def go():
    async with httpx.AsyncClient(base_url=s.url, timeout=60) as client:
      posts = [asyncio.create_task(client.post("/v1/rerank", json=_good(i))) for i in range(8)]
      while sum(p.done() for p in posts) < 5:
        await asyncio.sleep(0.02)
      refused = [p.result() for p in posts if p.done()]
      gate.set()
      return refused, await asyncio.gather(*posts)

  try:
    refused, responses = asyncio.run(go())
  finally:
    s.close()
  assert [r.status_code for r in refused] == [503] * 5
  assert all(r.headers["retry-after"] == "1" and r.json()["error"]["kind"] == "overloaded"
             for r in refused)
  answered = [r for r in responses if r.status_code == 200]
  assert len(answered) == 3 and all(len(r.json()["ranking"]) == 10 for r in answered)


def test_past_the_deadline_answers_504_not_a_hung_connection(engine):
  gate = threading.Event()
  s = ThreadServer(Gated(engine, gate), settings(timeout_s=0.3))
  try:
    r = httpx.post(f"{s.url}/v1/rerank", json=_good(0), timeout=10)
    assert r.status_code == 504 and r.json()["error"]["kind"] == "timeout"
    gate.set()
    assert httpx.post(f"{s.url}/v1/rerank", json=_good(0), timeout=10).status_code == 200
  finally:
    s.close()


@pytest.fixture(scope="module", autouse=True)
def process(tok_dir):
  """A server process, started with the module so that it warms up while the other tests run;
  its decodes wait 2 s first, so requests are in flight when the SIGTERM test signals it."""
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
  p = subprocess.Popen(
    [sys.executable, "-m", "tests.apps.serve.toy_server", f"--tok={tok_dir}", "--hold_s=2"],
    cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  yield p
  p.kill()
  p.wait()


@pytest.mark.integration
def test_sigterm_drains_in_flight_requests(process):
  """SIGTERM with requests in the queue: all are answered, then no new connection is
  accepted, and the process exits."""
  lines = iter(process.stdout.readline, "")
  url = next(line for line in lines if line.startswith("serving ")).split(" on ")[1].split()[0]
  wait_ready(url, 120, process=process)

  async def go():
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
      posts = [asyncio.create_task(client.post("/v1/rerank", json=_good(i))) for i in range(3)]
      while (await client.get("/healthz")).json()["queue_depth"] < 3:
        await asyncio.sleep(0.05)
      process.send_signal(signal.SIGTERM)
      return await asyncio.gather(*posts)

  responses = asyncio.run(go())
  assert [r.status_code for r in responses] == [200] * 3
  assert all(len(r.json()["ranking"]) == 10 for r in responses)
  assert process.wait(60) in (0, -signal.SIGTERM)
  with pytest.raises(httpx.ConnectError):
    httpx.get(f"{url}/healthz")
  assert "drained" in process.stdout.read()
