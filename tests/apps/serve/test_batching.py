"""The batcher (gr2jax/apps/serve/batching.py) with a recording rank function: windows, smallest
buckets, the queue bound, deadlines, cancelled callers, failures and the drain."""

import threading
import time

import pytest

from gr2jax.apps.serve import batching


class Recorder:
  """A rank function that records its calls and echoes its payloads."""

  def __init__(self, fail=False, gate=None):
    self.calls, self.fail, self.gate = [], fail, gate
    self.entered = threading.Event()

  def __call__(self, payloads, bucket, length):
    self.entered.set()
    if self.gate is not None:
      self.gate.wait(10)
    self.calls.append((list(payloads), bucket, length))
    if self.fail:
      raise RuntimeError("decode broke")
    return [{"echo": p} for p in payloads]


def _started(rank, warm=lambda: None, **kwargs) -> batching.Batcher:
  options = dict(buckets=(1, 2, 4, 8), window_s=0.2, queue_bound=16) | kwargs
  b = batching.Batcher(rank, **options)
  b.start(warm)
  assert b.ready.wait(10)
  return b


def test_bucket_for_is_the_smallest_that_holds():
  assert [batching.bucket_for(n, (1, 2, 4, 8)) for n in (1, 2, 3, 5, 8)] == [1, 2, 4, 8, 8]
  with pytest.raises(ValueError, match="largest batch bucket 8"):
    batching.bucket_for(9, (1, 2, 4, 8))


def test_requests_within_the_window_share_the_smallest_bucket():
  rank = Recorder()
  b = _started(rank, window_s=1.0)
  futures = b.submit(["a", "b", "c"], [96, 96, 96], timeout_s=10)
  results = [f.result(10) for f in futures]
  assert rank.calls == [(["a", "b", "c"], 4, 96)]
  row, queue_s, decode_s, size = results[0]
  assert row == {"echo": "a"} and size == 3 and queue_s >= 0 and decode_s >= 0
  # 3 were in flight at once: the next request waits (within the window) for 2 more
  first = b.submit(["d"], [96], timeout_s=10)
  time.sleep(0.05)
  later = b.submit(["e", "f"], [96, 96], timeout_s=10)
  [f.result(10) for f in first + later]
  assert rank.calls[1] == (["d", "e", "f"], 4, 96)
  assert b.depth == 0
  b.stop()


def test_a_lone_caller_does_not_wait_for_the_window():
  rank = Recorder()
  b = _started(rank, window_s=30)
  start = time.monotonic()
  for name in "abc":
    [future] = b.submit([name], [96], timeout_s=60)
    assert future.result(10)[0] == {"echo": name}
  assert time.monotonic() - start < 10
  assert [c[1] for c in rank.calls] == [1, 1, 1]
  b.stop()


def test_a_full_largest_bucket_does_not_wait_for_the_window():
  rank = Recorder()
  b = _started(rank, buckets=(1, 2), window_s=30)
  start = time.monotonic()
  futures = b.submit(list("abcde"), [96] * 5, timeout_s=60)
  [f.result(10) for f in futures[:4]]
  assert time.monotonic() - start < 10
  assert [c[1] for c in rank.calls[:2]] == [2, 2]
  b.stop()  # the fifth waits for no window once draining
  assert futures[4].result(0)[0] == {"echo": "e"}


def test_prompt_lengths_decode_apart():
  rank = Recorder()
  b = _started(rank)
  futures = b.submit(["a", "b", "c"], [64, 96, 64], timeout_s=10)
  [f.result(10) for f in futures]
  assert sorted(rank.calls) == [(["a", "c"], 2, 64), (["b"], 1, 96)]
  b.stop()


def test_queue_bound_refuses_all_or_none_and_admitted_are_answered():
  gate = threading.Event()
  rank = Recorder(gate=gate)
  b = _started(rank, queue_bound=3, window_s=0)
  admitted = b.submit(["a", "b"], [96, 96], timeout_s=10)
  with pytest.raises(batching.Overloaded, match="queue holds 3"):
    b.submit(["c", "d"], [96, 96], timeout_s=10)
  admitted += b.submit(["c"], [96], timeout_s=10)
  with pytest.raises(batching.Overloaded):
    b.submit(["d"], [96], timeout_s=10)
  gate.set()
  assert [f.result(10)[0]["echo"] for f in admitted] == ["a", "b", "c"]
  assert b.depth == 0
  b.stop()


def test_past_the_deadline_is_answered_not_decoded():
  gate = threading.Event()
  rank = Recorder(gate=gate)
  b = _started(rank, window_s=0)
  [busy] = b.submit(["busy"], [96], timeout_s=10)  # holds the worker until the gate opens
  assert rank.entered.wait(10)
  [late] = b.submit(["late"], [96], timeout_s=0.05)
  time.sleep(0.1)
  gate.set()
  with pytest.raises(batching.DeadlineExceeded, match="past its deadline"):
    late.result(10)
  assert busy.result(10)[0] == {"echo": "busy"}
  assert [c[0] for c in rank.calls] == [["busy"]] and b.depth == 0
  b.stop()


def test_a_cancelled_caller_is_dropped():
  rank = Recorder()
  b = _started(rank, window_s=0.3)
  gone, kept, _ = b.submit(["gone", "kept", "x"], [96, 96, 64], timeout_s=10)
  assert gone.cancel()
  assert kept.result(10)[0] == {"echo": "kept"}
  assert (["kept"], 1, 96) in rank.calls and b.depth == 0
  b.stop()


def test_a_failed_decode_fails_its_batch_and_the_worker_goes_on():
  rank = Recorder(fail=True)
  b = _started(rank, window_s=0)
  [future] = b.submit(["x"], [96], timeout_s=10)
  with pytest.raises(RuntimeError, match="decode broke"):
    future.result(10)
  rank.fail = False
  [future] = b.submit(["y"], [96], timeout_s=10)
  assert future.result(10)[0] == {"echo": "y"}
  b.stop()


def test_not_ready_until_warm_and_stop_drains():
  warmed = threading.Event()
  b = batching.Batcher(Recorder(), buckets=(1, 2, 4, 8), window_s=5, queue_bound=16)
  b.start(lambda: warmed.wait(10))
  with pytest.raises(batching.NotReady, match="warming up"):
    b.submit(["a"], [96], timeout_s=10)
  warmed.set()
  assert b.ready.wait(10)
  futures = b.submit(["a", "b"], [96, 96], timeout_s=30)
  b.stop()  # drains without waiting out the 5 s window
  assert [f.result(0)[0]["echo"] for f in futures] == ["a", "b"]
  with pytest.raises(batching.NotReady, match="draining"):
    b.submit(["c"], [96], timeout_s=10)


def test_a_failed_warm_up_serves_nothing():
  def broken():
    raise RuntimeError("no devices")

  b = batching.Batcher(Recorder(), buckets=(1,), window_s=0, queue_bound=4)
  b.start(broken)
  b.stop()
  assert isinstance(b.warm_error, RuntimeError) and not b.ready.is_set()
