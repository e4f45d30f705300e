"""Client-side helpers for a running server: wait for readiness, read its metrics."""

import time

import httpx
from prometheus_client import parser


def wait_ready(url: str, timeout_s: float, process=None) -> dict:
  """Polls `url`/healthz until it answers 200 (every shape compiled) and returns its body.

  Args:
    url: the server's base URL.
    timeout_s: the longest wait.
    process: the server's subprocess.Popen, if any (its exit ends the wait).

  Raises:
    RuntimeError: not ready in time, or the process exited.
  """
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if process is not None and process.poll() is not None:
      raise RuntimeError(f"the server exited with {process.returncode}")
    try:
      r = httpx.get(f"{url}/healthz", timeout=5)
      if r.status_code == 200:
        return r.json()
    except httpx.TransportError:
      pass
    time.sleep(0.1)
  raise RuntimeError(f"{url} not ready in {timeout_s} s")


def scrape(url: str) -> dict:
  """{(sample name, sorted label pairs): value} of `url`/metrics, parsed as Prometheus text."""
  text = httpx.get(f"{url}/metrics", timeout=10).text
  return {(s.name, tuple(sorted(s.labels.items()))): s.value
          for family in parser.text_string_to_metric_families(text) for s in family.samples}
