"""Request batching: a bounded queue in front of one decode worker thread.

The event loop `submit`s requests and awaits their futures; it never touches the devices. The
worker thread owns them: it first runs the warm-up (every compiled shape), then loops: take the
oldest request, wait until `window_s` after its arrival for more requests of the same prompt
length, decode them together in the smallest bucket that holds them, resolve their futures.
The wait ends early once as many requests are queued as are expected: the most requests in
flight (admitted, not answered) at any time in the last PEAK_HORIZON_S, i.e. about the number
of concurrent callers, capped at the largest bucket. So a lone caller never waits for a window,
while concurrent callers are gathered into one batch. Requests that waited past their deadline
are answered with DeadlineExceeded instead of being decoded; requests whose caller gave up (a
cancelled future) are dropped. The queue is bounded by the number of admitted requests not yet
answered: `submit` refuses a request beyond it (Overloaded), so memory stays bounded. `stop`
drains: the worker decodes everything already admitted, without waiting for windows, then exits.
"""

import bisect
import collections
import concurrent.futures
import dataclasses
import logging
import threading
import time
from collections.abc import Callable

PEAK_HORIZON_S = 1.0  # how far back the expected batch (the peak in-flight count) looks


class Overloaded(Exception):
  """The queue is full (the server answers 503 with Retry-After)."""


class NotReady(Exception):
  """The worker is still warming up, or is draining (503)."""


class DeadlineExceeded(Exception):
  """The request waited past its deadline (504)."""


@dataclasses.dataclass
class Item:
  """One admitted request.

  Attributes:
    payload: what the rank function decodes (the engine's reranker.Prepared request).
    length: its prompt-length bucket (requests of one length are decoded together).
    arrival, deadline: time.monotonic() seconds.
    future: resolved with (row, queue_s, decode_s, batch_size) or an exception.
  """

  payload: object
  length: int
  arrival: float
  deadline: float
  future: concurrent.futures.Future


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
  """The smallest batch bucket holding n requests (buckets sorted ascending)."""
  i = bisect.bisect_left(buckets, n)
  if i == len(buckets):
    raise ValueError(f"{n} requests exceed the largest batch bucket {buckets[-1]}")
  return buckets[i]


class Batcher:
  """The queue and its decode worker.

  Args:
    rank: (payloads, bucket, length) -> one row per payload; called on the worker thread only.
    buckets: the compiled batch sizes.
    window_s: how long the oldest queued request waits for others to share its batch.
    queue_bound: the most admitted requests not yet answered.
    on_batch: called on the worker after each decode with (requests, bucket, decode_s, rows).
  """

  def __init__(self, rank: Callable, *, buckets: tuple[int, ...], window_s: float,
               queue_bound: int, on_batch: Callable | None = None):
    self._rank = rank
    self.buckets = tuple(sorted(set(buckets)))
    self.window_s = window_s
    self.queue_bound = queue_bound
    self._on_batch = on_batch
    self._queue: collections.deque[Item] = collections.deque()
    self._cond = threading.Condition()
    self._pending = 0  # admitted, not yet answered (queued or decoding)
    self._peaks = collections.deque()  # (time, in flight) after each admission, last horizon
    self._stopping = False
    self.ready = threading.Event()
    self.warm_error: BaseException | None = None
    self._thread: threading.Thread | None = None

  @property
  def depth(self) -> int:
    """Admitted requests not yet answered."""
    return self._pending

  def start(self, warm: Callable[[], None] = lambda: None) -> None:
    """Starts the worker: `warm()` first (on the worker, which owns the devices), then serving."""
    self._thread = threading.Thread(target=self._run, args=(warm,), name="decode-worker",
                                    daemon=True)
    self._thread.start()

  def submit(self, payloads: list, lengths: list[int], timeout_s: float) -> list:
    """Admits requests, all or none (called on the event loop; never blocks on the devices).

    Returns:
      One concurrent.futures.Future per payload.

    Raises:
      NotReady: warming up or draining.
      Overloaded: admitting them would exceed queue_bound.
    """
    now = time.monotonic()
    with self._cond:
      if not self.ready.is_set() or self._stopping:
        raise NotReady("draining" if self._stopping else "warming up")
      if self._pending + len(payloads) > self.queue_bound:
        raise Overloaded(f"{self._pending} requests in flight; the queue holds "
                         f"{self.queue_bound} (serve.queue_bound)")
      items = [Item(p, n, now, now + timeout_s, concurrent.futures.Future())
               for p, n in zip(payloads, lengths, strict=True)]
      self._queue.extend(items)
      self._pending += len(items)
      self._peaks.append((now, self._pending))
      self._cond.notify()
    return [item.future for item in items]

  def stop(self, timeout_s: float | None = None) -> None:
    """Drains what was admitted, then stops the worker."""
    with self._cond:
      self._stopping = True
      self._cond.notify()
    if self._thread is not None:
      self._thread.join(timeout_s)

  def _expected(self, now: float) -> int:
    """The most requests in flight at once in the last PEAK_HORIZON_S (at least 1)."""
    while self._peaks and self._peaks[0][0] < now - PEAK_HORIZON_S:
      self._peaks.popleft()
    return max((n for _, n in self._peaks), default=1)

  def _take(self) -> list[Item] | None:
    """The next batch: the oldest request and up to the largest bucket of its length, once its
    window has passed or the expected number is queued; None once stopped and drained."""
    largest = self.buckets[-1]
    with self._cond:
      while not self._queue:
        if self._stopping:
          return None
        self._cond.wait()
      first = self._queue[0]
      while not self._stopping:
        same = sum(item.length == first.length for item in self._queue)
        now = time.monotonic()
        remaining = first.arrival + self.window_s - now
        if same >= min(largest, self._expected(now)) or remaining <= 0:
          break
        self._cond.wait(remaining)
      batch = [item for item in self._queue if item.length == first.length][:largest]
      taken = {id(item) for item in batch}
      self._queue = collections.deque(i for i in self._queue if id(i) not in taken)
      return batch

  def _answer(self, items: list[Item], results: list) -> None:
    for item, result in zip(items, results, strict=True):
      if isinstance(result, BaseException):
        item.future.set_exception(result)
      else:
        item.future.set_result(result)
    with self._cond:
      self._pending -= len(items)

  def _run(self, warm: Callable[[], None]) -> None:
    try:
      warm()
    except BaseException as e:  # the server reports it and exits; nothing is served
      logging.exception("warm-up failed")
      self.warm_error = e
      return
    self.ready.set()
    while (batch := self._take()) is not None:
      now = time.monotonic()
      live = []
      for item in batch:
        if not item.future.set_running_or_notify_cancel():  # its caller gave up
          with self._cond:
            self._pending -= 1
        elif now > item.deadline:
          self._answer([item], [DeadlineExceeded(
            f"waited {1e3 * (now - item.arrival):.0f} ms, past its deadline")])
        else:
          live.append(item)
      if not live:
        continue
      bucket = bucket_for(len(live), self.buckets)
      start = time.monotonic()
      try:
        rows = self._rank([item.payload for item in live], bucket, live[0].length)
      except Exception as e:  # a decode failure fails its batch, never the worker
        logging.exception("decode failed")
        self._answer(live, [e] * len(live))
        continue
      decode_s = time.monotonic() - start
      if self._on_batch is not None:
        self._on_batch(len(live), bucket, decode_s, rows)
      self._answer(live, [(row, start - item.arrival, decode_s, len(live))
                          for item, row in zip(live, rows, strict=True)])
