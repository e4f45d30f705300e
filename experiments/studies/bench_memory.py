r"""Decode steps against the machine's limits, measured in one run: bytes per second vs a copy.

  python experiments/studies/bench_memory.py        # 0.6B shape, P 256 + 2200, fp32 + bf16
  python experiments/studies/bench_memory.py --preset=tiny --prompt_lens=64 --dtypes=float32  # s

At batch 1 a decode step streams every weight and the KV cache once, so its speed limit is the
memory bandwidth. For each dtype, prompt length P and step it times, after a warm-up call:

  ar     one token after a cache of P + 64 slots (`qwen3.forward`, as generate's loop body);
  block  one block of 32 tokens after the same cache (`diffusion.decode.block_forward`, the
         block-diffusion denoising step, logits at all 32 positions);
  generate  a token through the public API: (time of `gr2jax.generate` for 1 + N new tokens
         - time for 1) / N, N = --generate_tokens, greedy, no stop ids, best of --generate_repeats
         each after a warm-up (the prefill cancels; the cache is generate's own, P + 1 + N slots).

Random weights in the decoders' layout (params.layer_list), the cache donated as the decoders do.
bytes = the weights (a tied head's embedding once; an untied model's embedding table only for
the B rows it gathers) + the whole cache buffer (the attention scores every slot) + the f32
logits. Right after each step, in the same process, a numpy copy of --copy_mib MiB gives the copy
rate (bytes read + written / time, best of 3), a jitted [512, 4096] x [4096, 4096] matmul the
matmul rate, and a GEMM at the step's own row count over the model's LM-head weight
([1 or 32, D] x [D, V]: larger than the CPU's caches at 0.6B) the rate XLA reaches at that row
count, so every fraction is a ratio measured side by side:

  frac_copy    (bytes / step time) / copy rate       (the memory roof; 1.0 = at the limit)
  frac_matmul  (FLOPs / step time) / matmul rate     (the compute roof; plan.forward_flops)
  frac_gemm    (FLOPs / step time) / the step-row GEMM's rate

A step with frac_matmul near 1 is compute-bound: no layout of the bytes makes it faster there;
one with frac_gemm near 1 runs as fast as GEMMs of its row count run on this machine.
Prints one JSON line per row and a table; --json_out writes the rows.
"""

import json
import time

import jax
import jax.numpy as jnp
from absl import flags

from experiments import limits, plan
from gr2jax import cli
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.model import generate as generate_lib
from gr2jax.model import params as params_lib
from gr2jax.model import qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import PRESETS, ModelConfig

FLAGS = flags.FLAGS
STEPS = ("ar", "block", "generate")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command-line flags (defined only when run as a script), each value checked when absl
  parses it, before a model is built."""
  f = {"flag_values": flag_values}
  flags.DEFINE_enum("preset", "qwen3_0_6b", PRESETS, "ModelConfig preset.", **f)
  cli.define_list("prompt_lens", [256, 2200], "Prompt lengths P (cache slots P + 64).",
                  cli.integer(1), **f)
  cli.define_list("dtypes", ["float32", "bfloat16"], "Param and compute dtypes.",
                  cli.choice(("float32", "bfloat16")), **f)
  cli.define_list("steps", list(STEPS), "Steps to time: ar (1 token), block (32 tokens), "
                  "generate (the public API).", cli.choice(STEPS), **f)
  flags.DEFINE_integer("generate_tokens", 32, "N of the generate step (module docstring).",
                       lower_bound=1, **f)
  flags.DEFINE_integer("generate_repeats", 2, "Timed generate calls per length after the "
                       "warm-up.", lower_bound=1, **f)
  flags.DEFINE_integer("repeats", 5, "Timed calls per step after the warm-up (the best is "
                       "kept).", lower_bound=1, **f)
  flags.DEFINE_integer("copy_mib", 1024, "Size of the numpy copy of the copy-rate probe.",
                       lower_bound=1, **f)
  flags.DEFINE_string("json_out", None, "Also write all rows to this JSON file.", **f)

BLOCK, NEW_SLOTS = 32, 64


def step_bytes(config: ModelConfig, params: dict, cache, width: int) -> int:
  """Bytes a step must move at least: weights + the cache buffer + f32 logits (module doc)."""
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  if not config.tie_word_embeddings:  # the table itself is only gathered: B rows
    weights -= params["embed"].nbytes - cache.batch * width * params["embed"][0].nbytes
  kv = sum(x.nbytes for x in cache.k + cache.v)
  return int(weights + kv + cache.batch * width * config.vocab_size * 4)


def time_step(config: ModelConfig, params: dict, kind: str, p: int) -> dict:
  """The best of FLAGS.repeats warm calls of one step at batch 1 after a cache of P slots."""
  width = 1 if kind == "ar" else BLOCK
  slots = p + NEW_SLOTS
  if kind == "ar":
    fn = lambda params, cache, tokens: qwen3.forward(params, config, tokens, cache=cache,
                                                     update_cache=True)
  else:
    fn = lambda params, cache, tokens: diffusion_decode.block_forward(params, config, cache,
                                                                      tokens, cache.lengths)
  step = jax.jit(fn, donate_argnums=1)
  cache = init_cache(config, 1, slots)
  tokens = jnp.zeros((1, width), jnp.int32)
  nbytes = step_bytes(config, params, cache, width)
  times = []
  for _ in range(FLAGS.repeats + 1):
    cache = cache.replace(lengths=jnp.full((1,), p, jnp.int32))  # the same P every call
    start = time.perf_counter()
    logits, cache = step(params, cache, tokens)
    logits.block_until_ready()
    times.append(time.perf_counter() - start)
  seconds = min(times[1:])
  flops = plan.forward_flops(config, width, width * slots, width)
  return {"step_s": seconds, "bytes": nbytes, "gbs": nbytes / seconds / 1e9, "flops": flops,
          "gflops": flops / seconds / 1e9}


def time_generate(config: ModelConfig, params: dict, p: int) -> dict:
  """The per-token cost of gr2jax.generate at batch 1 after a P-token prompt (module doc)."""
  prompt = jnp.ones((1, p), jnp.int32)
  n = FLAGS.generate_tokens

  def best(new_tokens):
    times = []
    for _ in range(FLAGS.generate_repeats + 1):
      start = time.perf_counter()
      jax.block_until_ready(generate_lib.generate(  # no stop ids: every call runs all its tokens
        params, config, prompt, None,
        generate_lib.ARDecoding(max_new_tokens=new_tokens, stop_token_ids=())))
      times.append(time.perf_counter() - start)
    return min(times[1:])

  seconds = (best(1 + n) - best(1)) / n
  if seconds <= 0:
    raise RuntimeError(f"bench_memory: generate for {1 + n} tokens was not slower than for 1 "
                       "(timing noise above the decode time): raise --generate_tokens")
  slots = p + 1 + n
  nbytes = step_bytes(config, params, init_cache(config, 1, slots), 1)
  flops = plan.forward_flops(config, 1, slots, 1)
  return {"step_s": seconds, "bytes": nbytes, "gbs": nbytes / seconds / 1e9, "flops": flops,
          "gflops": flops / seconds / 1e9}


def main(argv):
  del argv
  rows = []
  for dtype in FLAGS.dtypes:
    config = ModelConfig.preset(FLAGS.preset, "--preset", param_dtype=dtype,
                                  compute_dtype=dtype)
    params = params_lib.layer_list(
      jax.jit(params_lib.init_params, static_argnums=0)(config, jax.random.key(0)))
    for p in FLAGS.prompt_lens:
      for kind in FLAGS.steps:
        row = {"preset": FLAGS.preset, "dtype": dtype, "prompt": p, "step": kind,
               "device": jax.devices()[0].device_kind,
               **(time_generate(config, params, p) if kind == "generate"
                  else time_step(config, params, kind, p))}
        row["copy_gbs"] = limits.copy_rate_gbs(FLAGS.copy_mib)
        row["matmul_gflops"] = limits.matmul_rate_gflops(dtype)
        row["frac_copy"] = row["gbs"] / row["copy_gbs"]
        row["frac_matmul"] = row["gflops"] / row["matmul_gflops"]
        row["gemm_gflops"] = limits.gemm_rate_gflops(BLOCK if kind == "block" else 1,
                                                     config.hidden_size, config.vocab_size, dtype)
        row["frac_gemm"] = row["gflops"] / row["gemm_gflops"]
        print(json.dumps(row), flush=True)
        rows.append(row)
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(rows, f, indent=1)
  cols = [("dtype", "{}"), ("prompt", "{}"), ("step", "{}"), ("step_s", "{:.3f}"),
          ("bytes", "{:.3g}"), ("gbs", "{:.1f}"), ("copy_gbs", "{:.1f}"), ("frac_copy", "{:.2f}"),
          ("gflops", "{:.1f}"), ("matmul_gflops", "{:.1f}"), ("frac_matmul", "{:.2f}"),
          ("gemm_gflops", "{:.1f}"), ("frac_gemm", "{:.2f}")]
  print("| " + " | ".join(c for c, _ in cols) + " |")
  print("|" + "---|" * len(cols))
  for row in rows:
    print("| " + " | ".join(f.format(row[c]) for c, f in cols) + " |")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
