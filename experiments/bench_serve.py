r"""Load benchmark of the re-ranking server: a real client over a real loopback socket.

  python experiments/bench_serve.py --config=serve.py --workdir=W --models=ar_rl,rl \
      --report_dir=docs/results/serve [--config.<recipe overrides of the models' training run>]

For each model (W/<model>/export) the script
  1. loads the offline re-ranking tool (gr2jax.rerank) in this process on the same requests and
     compiles its shapes (batch --goal_concurrency and batch 1);
  2. starts the server (`experiments/run.py --config=serve.py ...`, the recipe and overrides
     given here) with an empty persistent compilation cache (cold start), stops it with
     SIGTERM, starts it again on the filled cache (warm start) and reports both start-ups;
  3. drives it with async httpx clients (--client_processes processes sharing C connections,
     closed loop: each connection sends its next request when the previous one is answered)
     at every --concurrency and at --goal_concurrency: throughput (answered requests / s),
     end-to-end p50 / p95 / p99, the server's batch-size distribution and time in the server
     (its /metrics before and after), validity, errors;
  4. measures goals 1 and 2 in --goal_rounds rounds, each measurement right after its offline
     baseline, so that both see the same conditions: offline throughput at batch
     --goal_concurrency, then httpx and wrk (an independent load tool, a lua script rotating
     the same request bodies) at that concurrency; one request alone offline, then httpx and
     wrk at concurrency 1;
  5. soaks at --soak_concurrency for --soak_s (resident memory of the server process at start
     and end, errors).
Then one server with --queue_bound is driven at the bound and at twice it (clients that get a
503 back off --backoff_ms): only 503s beyond the bound, p99 of the admitted requests.

With --modes (e.g. ar,lossless,auto) the script instead compares serving modes that all answer
with AR GR2's rankings, in one run: 'ar' serves W/<--verifier>/export alone, 'lossless' serves
W/<--drafter>/export verified by it (serve.verify_with, draft-and-verify at decode.draft_k) and
'auto' the same pair with serve.mode=auto (the exact decoder of each batch bucket, from the cost
table its warm-up measures). The three servers stay up side by side; each --mode_rounds round
drives every mode at every --concurrency in turn (interleaved, so all see the same conditions, in
the balanced order of serve_modes.round_order), auto's ratios to the fixed modes are taken within
each round and their median kept, and every answer's ranking is compared to the offline tool's on
the verifier export (AR GR2's rankings). Outputs: bench_serve_modes.json and bench_serve_modes.md.

  python experiments/bench_serve.py --config=serve.py --workdir=W --modes=ar,lossless,auto \
      --drafter=cft --verifier=ar_rl --concurrency=1,4,16,32,64

The three goals, side by side in this one run: throughput at --goal_concurrency >= 0.8x the
offline tool's at that batch; p50 at concurrency 1 <= 1.2x one request re-ranked alone by the
offline tool; at 2x the queue bound only 503s beyond it and a bounded p99 of the admitted.

Requests are the data build's --split users in order (history and candidates as item indices).
Every request loop is bounded in requests and seconds, the client targets only the loopback
address, and the script stops by itself. Outputs (--report_dir, default a fresh directory under
runs/bench_serve/): bench_serve.json, bench_serve.md, latency_vs_throughput.png, wrk_post.lua.
"""

import asyncio
import atexit
import itertools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np
from absl import app, flags

from experiments import run as run_main  # its --config and --workdir flags
from experiments import serve_modes
from gr2jax import cli, metrics
from gr2jax.apps.serve import client

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MODES = ("ar", "lossless", "auto")  # --modes: the serving modes compared
FLAGS = flags.FLAGS  # --config: serve.py[:variant] + the models' training overrides; --workdir:
#                      the workdir holding the data build and <model>/export
flags.DEFINE_list("models", ["ar_rl", "rl"], "Stages whose W/<stage>/export are served.")
cli.define_list("concurrency", [1, 4, 16, 64], "Client connections per load level.",
                cli.integer(1))
flags.DEFINE_integer("requests", 256, "The most requests per load level.")
flags.DEFINE_integer("client_processes", 2, "Client processes sharing each level's connections "
                     "(one Python process alone can be the bottleneck).")
flags.DEFINE_float("level_s", 60.0, "The most seconds per load level.")
flags.DEFINE_string("split", "test_1615", "The data build's split the requests come from.")
flags.DEFINE_integer("goal_concurrency", 32, "Goal 1: the concurrency and offline batch.")
flags.DEFINE_integer("batch1_requests", 16, "Goal 2: requests the offline tool decodes alone.")
flags.DEFINE_integer("queue_bound", 32, "Goal 3: the queue bound of the overload server.")
flags.DEFINE_float("backoff_ms", 100.0, "Goal 3: a client's pause after a 503 (a tenth of the "
                   "server's Retry-After).")
flags.DEFINE_bool("wrk", True, "Also measure the goal points with wrk (an independent client).")
flags.DEFINE_integer("goal_rounds", 2, "Rounds of the goal measurements (the median is kept).")
flags.DEFINE_float("wrk_s", 20.0, "wrk's duration (seconds).")
flags.DEFINE_float("soak_s", 0.0, "Soak duration in seconds (0 = no soak; the issue's: 600).")
flags.DEFINE_integer("soak_concurrency", 16, "The soak's connections.")
flags.DEFINE_string("soak_model", "rl", "The model of the soak (one of --models).")
flags.DEFINE_float("start_timeout_s", 600.0, "The longest a server may take to become ready.")
flags.DEFINE_string("report_dir", "", "Outputs ('' = a fresh runs/bench_serve/<time>/).")
flags.DEFINE_list("modes", [], "Compare these serving modes instead ('' = the benchmark of "
                  f"--models): any of {', '.join(MODES)}.")
flags.DEFINE_string("drafter", "cft", "--modes: the stage whose block-diffusion export drafts.")
flags.DEFINE_string("verifier", "ar_rl", "--modes: the stage whose AR export verifies (AR GR2).")
flags.DEFINE_integer("mode_rounds", 2, "--modes: rounds over every mode and concurrency (the "
                     "median of each is kept).")

HOST = "127.0.0.1"  # the only address the client targets


def check_flags() -> None:
  """Refuses bad flags before anything starts, naming the flag.

  Raises:
    app.UsageError: the flag and what it must be.
  """
  if not FLAGS.workdir or not os.path.isdir(FLAGS.workdir):
    raise app.UsageError(f"--workdir={FLAGS.workdir!r} must be an existing workdir")
  unknown = [m for m in FLAGS.modes if m not in MODES]
  if unknown:
    raise app.UsageError(f"--modes: unknown {unknown}; pick from {', '.join(MODES)}")
  stages = ([("drafter", FLAGS.drafter), ("verifier", FLAGS.verifier)] if FLAGS.modes
            else [("models", m) for m in FLAGS.models])
  if not stages:
    raise app.UsageError("--models must name at least one stage")
  for flag, model in stages:
    if not os.path.isdir(os.path.join(FLAGS.workdir, model, "export")):
      raise app.UsageError(f"--{flag}: {FLAGS.workdir}/{model}/export does not exist")
  for name, value in (("requests", FLAGS.requests),
                      ("goal_concurrency", FLAGS.goal_concurrency),
                      ("batch1_requests", FLAGS.batch1_requests),
                      ("queue_bound", FLAGS.queue_bound),
                      ("client_processes", FLAGS.client_processes),
                      ("goal_rounds", FLAGS.goal_rounds), ("mode_rounds", FLAGS.mode_rounds),
                      ("soak_concurrency", FLAGS.soak_concurrency)):
    if value < 1:
      raise app.UsageError(f"--{name}={value} must be >= 1")
  for name in ("level_s", "wrk_s", "start_timeout_s"):
    if not FLAGS[name].value > 0:
      raise app.UsageError(f"--{name}={FLAGS[name].value} must be > 0")
  if FLAGS.soak_s < 0 or FLAGS.backoff_ms < 0:
    raise app.UsageError("--soak_s and --backoff_ms must be >= 0")
  if FLAGS.soak_s and FLAGS.soak_model not in FLAGS.models:
    raise app.UsageError(f"--soak_model={FLAGS.soak_model!r} is not in --models")
  if FLAGS.wrk and not FLAGS.modes and shutil.which("wrk") is None:
    raise app.UsageError("--wrk needs wrk on PATH (apt-get install wrk), or pass --nowrk")
  if FLAGS.goal_concurrency > max(FLAGS.config.serve.batch_buckets):
    raise app.UsageError(f"--goal_concurrency={FLAGS.goal_concurrency} exceeds the largest "
                         "batch bucket (--config.serve.batch_buckets)")


def request_bodies(summary: dict, split: str, limit: int) -> list[dict]:
  """The first `limit` users of a split of the data build as requests (item indices)."""
  from gr2jax.data import tfds_builder

  source = tfds_builder.data_source(summary["paths"]["tfds"], split)
  return [{"id": i, "history": [int(x) for x in source[i]["history"]],
           "candidates": [int(x) for x in source[i]["candidates"]]}
          for i in range(min(limit, len(source)))]


def percentiles(latencies_s: list[float]) -> dict:
  """p50 / p95 / p99 / max in milliseconds (None without samples)."""
  q = metrics.percentiles(np.asarray(latencies_s, np.float64) * 1e3, (50, 95, 99, 100))
  return {f"{k.replace('p100', 'max')}_ms": v for k, v in q.items()}


class Server:
  """A server process (experiments/run.py --config=serve.py) on a free loopback port.

  Args:
    model: the stage whose export it serves.
    cache_dir: its persistent compilation cache.
    log_path: its stdout and stderr.
    overrides: extra `--config.serve.<field>=<value>` arguments.
  """

  def __init__(self, model: str, cache_dir: str, log_path: str, overrides: tuple = ()):
    passed = [a for a in sys.argv[1:] if a.startswith("--config")]
    args = [sys.executable, os.path.join(REPO, "experiments", "run.py"), *passed,
            f"--workdir={FLAGS.workdir}",
            f"--config.serve.ckpt={os.path.join(FLAGS.workdir, model, 'export')}",
            f"--config.serve.host={HOST}", "--config.serve.port=0",
            f"--config.serve.compilation_cache={cache_dir}", *overrides]
    start = time.perf_counter()
    self.log = open(log_path, "w")
    self.process = subprocess.Popen(args, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT,
                                    env={**os.environ, "JAX_PLATFORMS": "cpu"})
    atexit.register(self.process.kill)  # never leave a server behind
    self.url = self._wait_url(log_path)
    self.health = client.wait_ready(self.url, FLAGS.start_timeout_s, self.process)
    self.start_s = time.perf_counter() - start

  def _wait_url(self, log_path: str) -> str:
    deadline = time.monotonic() + FLAGS.start_timeout_s
    while time.monotonic() < deadline:
      if self.process.poll() is not None:
        raise RuntimeError(f"the server exited with {self.process.returncode}: see {log_path}")
      with open(log_path) as f:
        for line in f:
          if line.startswith("serving ") and f"http://{HOST}:" in line:
            return line.split(" on ")[1].split()[0]
      time.sleep(0.2)
    raise RuntimeError(f"no server address in {FLAGS.start_timeout_s} s: see {log_path}")

  def rss_mb(self) -> float:
    """The server process's resident memory (MiB)."""
    with open(f"/proc/{self.process.pid}/status") as f:
      kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    return kb / 1024

  def metrics(self) -> dict:
    return client.scrape(self.url)

  def stop(self) -> int:
    """SIGTERM (drain), then its exit status."""
    self.process.send_signal(signal.SIGTERM)
    try:
      return self.process.wait(120)
    finally:
      self.process.kill()
      self.log.close()


def batch_distribution(before: dict, after: dict) -> dict:
  """Between two scrapes: decoded batches per compiled bucket and per decoder, the mean
  requests per batch and the mean time a request spent in the server (admission to answer)."""
  delta = lambda key: after.get(key, 0.0) - before.get(key, 0.0)
  per = lambda metric, label: {dict(labels)[label]: int(delta((name, labels)))
                               for name, labels in after if name == metric}
  buckets = per("gr2jax_serve_batches_total", "bucket")
  count = delta(("gr2jax_serve_batch_size_count", ()))
  served = (("endpoint", "rerank"),)
  requests = delta(("gr2jax_serve_request_seconds_count", served))
  return {"batches_per_bucket": {k: v for k, v in sorted(buckets.items(), key=lambda kv:
                                                         int(kv[0])) if v},
          "batches_per_decoder": {k: v for k, v in sorted(
            per("gr2jax_serve_decoder_batches_total", "decoder").items()) if v},
          "mean_batch": delta(("gr2jax_serve_batch_size_sum", ())) / count if count else None,
          "server_request_ms_mean": (1e3 * delta(("gr2jax_serve_request_seconds_sum", served))
                                     / requests if requests else None),
          "compiles_after_ready": after.get(("gr2jax_serve_compiles_after_ready_total", ()))}


async def _drive(url: str, bodies: list, part: int, parts: int, concurrency: int,
                 requests: int, start_at: float, seconds: float, backoff_s: float,
                 depth_probe: bool) -> tuple[list, list, float, float]:
  """One client process's share of a load level: `concurrency` connections send requests
  part, part + parts, ... (each body pre-encoded) until `requests` are sent or the time is up.

  Returns:
    (samples [(status, seconds, valid, server timings, (id, ranking) | None)], queue depths
    seen, start, end).
  """
  import httpx

  time.sleep(max(start_at - time.time(), 0.0))
  samples, depths = [], []
  order = itertools.count()
  deadline = time.time() + seconds
  encoded = [json.dumps(b).encode() for b in bodies]
  headers = {"content-type": "application/json"}
  limits = httpx.Limits(max_connections=concurrency + 1, max_keepalive_connections=concurrency + 1)
  async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as client:

    async def worker():
      while time.time() < deadline and (j := next(order)) < requests:
        begin = time.perf_counter()
        valid, timings, answered = None, {}, None
        try:
          r = await client.post("/v1/rerank", content=encoded[(part + parts * j) % len(encoded)],
                                headers=headers)
          status = r.status_code
          if status == 200:
            answer = r.json()
            valid, timings = answer["valid"], answer["timings"]
            answered = (answer["id"], answer["ranking"])
        except httpx.HTTPError as e:  # counted by its name
          status = type(e).__name__
        samples.append((status, time.perf_counter() - begin, valid, timings, answered))
        if status == 503 and backoff_s:
          await asyncio.sleep(backoff_s)

    async def probe():
      while not done.is_set():
        depths.append((await client.get("/healthz")).json()["queue_depth"])
        await asyncio.sleep(0.05)

    done = asyncio.Event()
    begin = time.time()
    probing = asyncio.create_task(probe()) if depth_probe else None
    await asyncio.gather(*[worker() for _ in range(concurrency)])
    end = time.time()
    done.set()
    if probing is not None:
      await probing
  return samples, depths, begin, end


def _client_part(*args) -> tuple[list, list, float, float]:
  """A client process's entry point (spawned: no JAX state is inherited)."""
  logging.getLogger("httpx").setLevel(logging.WARNING)
  return asyncio.run(_drive(*args))


def summarize(concurrency: int, parts: list, reference: dict | None = None) -> dict:
  """Throughput, latency percentiles, validity and statuses of a load level's client parts;
  with `reference` (request id -> ranking) also the answers whose ranking equals it."""
  samples = [s for part in parts for s in part[0]]
  depths = [d for part in parts for d in part[1]]
  wall = max(p[3] for p in parts) - min(p[2] for p in parts)
  ok = [s for s in samples if s[0] == 200]
  statuses = {}
  for status, *_ in samples:
    statuses[str(status)] = statuses.get(str(status), 0) + 1
  return {"concurrency": concurrency, "sent": len(samples), "answered": len(ok),
          "seconds": wall, "throughput_rps": len(ok) / wall if wall else 0.0,
          **percentiles([s[1] for s in ok]),
          "valid_rate": float(np.mean([bool(s[2]) for s in ok])) if ok else None,
          **{f"server_{k}_p50": float(np.median([s[3][k] for s in ok])) if ok else None
             for k in ("queue_ms", "decode_ms")},
          "statuses": statuses, "errors": len(samples) - len(ok),
          **({"equal_to_reference": sum(s[4][1] == reference[s[4][0]] for s in ok)}
             if reference is not None else {}),
          **({"max_queue_depth": max(depths)} if depths else {})}


def load_level(server: Server, bodies: list, concurrency: int, *, requests: int, seconds: float,
               backoff_s: float = 0.0, depth_probe: bool = False,
               reference: dict | None = None) -> dict:
  """One closed-loop load level against a server (split over the client processes), with the
  server's batch distribution over it (and the answers equal to `reference`, summarize)."""
  n = min(FLAGS.client_processes, concurrency)
  start_at = time.time() + (2.0 if n > 1 else 0.0)  # every process starts sending together
  args = [(server.url, bodies, k, n, concurrency // n + (k < concurrency % n),
           requests // n + (k < requests % n), start_at, seconds, backoff_s,
           depth_probe and k == 0) for k in range(n)]
  before = server.metrics()
  if n == 1:
    parts = [asyncio.run(_drive(*args[0]))]
  else:
    parts = [f.result() for f in [_pool().submit(_client_part, *a) for a in args]]
  out = summarize(concurrency, parts, reference)
  out.update(batch_distribution(before, server.metrics()))
  print(json.dumps(out), flush=True)
  return out


_POOLS = []


def _pool():
  """The client processes (spawned once, reused by every level)."""
  if not _POOLS:
    import concurrent.futures
    import multiprocessing

    _POOLS.append(concurrent.futures.ProcessPoolExecutor(
      FLAGS.client_processes, mp_context=multiprocessing.get_context("spawn")))
  return _POOLS[0]


class Offline:
  """The offline tool (gr2jax.rerank) on the benchmark's requests, its shapes compiled first."""

  def __init__(self, reranker, bodies: list):
    from gr2jax.apps import rerank

    self._rerank, self.reranker = rerank.rerank, reranker
    self.lines = [json.dumps(b) for b in bodies]
    self._rerank(self.lines[:FLAGS.goal_concurrency], reranker,
                 batch_size=FLAGS.goal_concurrency)  # compiles
    self._rerank(self.lines[:1], reranker, batch_size=1)  # compiles

  def throughput(self) -> dict:
    """Requests / s at batch --goal_concurrency over all the requests, and their validity."""
    start = time.perf_counter()
    rows = self._rerank(self.lines, self.reranker, batch_size=FLAGS.goal_concurrency)
    seconds = time.perf_counter() - start
    return {"batch": FLAGS.goal_concurrency, "requests": len(rows), "seconds": seconds,
            "throughput_rps": len(rows) / seconds,
            "valid_rate": float(np.mean([r.get("kind") == "valid" for r in rows]))}

  def alone_p50_ms(self) -> float:
    """The median time of the first --batch1_requests requests, each re-ranked alone."""
    alone = []
    for line in self.lines[:FLAGS.batch1_requests]:
      start = time.perf_counter()
      self._rerank([line], self.reranker, batch_size=1)
      alone.append(time.perf_counter() - start)
    return percentiles(alone)["p50_ms"]


def wrk_point(server: Server, bodies: list, script_path: str, c: int) -> dict:
  """wrk with c connections for --wrk_s seconds (2 threads), its throughput and latencies."""
  with open(script_path, "w") as f:
    f.write("-- POSTs the benchmark's request bodies in turn (experiments/bench_serve.py)\n"
            "local bodies = {\n")
    f.write(",\n".join("  [[" + json.dumps(b) + "]]" for b in bodies) + "\n}\n")
    f.write('local i = 0\nrequest = function()\n  i = i % #bodies + 1\n  return wrk.format('
            '"POST", "/v1/rerank", {["Content-Type"] = "application/json"}, bodies[i])\nend\n')
  command = ["wrk", f"-t{min(2, c)}", f"-c{c}", f"-d{FLAGS.wrk_s:g}s", "--latency",
             f"--timeout={120}s", "-s", script_path, f"{server.url}/v1/rerank"]
  out = subprocess.run(command, capture_output=True, text=True, timeout=FLAGS.wrk_s + 180)
  result = {"concurrency": c, "seconds": FLAGS.wrk_s,
            "command": " ".join(command[:-3] + ["wrk_post.lua", "http://127.0.0.1:PORT/v1/rerank"])}
  for line in out.stdout.splitlines():
    parts = line.split()
    if line.startswith("Requests/sec:"):
      result["throughput_rps"] = float(parts[1])
    elif len(parts) == 2 and parts[0] in ("50%", "90%", "99%"):
      result[f"p{parts[0][:-1]}_ms"] = _ms(parts[1])
    elif "Non-2xx" in line:
      result["non_2xx"] = int(parts[-1])
    elif line.strip().startswith("Socket errors"):
      result["socket_errors"] = line.strip()
  result.setdefault("non_2xx", 0)
  print(json.dumps({"wrk": result}), flush=True)
  return result


def _ms(text: str) -> float:
  """wrk's '12.34ms' / '1.20s' / '900.00us' in milliseconds."""
  for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3), ("m", 6e4)):
    if text.endswith(unit):
      return float(text[:-len(unit)]) * scale
  return float(text)


def soak(server: Server, bodies: list) -> dict:
  """--soak_concurrency connections for --soak_s seconds: RSS at start and end, errors."""
  rss_start = server.rss_mb()
  out = load_level(server, bodies, FLAGS.soak_concurrency, requests=10 ** 9,
                   seconds=FLAGS.soak_s)
  return {"model": FLAGS.soak_model, "seconds": out["seconds"], "answered": out["answered"],
          "errors": out["errors"], "throughput_rps": out["throughput_rps"],
          "p99_ms": out["p99_ms"], "rss_start_mb": rss_start, "rss_end_mb": server.rss_mb()}


def goal_round(server: Server, base: Offline, bodies: list, script: str) -> dict:
  """Goals 1 and 2, each measurement right after its baseline (the same conditions): the
  offline tool at batch --goal_concurrency, then httpx and wrk at that concurrency; one
  request alone offline, then httpx and wrk at concurrency 1."""
  c = FLAGS.goal_concurrency
  out = {"offline": base.throughput()}
  out["httpx"] = load_level(server, bodies, c, requests=FLAGS.requests, seconds=FLAGS.level_s)
  out["wrk"] = wrk_point(server, bodies[:256], script, c) if FLAGS.wrk else None
  out["alone_p50_ms"] = base.alone_p50_ms()
  out["httpx_c1"] = load_level(server, bodies, 1, requests=FLAGS.requests, seconds=FLAGS.level_s)
  out["wrk_c1"] = wrk_point(server, bodies[:256], script, 1) if FLAGS.wrk else None
  rate = out["offline"]["throughput_rps"]
  out["throughput_vs_offline"] = {"httpx": out["httpx"]["throughput_rps"] / rate,
                                  "wrk": out["wrk"]["throughput_rps"] / rate if FLAGS.wrk
                                  else None}
  out["p50_c1_vs_alone"] = {"httpx": out["httpx_c1"]["p50_ms"] / out["alone_p50_ms"],
                            "wrk": out["wrk_c1"]["p50_ms"] / out["alone_p50_ms"] if FLAGS.wrk
                            else None}
  print(json.dumps({"goal_round": {k: out[k] for k in ("throughput_vs_offline",
                                                       "p50_c1_vs_alone")}}), flush=True)
  return out


def bench_model(model: str, bodies: list, scratch: str, report_dir: str) -> dict:
  """Cold and warm start-up, the load levels, the goal rounds and the soak of one model."""
  from gr2jax import recipe as recipe_lib
  from gr2jax.decoding import reranker as reranker_lib

  recipe = recipe_lib.from_config(FLAGS.config)
  reranker = reranker_lib.load_reranker(os.path.join(FLAGS.workdir, model, "export"),
                                        workdir=FLAGS.workdir,
                                        data_config=recipe_lib.data_config(recipe),
                                        decode=recipe.decode)
  base = Offline(reranker, bodies[:FLAGS.requests])
  cache = os.path.join(scratch, f"jax_cache_{model}")
  cold = Server(model, cache, os.path.join(scratch, f"{model}_cold.log"))
  startup = {"cold_s": cold.start_s, "cold": cold.health["startup"]}
  cold.stop()
  server = Server(model, cache, os.path.join(scratch, f"{model}_warm.log"))
  startup |= {"warm_s": server.start_s, "warm": server.health["startup"]}
  try:
    levels = [load_level(server, bodies, c, requests=FLAGS.requests, seconds=FLAGS.level_s)
              for c in sorted({*map(int, FLAGS.concurrency), FLAGS.goal_concurrency})]
    rounds = [goal_round(server, base, bodies, os.path.join(report_dir, "wrk_post.lua"))
              for _ in range(FLAGS.goal_rounds)]
    soaked = soak(server, bodies) if FLAGS.soak_s and model == FLAGS.soak_model else None
  finally:
    server.stop()
  median = lambda key, client: (None if rounds[0][key][client] is None else
                                float(np.median([r[key][client] for r in rounds])))
  return {"model": model, "kind": server.health["kind"], "name": server.health["model"],
          "startup": startup, "levels": levels, "goal_rounds": rounds, "soak": soaked,
          "goals": {f"{key}_{client}": median(key, client)
                    for key in ("throughput_vs_offline", "p50_c1_vs_alone")
                    for client in ("httpx", "wrk")}}


def overload(model: str, bodies: list, scratch: str) -> dict:
  """Goal 3: a server with --queue_bound at the bound and at twice it."""
  q = FLAGS.queue_bound
  server = Server(model, os.path.join(scratch, f"jax_cache_{model}"),
                  os.path.join(scratch, f"{model}_overload.log"),
                  (f"--config.serve.queue_bound={q}",))
  try:
    at = load_level(server, bodies, q, requests=FLAGS.requests, seconds=FLAGS.level_s,
                    depth_probe=True)
    over = load_level(server, bodies, 2 * q, requests=4 * FLAGS.requests,
                      seconds=FLAGS.level_s, backoff_s=FLAGS.backoff_ms / 1e3, depth_probe=True)
  finally:
    server.stop()
  other = {k: v for k, v in over["statuses"].items() if k not in ("200", "503")}
  return {"model": model, "queue_bound": q, "at_bound": at, "at_twice": over,
          "only_503_beyond": not other and over["max_queue_depth"] <= q,
          "p99_ratio": (over["p99_ms"] / at["p99_ms"]) if at["p99_ms"] else None,
          "in_server_ratio": (over["server_request_ms_mean"] / at["server_request_ms_mean"]
                              if at["server_request_ms_mean"] else None)}


def _f1(value, digits: int = 1) -> str:
  """A table cell: `value` to `digits` decimals, empty for None."""
  return "" if value is None else f"{value:.{digits}f}"


def _save_report(result: dict, lines: list[str], report_dir: str, stem: str) -> None:
  """<stem>.json (the result) and <stem>.md (the lines, also printed) in report_dir."""
  with open(os.path.join(report_dir, f"{stem}.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(report_dir, f"{stem}.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))


def write_report(result: dict, report_dir: str) -> None:
  """bench_serve.json, bench_serve.md and latency_vs_throughput.png."""
  c = FLAGS.goal_concurrency
  lines = ["# Re-ranking server under load (bench_serve)", "", f"Command: `{result['command']}`",
           "", "Load levels (httpx clients, closed loop):", "",
           "| model | C | req/s | p50 ms | p95 ms | p99 ms | in server: queue / decode p50, "
           "mean ms | mean batch | batches per bucket | valid | errors |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
  for m in result["models"]:
    for lv in m["levels"]:
      lines.append(f"| {m['model']} ({m['kind']}) | {lv['concurrency']} | "
                   f"{_f1(lv['throughput_rps'])} | {_f1(lv['p50_ms'])} | {_f1(lv['p95_ms'])} | "
                   f"{_f1(lv['p99_ms'])} | {_f1(lv['server_queue_ms_p50'])} / "
                   f"{_f1(lv['server_decode_ms_p50'])}, {_f1(lv['server_request_ms_mean'])} | "
                   f"{_f1(lv['mean_batch'])} | {json.dumps(lv['batches_per_bucket'])} | "
                   f"{_f1(lv['valid_rate'], 3)} | {lv['errors']} |")
  lines += ["", "Start-up (cold: empty persistent compilation cache; warm: filled):", "",
            "| model | cold s (load / warm-up) | warm s (load / warm-up) | programs | compiles / "
            "cache hits, cold | warm |", "|---|---|---|---|---|---|"]
  for m in result["models"]:
    s, cold, warm = m["startup"], m["startup"]["cold"], m["startup"]["warm"]
    lines.append(f"| {m['model']} | {_f1(s['cold_s'])} ({_f1(cold['load_s'])} / "
                 f"{_f1(cold['warm_s'])}) | {_f1(s['warm_s'])} ({_f1(warm['load_s'])} / "
                 f"{_f1(warm['warm_s'])}) | {warm['programs']} | {cold['compiles']} / "
                 f"{cold['cache_hits']} | {warm['compiles']} / {warm['cache_hits']} |")
  lines += ["", f"Goals 1 and 2, each measurement next to its offline baseline "
            f"({FLAGS.goal_rounds} rounds):", "",
            f"| model | round | offline req/s (batch {c}) | httpx / wrk req/s (C={c}) | ratio "
            "httpx / wrk | alone offline ms | httpx / wrk p50 ms (C=1) | ratio httpx / wrk |",
            "|---|---|---|---|---|---|---|---|"]
  for m in result["models"]:
    for i, r in enumerate(m["goal_rounds"]):
      wrk, wrk1 = r["wrk"] or {}, r["wrk_c1"] or {}
      lines.append(
        f"| {m['model']} | {i} | {_f1(r['offline']['throughput_rps'])} | "
        f"{_f1(r['httpx']['throughput_rps'])} / {_f1(wrk.get('throughput_rps'))} | "
        f"{_f1(r['throughput_vs_offline']['httpx'], 2)} / "
        f"{_f1(r['throughput_vs_offline']['wrk'], 2)} | {_f1(r['alone_p50_ms'])} | "
        f"{_f1(r['httpx_c1']['p50_ms'])} / {_f1(wrk1.get('p50_ms'))} | "
        f"{_f1(r['p50_c1_vs_alone']['httpx'], 2)} / {_f1(r['p50_c1_vs_alone']['wrk'], 2)} |")
  lines += ["", "Medians over the rounds:"]
  for m in result["models"]:
    g = m["goals"]
    lines.append(f"- {m['model']}: throughput at C={c} / offline at batch {c}: "
                 f"{_f1(g['throughput_vs_offline_httpx'], 2)} (httpx), "
                 f"{_f1(g['throughput_vs_offline_wrk'], 2)} (wrk) (goal >= 0.8); p50 at C=1 / one "
                 f"request alone offline: {_f1(g['p50_c1_vs_alone_httpx'], 2)} (httpx), "
                 f"{_f1(g['p50_c1_vs_alone_wrk'], 2)} (wrk) (goal <= 1.2)")
  o = result["overload"]
  lines.append(f"- goal 3, overload ({o['model']}, queue bound {o['queue_bound']}): at the bound "
               f"{json.dumps(o['at_bound']['statuses'])} p99 {_f1(o['at_bound']['p99_ms'])} ms; "
               f"at 2x {json.dumps(o['at_twice']['statuses'])} p99 "
               f"{_f1(o['at_twice']['p99_ms'])} ms, max queue depth "
               f"{o['at_twice']['max_queue_depth']}; only 503s beyond the bound: "
               f"{o['only_503_beyond']}; admitted requests' mean time in the server at 2x / at "
               f"the bound: {_f1(o['in_server_ratio'], 2)}")
  for m in result["models"]:
    if m["soak"]:
      s = m["soak"]
      lines.append(f"- soak ({s['model']}, {FLAGS.soak_concurrency} connections, "
                   f"{s['seconds']:.0f} s): {s['answered']} answered, {s['errors']} errors, "
                   f"{_f1(s['throughput_rps'])} req/s, p99 {_f1(s['p99_ms'])} ms, RSS "
                   f"{s['rss_start_mb']:.0f} -> {s['rss_end_mb']:.0f} MiB")
  _save_report(result, lines, report_dir, "bench_serve")
  plot(result, os.path.join(report_dir, "latency_vs_throughput.png"))


def plot(result: dict, path: str) -> None:
  """p50 (left) and p99 (right) end-to-end latency against throughput, a line per model."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(9, 3.6), sharex=True)
  for ax, key in zip(axes, ("p50_ms", "p99_ms"), strict=True):
    for m in result["models"]:
      levels = [lv for lv in m["levels"] if lv["answered"]]
      points = [(lv["throughput_rps"], lv[key], lv["concurrency"]) for lv in levels]
      ax.plot([p[0] for p in points], [p[1] for p in points], "-o", ms=3,
              label=f"{m['model']} ({m['kind']})")
      for x, y, c in points:
        ax.annotate(str(c), (x, y), fontsize=6, xytext=(2, 2), textcoords="offset points")
    ax.set_yscale("log")
    ax.set_xlabel("throughput (answered requests / s)")
    ax.set_ylabel(f"end-to-end {key[:3]} (ms)")
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7, title="concurrency at each point", title_fontsize=6)
  fig.savefig(path, dpi=120, bbox_inches="tight")
  plt.close(fig)


def reference_rankings(bodies: list) -> dict:
  """AR GR2's ranking of every body (request id -> ranking): the offline tool on the verifier
  export."""
  from gr2jax import recipe as recipe_lib
  from gr2jax.apps import rerank
  from gr2jax.decoding import reranker as reranker_lib

  recipe = recipe_lib.from_config(FLAGS.config)
  reranker = reranker_lib.load_reranker(os.path.join(FLAGS.workdir, FLAGS.verifier, "export"),
                                        workdir=FLAGS.workdir,
                                        data_config=recipe_lib.data_config(recipe),
                                        decode=recipe.decode)
  rows = rerank.rerank([json.dumps(b) for b in bodies], reranker,
                       batch_size=max(FLAGS.config.serve.batch_buckets))
  return {row["id"]: row["ranking"] for row in rows}


def compare_modes(bodies: list, scratch: str) -> dict:
  """--modes: one server per mode, side by side; --mode_rounds rounds over every concurrency
  and mode (interleaved, in serve_modes.round_order); per (mode, C) the median throughput and
  latencies and the answers equal to AR GR2's over all rounds."""
  reference = reference_rankings(bodies)
  pair = (f"--config.serve.verify_with={os.path.join(FLAGS.workdir, FLAGS.verifier, 'export')}",)
  setups = {"ar": (FLAGS.verifier, ()), "lossless": (FLAGS.drafter, pair),
            "auto": (FLAGS.drafter, (*pair, "--config.serve.mode=auto"))}
  servers = {}
  try:
    for mode in FLAGS.modes:
      model, overrides = setups[mode]
      servers[mode] = Server(model, os.path.join(scratch, f"jax_cache_{mode}"),
                             os.path.join(scratch, f"{mode}.log"), overrides)
    runs = [{"round": r, "mode": mode, **load_level(servers[mode], bodies, c,
                                                     requests=FLAGS.requests,
                                                     seconds=FLAGS.level_s, reference=reference)}
            for r in range(FLAGS.mode_rounds) for c in sorted(set(map(int, FLAGS.concurrency)))
            for mode in serve_modes.round_order(FLAGS.modes, r)]
  finally:
    for server in servers.values():
      server.stop()
  levels = []
  for c in sorted(set(map(int, FLAGS.concurrency))):
    for mode in FLAGS.modes:
      mine = [lv for lv in runs if lv["mode"] == mode and lv["concurrency"] == c]
      median = lambda key, mine=mine: (None if any(lv[key] is None for lv in mine)
                                       else float(np.median([lv[key] for lv in mine])))
      decoders = {}
      for lv in mine:
        for name, n in lv["batches_per_decoder"].items():
          decoders[name] = decoders.get(name, 0) + n
      levels.append({"mode": mode, "concurrency": c, "rounds": len(mine),
                     **{k: median(k) for k in ("throughput_rps", "p50_ms", "p95_ms", "p99_ms",
                                               "mean_batch")},
                     **{k: sum(lv[k] for lv in mine) for k in ("answered", "errors",
                                                                "equal_to_reference")},
                     "batches_per_decoder": decoders})
  return {"levels": levels, "runs": runs,
          "servers": {mode: {"kind": s.health["kind"], "mode": s.health["mode"],
                             "decoders": s.health["decoders"],
                             "cost_table": s.health["cost_table"],
                             "startup": s.health["startup"]} for mode, s in servers.items()}}


def write_modes_report(result: dict, report_dir: str) -> None:
  """bench_serve_modes.json and bench_serve_modes.md."""
  lines = ["# Serving modes that answer with AR GR2's rankings (bench_serve --modes)", "",
           f"Command: `{result['command']}`", ""]
  for mode, s in result["servers"].items():
    lines.append(f"- {mode}: {s['kind']} model, serve.mode={s['mode']}, decoder per bucket "
                 f"{json.dumps(s['decoders'])}; start-up {json.dumps(s['startup'])}")
  auto = result["servers"].get("auto")
  if auto:
    table = auto["cost_table"]["seconds"]
    names = list(dict.fromkeys(name for costs in table.values() for name in costs))
    lines += ["", f"auto's cost table (ms per batch; {auto['cost_table']['source']}) and its "
              "choice:", "", "| bucket | " + " | ".join(names) + " | chosen |",
              "|---" * (len(names) + 2) + "|"]
    for bucket, costs in sorted(table.items(), key=lambda kv: int(kv[0])):
      lines.append(f"| {bucket} | " + " | ".join(_f1(1e3 * costs[n]) if n in costs else ""
                                                 for n in names)
                   + f" | {auto['decoders'][bucket]} |")
  lines += ["", f"Load levels (httpx clients, closed loop; medians of {FLAGS.mode_rounds} "
            "rounds, counts summed):", "",
            "| C | mode | req/s | p50 ms | p95 ms | p99 ms | mean batch | batches per decoder | "
            "equal to AR GR2 / answered | errors |", "|---|---|---|---|---|---|---|---|---|---|"]
  for lv in result["levels"]:
    lines.append(f"| {lv['concurrency']} | {lv['mode']} | {_f1(lv['throughput_rps'])} | "
                 f"{_f1(lv['p50_ms'])} | {_f1(lv['p95_ms'])} | {_f1(lv['p99_ms'])} | "
                 f"{_f1(lv['mean_batch'])} | {json.dumps(lv['batches_per_decoder'])} | "
                 f"{lv['equal_to_reference']} / {lv['answered']} | {lv['errors']} |")
  if result["auto_vs_fixed"]:
    lines += ["", "auto against the fixed modes (goals: throughput >= 0.95x the better fixed "
              "mode's, p50 <= 1.05x the lower fixed p50), each ratio taken within a round, "
              "then the median over the rounds (their range in brackets):", "",
              "| C | better fixed | throughput ratio | lower-p50 fixed | p50 ratio |",
              "|---|---|---|---|---|"]
    span = lambda r, key: "[" + ", ".join(_f1(x, 2) for x in r[f"{key}_ratio_range"]) + "]"
    for r in result["auto_vs_fixed"]:
      lines.append(f"| {r['concurrency']} | {r['best_fixed']} | "
                   f"{_f1(r['throughput_ratio'], 2)} {span(r, 'throughput')} | "
                   f"{r['lowest_p50_fixed']} | {_f1(r['p50_ratio'], 2)} {span(r, 'p50')} |")
  _save_report(result, lines, report_dir, "bench_serve_modes")


def main(argv):
  del argv
  if FLAGS.config is None or FLAGS.config.get("stage") != "serve":
    raise app.UsageError("--config must be serve.py[:variant] (with the models' overrides)")
  check_flags()
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop servers and clients (atexit)
  logging.getLogger("httpx").setLevel(logging.WARNING)  # no log line per request
  from gr2jax import recipe as recipe_lib
  from gr2jax.data import pipeline

  report_dir = FLAGS.report_dir or os.path.join(REPO, "runs", "bench_serve",
                                                time.strftime("%Y%m%d-%H%M%S"))
  os.makedirs(report_dir, exist_ok=True)
  scratch = tempfile.mkdtemp(prefix="bench_serve-")
  print(f"server logs and compilation caches: {scratch}", flush=True)
  recipe = recipe_lib.from_config(FLAGS.config)
  summary = pipeline.run(recipe_lib.data_config(recipe), FLAGS.workdir)
  bodies = request_bodies(summary, FLAGS.split, 4 * FLAGS.requests)
  command = " ".join(["python experiments/bench_serve.py",
                      *[a.replace(FLAGS.workdir, "W") for a in sys.argv[1:]
                        if not a.startswith("--report_dir")],
                      f"--report_dir={os.path.relpath(report_dir, REPO)}"
                      if FLAGS.report_dir else ""]).strip()
  if FLAGS.modes:
    result = {"command": command, "split": FLAGS.split, "requests_per_level": FLAGS.requests,
              **compare_modes(bodies, scratch)}
    result["auto_vs_fixed"] = serve_modes.auto_vs_fixed(result["runs"])
    for pool in _POOLS:
      pool.shutdown()
    write_modes_report(result, report_dir)
    return
  models = [bench_model(m, bodies, scratch, report_dir) for m in FLAGS.models]
  result = {"command": command, "split": FLAGS.split, "requests_per_level": FLAGS.requests,
            "level_s": FLAGS.level_s, "models": models,
            "overload": overload(FLAGS.models[-1], bodies, scratch)}
  for pool in _POOLS:
    pool.shutdown()
  write_report(result, report_dir)


if __name__ == "__main__":
  cli.run(main, argv=run_main.resolve_config_arg(sys.argv), flags_parser=run_main.parse_flags)
