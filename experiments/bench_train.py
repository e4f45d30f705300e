r"""Train-step benchmark: tokens/s of the one train step, compile time, micro-batch scaling, MFU.

CPU (default: tiny + small, fp32, SFT):
  python experiments/bench_train.py --json_out=docs/benchmarks/bench_train.json
GPU (random bf16 weights at qwen3_8b shapes, MFU against the chip's peak):
  python experiments/bench_train.py --presets=qwen3_8b --dtype=bfloat16 --remat=full \
      --batch_size=8 --seq_len=2048 --micro_batches=1,2 --peak_tflops=989

Each row: a fresh TrainState (random params, AdamW), the jitted step of gr2jax/train/step.py on
random rows (half prompt, half weighted response), compile time (lower + compile) separately,
then the median of --steps timed steps. FLOPs per step are analytic (6 x matmul params x tokens +
the attention's 12 x L x B x T^2 x N x H for forward + backward, the LM head on the response
half only); MFU = FLOPs / step time / peak.
Prints one JSON line per row and a table at the end.
"""

import dataclasses
import functools
import json
import os
import sys
import time

import jax
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax.model import params as params_lib  # noqa: E402
from gr2jax.model.config import ModelConfig  # noqa: E402
from gr2jax.train import mesh as mesh_lib  # noqa: E402
from gr2jax.train import optim, sft  # noqa: E402
from gr2jax.train import state as state_lib
from gr2jax.train import step as step_lib

FLAGS = flags.FLAGS
flags.DEFINE_list("presets", ["tiny", "small"], "ModelConfig presets.")
flags.DEFINE_integer("vocab_size", 3072, "Vocab of the tiny/small presets (the project's BPE).")
flags.DEFINE_integer("batch_size", 16, "Rows per step.")
flags.DEFINE_integer("seq_len", 384, "Tokens per row (tiny default prompt + response ~ 340).")
flags.DEFINE_list("micro_batches", ["1", "2", "4"], "Micro-batch counts to time.")
flags.DEFINE_integer("steps", 5, "Timed steps per row (after the compiling one).")
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "param and compute dtype.")
flags.DEFINE_enum("remat", "none", ["none", "full"], "Layer rematerialisation.")
flags.DEFINE_float("peak_tflops", None, "Peak dense TFLOP/s of one device for MFU (H100 989).")
flags.DEFINE_string("json_out", None, "Also write all rows to this JSON file.")


def step_flops(config: ModelConfig, batch: int, seq: int) -> float:
  """Forward + backward FLOPs of one step: 6 x matmul params x tokens + attention scores/values."""
  d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
  nh, kv, h = config.num_heads, config.num_kv_heads, config.head_dim
  per_layer = d * nh * h * 2 + d * kv * h * 2 + 3 * d * f  # q, o, k, v, gate/up/down
  attention = 2 * 2 * layers * seq * seq * nh * h  # QK^T and PV, forward, per row
  head = d * config.vocab_size * (seq - seq // 2)  # the LM head on the response half
  return 6.0 * (layers * per_layer * seq + head) * batch + 3.0 * attention * batch


def bench(preset: str, micro_batches: int) -> dict:
  overrides = {} if preset.startswith("qwen3") else {"vocab_size": FLAGS.vocab_size}
  config = dataclasses.replace(getattr(ModelConfig, preset)(**overrides),
                               param_dtype=FLAGS.dtype, compute_dtype=FLAGS.dtype,
                               remat=FLAGS.remat, attention_chunk_bytes=8 << 20)
  mesh = mesh_lib.make_mesh()
  ocfg = dict(learning_rate=1e-4, warmup_steps=1, total_steps=100, schedule="constant",
              end_lr_factor=0.1, b1=0.9, b2=0.98, eps=1e-8, weight_decay=0.0, clip_norm=1.0)
  optimizer = optim.make_optimizer(type("C", (), ocfg))
  abstract = state_lib.abstract_state(params_lib.abstract_params(config), optimizer)
  shardings = state_lib.state_shardings(config, abstract, mesh)
  init = jax.jit(lambda k: state_lib.create_state(params_lib.init_params(config, k), optimizer, 0),
                 out_shardings=shardings)
  state = init(jax.random.key(0))
  b, t = FLAGS.batch_size, FLAGS.seq_len
  rng = np.random.default_rng(0)
  tokens = rng.integers(0, config.vocab_size, (b, t)).astype(np.int32)
  p = t // 2  # half prompt, half response (the LM head runs on the response only)
  batch = {"tokens": tokens, "positions": np.broadcast_to(np.arange(t), (b, t)).astype(np.int32),
           "prompt_lengths": np.full((b,), p, np.int32), "response_tokens": tokens[:, p:],
           "response_weights": np.ones((b, t - p), np.float32)}
  with jax.set_mesh(mesh):
    train_step = step_lib.make_train_step(
      functools.partial(sft.sft_loss, config=config), optimizer, micro_batches=micro_batches,
      state_shardings=shardings, batch_sharding=mesh_lib.batch_sharding(mesh))
    t0 = time.perf_counter()
    compiled = train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    state, m = compiled(state, batch)
    jax.block_until_ready(m["loss"])
    times = []
    for _ in range(FLAGS.steps):
      t0 = time.perf_counter()
      state, m = compiled(state, batch)
      jax.block_until_ready(m["loss"])
      times.append(time.perf_counter() - t0)
  step_s = float(np.median(times))
  flops = step_flops(config, b, t)
  row = {"preset": preset, "params": params_lib.param_count(config), "batch": b, "seq": t,
         "micro_batches": micro_batches, "dtype": FLAGS.dtype, "remat": FLAGS.remat,
         "devices": len(jax.devices()), "backend": jax.default_backend(),
         "compile_s": round(compile_s, 2), "step_s": round(step_s, 4),
         "tokens_per_s": round(b * t / step_s, 1), "tflops_per_s": round(flops / step_s / 1e12, 3)}
  if FLAGS.peak_tflops:
    row["mfu"] = round(flops / step_s / 1e12 / FLAGS.peak_tflops / len(jax.devices()), 4)
  return row


def main(argv):
  del argv
  rows = []
  for preset in FLAGS.presets:
    for mb in FLAGS.micro_batches:
      row = bench(preset, int(mb))
      print(json.dumps(row), flush=True)
      rows.append(row)
  cols = ["preset", "params", "batch", "seq", "micro_batches", "compile_s", "step_s",
          "tokens_per_s", "tflops_per_s"] + (["mfu"] if FLAGS.peak_tflops else [])
  print("| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
  for row in rows:
    print("| " + " | ".join(str(row[c]) for c in cols) + " |")
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(rows, f, indent=1)


if __name__ == "__main__":
  app.run(main)
