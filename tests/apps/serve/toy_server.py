"""A toy re-ranking server for the tests: test_rerank.py's tiny random model and toy tokenizer
behind the real application, in a thread or (`python -m tests.apps.serve.toy_server`) a process.

Shapes are test_rerank.py's (batch 4, prompt width 96, 16 new tokens), so a test session
compiles them once for both.
"""

import argparse
import json
import threading

from gr2jax import recipes
from gr2jax.apps.serve import engine as engine_lib
from gr2jax.apps.serve import server
from gr2jax.apps.serve import spec as spec_lib
from gr2jax.apps.serve.client import wait_ready
from gr2jax.data import tokenizer as tokenizer_lib

PROMPT_LEN = 96


def settings(**overrides) -> spec_lib.ServeSpec:
  """The serve block's defaults on a free loopback port, with overrides."""
  block = recipes.config("", "serve").serve
  block.update(dict(port=0, batch_buckets=(4,), window_ms=2.0, queue_bound=64, timeout_s=20.0))
  block.update(overrides)
  return spec_lib.ServeSpec.of(block, "serve.")


def toy_engine(tok_dir: str, diffusion: bool = False) -> engine_lib.Engine:
  """The engine of test_rerank.py's tiny model over the toy tokenizer saved in tok_dir."""
  from tests.apps.test_rerank import _reranker

  reranker = _reranker(tokenizer_lib.load_tokenizer(tok_dir), diffusion)
  return engine_lib.Engine(reranker, prompt_lengths=(PROMPT_LEN,), name="toy")


class Gated:
  """An engine whose decodes first wait for `gate` (at most hold_s): requests stay in flight
  until the test opens it."""

  def __init__(self, engine: engine_lib.Engine, gate: threading.Event, hold_s: float = 60.0):
    self._engine, self.gate, self.hold_s = engine, gate, hold_s

  def __getattr__(self, name):
    return getattr(self._engine, name)

  def rank(self, *args):
    self.gate.wait(self.hold_s)
    return self._engine.rank(*args)


class ThreadServer:
  """The application on a free loopback port, served by uvicorn in a thread."""

  def __init__(self, engine: engine_lib.Engine, s: spec_lib.ServeSpec):
    self.server = server.make_server(engine, s)
    self.app = self.server.config.app
    sock = server.bind("127.0.0.1", 0)
    self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    self._thread = threading.Thread(target=self.server.run, kwargs=dict(sockets=[sock]),
                                    daemon=True)
    self._thread.start()
    self.health = wait_ready(self.url, 120)

  def close(self):
    self.server.should_exit = True
    self._thread.join(30)


def main():
  """Serves the toy model until SIGTERM: --tok=DIR --settings=JSON of serve block overrides
  --hold_s=S (each decode waits S seconds first)."""
  parser = argparse.ArgumentParser()
  parser.add_argument("--tok", required=True)
  parser.add_argument("--settings", default="{}")
  parser.add_argument("--hold_s", type=float, default=0.0)
  args = parser.parse_args()
  engine = Gated(toy_engine(args.tok), threading.Event(), args.hold_s)
  server.serve(engine, settings(**json.loads(args.settings)))


if __name__ == "__main__":
  main()
