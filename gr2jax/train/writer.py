"""Metrics: TensorBoard event files (tensorboardX, no TensorFlow), a JSONL log, a progress bar.

Only process 0 writes. `MetricsWriter.write(step, metrics)` appends one JSON line
`{"step": s, "time": t, **metrics}` to `metrics.jsonl` and one TensorBoard scalar per metric;
`write_text` logs the resolved config and the devices at the start of a run. Progress bars:
gr2jax/progress.py.
"""

import json
import os
import time

import jax
import numpy as np
import tensorboardX


def _scalar(v):
  v = np.asarray(jax.device_get(v))
  return float(v) if v.size == 1 else v.tolist()


class MetricsWriter:
  """Writes under `logdir` (created): metrics.jsonl and TensorBoard events."""

  def __init__(self, logdir: str):
    self.active = jax.process_index() == 0
    self.logdir = logdir
    if self.active:
      os.makedirs(logdir, exist_ok=True)
      self._tb = tensorboardX.SummaryWriter(logdir)
      self._jsonl = open(os.path.join(logdir, "metrics.jsonl"), "a")

  def write(self, step: int, metrics: dict, prefix: str = "") -> None:
    if not self.active:
      return
    row = {f"{prefix}{k}": _scalar(v) for k, v in metrics.items()}
    self._jsonl.write(json.dumps({"step": int(step), "time": time.time(), **row}) + "\n")
    self._jsonl.flush()
    for k, v in row.items():
      if isinstance(v, float):
        self._tb.add_scalar(k, v, int(step))
    self._tb.flush()

  def write_text(self, tag: str, text: str) -> None:
    if self.active:
      self._tb.add_text(tag, f"```\n{text}\n```", 0)
      with open(os.path.join(self.logdir, f"{tag}.txt"), "w") as f:
        f.write(text)

  def close(self) -> None:
    if self.active:
      self._tb.close()
      self._jsonl.close()
