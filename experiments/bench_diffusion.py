r"""Block diffusion vs AR decoding: per-step costs, end-to-end tokens/s and NFE, speed-up sweeps.

  python experiments/bench_diffusion.py --out_dir=bench_out        # CPU, tiny random model
  python experiments/bench_diffusion.py --ckpt=CKPT --out_dir=...  # a trained diffusion
  python experiments/bench_diffusion.py --preset=qwen3_8b --param_dtype=bfloat16 \
      --sections=steps --out_dir=...                                     # GPU box: per-step costs

Sections (--sections, comma-separated):
  steps   cost of one block forward (B queries against the cache) relative to a one-token AR step,
          for each B in --step_block_sizes and batch in --batch_sizes, with each cheap lever on
          and off: LM head at all B queries vs only B/2 (a typical masked count) vs 1 (a commit
          forward); cache sized to prompt + output vs --naive_cache_len slots.
  e2e     AR (block_diffusion_generate with B=1, which equals AR greedy decoding) vs block
          diffusion (B=--block_size) at each tau in --thresholds, batch in --batch_sizes: output
          tokens/s (prefill included, warm jit), NFE per output token, batched forwards, and the
          LM-head-bucket lever (--head_buckets) at the first tau.
  sweep   speed-up of diffusion at --sweep_threshold over AR vs output length (--output_lens at
          --prompt_len) and vs prompt length (--prompt_lens at --max_new_tokens), batch 1.
Compile time (first call minus a warm call) is reported apart from every timing.

On random weights almost no proposal reaches tau, so diffusion commits ~1 token per step; its
speed-up must be measured on a trained checkpoint (--ckpt). Random-weight runs report the per-step
cost ratio, which bounds the speed-up: speed-up ~= (tokens per forward) / (cost ratio).
--forced_tokens_per_step=TAU:K,... emulates a trained model's schedule on random weights: the e2e
run at TAU caps each block at ceil((B - 1) / K) denoising steps (the decoder's own step cap, whose
last step commits every remaining mask), so a block takes exactly the forwards of K tokens per
step; the forwards cost the same whatever they commit (the LM head runs at all B queries with
--head_buckets=1), so the timing is that of a model committing K tokens per step.
Outputs: OUT/bench_diffusion.json, OUT/bench_diffusion.md (tables) and PNG plots.
"""

import dataclasses
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from experiments.bench_gpu_check import FORCED  # tau:K, checked as the GPU check does
from gr2jax import cli, load
from gr2jax.diffusion import decode
from gr2jax.model import qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params

FLAGS = flags.FLAGS
flags.DEFINE_string("out_dir", "bench_diffusion_out", "Where the JSON, table and plots go.")
flags.DEFINE_string("ckpt", None, "A diffusion gr2jax checkpoint (default: random weights).")
flags.DEFINE_enum("preset", "tiny", ["tiny", "small", "qwen3_0_6b", "qwen3_8b"],
                  "Model preset (random weights; unused with --ckpt).")
flags.DEFINE_enum("param_dtype", "float32", ["float32", "bfloat16"], "Random weights: dtype.")
SECTIONS = ("steps", "e2e", "sweep")
TAU = cli.number(0, 1, low_open=True)
cli.define_list("sections", list(SECTIONS), "Which parts to run.", cli.choice(SECTIONS))
cli.define_list("batch_sizes", [1, 8], "Batch sizes.", cli.integer(1))
cli.define_list("thresholds", [1.0, 0.9, 0.7, 0.6, 0.4], "Commit thresholds tau.", TAU)
flags.DEFINE_integer("block_size", 32, "Diffusion block size B.", lower_bound=1)
cli.define_list("step_block_sizes", [4, 8, 16, 32], "B values of the step section.",
                cli.integer(1))
flags.DEFINE_integer("prompt_len", 512, "Prompt length (e2e, output-length sweep, steps).",
                     lower_bound=1)
flags.DEFINE_integer("max_new_tokens", 128, "Output length (e2e, prompt-length sweep, steps).",
                     lower_bound=1)
flags.DEFINE_integer("max_steps_per_block", 64, "Denoising-step cap per block (paper: 64).",
                     lower_bound=1)
flags.DEFINE_integer("naive_cache_len", 2048, "Cache slots of the lever-off step measurement.",
                     lower_bound=1)
flags.DEFINE_integer("head_buckets", 4, "LM-head buckets of the lever-on e2e run (1 = no "
                     "lever-on run).", lower_bound=1)
cli.define_list("forced_tokens_per_step", [], "TAU:K pairs: at TAU, cap each block at "
                "ceil((B - 1) / K) denoising steps (module docstring; e.g. 0.9:3,0.6:4,0.4:5).",
                FORCED, allow_empty=True)
cli.define("sweep_threshold", 0.9, "tau of the sweeps.", TAU)
cli.define_list("output_lens", [32, 64, 128, 256, 512], "Output-length sweep.", cli.integer(1))
cli.define_list("prompt_lens", [32, 128, 512, 1024, 2048], "Prompt-length sweep.",
                cli.integer(1))
flags.DEFINE_integer("repeats", 3, "Timed repeats (fastest kept) after the warm-up call.",
                     lower_bound=1)
flags.DEFINE_integer("step_repeats", 20, "Timed repeats of each per-step measurement.",
                     lower_bound=1)
flags.DEFINE_integer("seed", 0, "Seed of the random weights and prompts.")


def _model():
  """(config, params, description) from --ckpt or random weights of --preset."""
  if FLAGS.ckpt:
    config, params = load.load_model(FLAGS.ckpt)
    if config.mask_token_id is None:
      raise app.UsageError(f"--ckpt={FLAGS.ckpt} has no mask_token_id: convert it with "
                           "weights_conversion/ar_to_diffusion.py first")
    return config, params, f"checkpoint {FLAGS.ckpt}"
  config = ModelConfig.preset(FLAGS.preset, "--preset", param_dtype=FLAGS.param_dtype,
                              compute_dtype=FLAGS.param_dtype)
  config = dataclasses.replace(config, mask_token_id=config.vocab_size - 1)
  params = init_params(config, jax.random.key(FLAGS.seed))
  return config, params, f"random {FLAGS.preset} ({FLAGS.param_dtype})"


def _prompts(config, batch, length):
  """Random prompts [batch, length] of full length (no stop tokens, no mask token)."""
  rng = np.random.default_rng(FLAGS.seed)
  tokens = rng.integers(1, config.vocab_size - 1, (batch, length)).astype(np.int32)
  return jnp.asarray(tokens), jnp.full((batch,), length, jnp.int32)


def _timed(fn, repeats):
  """(first-call seconds, fastest warm seconds, last result) of fn().

  The minimum, not the median, of the warm calls: the CPU machines are shared, and interference
  only ever adds time.
  """
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  first = time.perf_counter() - t0
  times = []
  for _ in range(repeats):
    t0 = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - t0)
  return first, min(times), out


def _compile_s(first, warm):
  """First call minus a warm call (0 when an earlier section compiled the same shapes)."""
  return max(first - warm, 0.0)


# ---- steps ------------------------------------------------------------------------------------


def _step_loop(params, config, cache, lengths, width, heads, n):
  """n block forwards of `width` tokens in one jitted fori_loop, as the decoder runs them.

  The cache is carried (written in place, lengths kept, like a denoising step) and the canvas
  changes every iteration so no part of the forward is loop-invariant.
  """
  batch = lengths.shape[0]
  at = None
  if heads != width:
    at = jnp.broadcast_to(jnp.arange(heads, dtype=jnp.int32), (batch, heads))

  def body(i, carry):
    cache, acc = carry
    canvas = (jnp.arange(width, dtype=jnp.int32)[None, :] + i) % (config.vocab_size - 1)
    canvas = jnp.broadcast_to(canvas, (batch, width))
    logits, new = decode.block_forward(params, config, cache, canvas, lengths, at)
    return new.replace(lengths=cache.lengths), acc + logits[:, 0, 0]

  return jax.lax.fori_loop(0, n, body, (cache, jnp.zeros((batch,), jnp.float32)))[1]


_step_loop_jit = jax.jit(_step_loop, static_argnums=(1, 4, 5, 6))


def step_costs(config, params):
  """Per-step cost of a block forward vs a one-token step, levers on / off."""
  rows = []
  p, m, n = FLAGS.prompt_len, FLAGS.max_new_tokens, FLAGS.step_repeats
  widest = max(FLAGS.step_block_sizes)
  for batch in FLAGS.batch_sizes:
    tokens, lengths = _prompts(config, batch, p)
    caches = {}
    for label, size in (("sized", p + m + widest), ("naive", max(FLAGS.naive_cache_len,
                                                                  p + m + widest))):
      cache = init_cache(config, batch, size)
      _, caches[label] = jax.jit(qwen3.ragged_prefill, static_argnums=1)(
          params, config, tokens, lengths, cache)

    def measure(cache, width, heads, lengths=lengths):
      fn = lambda: _step_loop_jit(params, config, cache, lengths, width, heads, n)
      first, warm, _ = _timed(fn, FLAGS.repeats)
      return _compile_s(first, warm), warm / n

    for cache_label, cache in caches.items():
      for b in FLAGS.step_block_sizes:
        for head_label, heads in (("all", b), ("half", max(1, b // 2)), ("one", 1)):
          compile_1, one = measure(cache, 1, 1)  # re-measured next to each block measurement
          compile_b, cost = measure(cache, b, heads)
          rows.append(dict(batch=batch, cache=cache_label, cache_len=cache.max_len, block=b,
                           lm_head=head_label, one_token_ms=1e3 * one, block_ms=1e3 * cost,
                           ratio=cost / one, compile_s=compile_b, compile_one_s=compile_1))
          print(f"[steps] batch {batch} cache {cache_label}({cache.max_len}) B={b} head "
                f"{head_label}: {1e3 * cost:.2f} ms vs 1-tok {1e3 * one:.2f} ms -> "
                f"ratio {cost / one:.2f}", flush=True)
  return rows


# ---- end to end -------------------------------------------------------------------------------


def forced_steps(block_size: int) -> dict[float, tuple[int, int]]:
  """--forced_tokens_per_step as {tau: (K, the per-block step cap that emulates it)}."""
  out = {}
  for tau, k in FLAGS.forced_tokens_per_step:
    out[tau] = k, max(1, -(-(block_size - 1) // k))
  return out


def _run(config, params, batch, prompt_len, max_new, block_size, tau, head_buckets=1,
         max_steps=None):
  tokens, lengths = _prompts(config, batch, prompt_len)
  config = dataclasses.replace(config, block_size=block_size)  # B comes from the model config
  max_steps = FLAGS.max_steps_per_block if max_steps is None else max_steps
  decoding = decode.BlockDecoding(
    threshold=tau, max_steps_per_block=max_steps, max_new_tokens=max_new,
    stop_token_ids=() if not FLAGS.ckpt else None, head_buckets=head_buckets)
  fn = lambda: decode.block_diffusion_generate(params, config, tokens, lengths, decoding)
  first, warm, out = _timed(fn, FLAGS.repeats)
  generated = int(jnp.sum(out.lengths))
  return dict(batch=batch, prompt_len=prompt_len, max_new=max_new, block=block_size, tau=tau,
              head_buckets=head_buckets, max_steps_per_block=max_steps, seconds=warm,
              compile_s=_compile_s(first, warm),
              tokens_per_s=generated / warm,
              nfe_per_token=float(jnp.sum(out.nfe)) / generated,
              denoise_steps_per_token=float(jnp.sum(out.denoise_steps)) / generated,
              forwards=int(out.num_forwards), tokens_per_forward=generated / batch
              / max(int(out.num_forwards) - 1, 1))


def end_to_end(config, params):
  rows = []
  p, m, b = FLAGS.prompt_len, FLAGS.max_new_tokens, FLAGS.block_size
  taus = list(FLAGS.thresholds)
  forced = forced_steps(b)
  for batch in FLAGS.batch_sizes:
    ar = _run(config, params, batch, p, m, 1, 1.0)
    rows.append(dict(ar, method="AR"))
    print(f"[e2e] batch {batch} AR: {ar['tokens_per_s']:.1f} tok/s", flush=True)
    for tau in taus:
      k, cap = forced.get(tau, (None, None))
      r = _run(config, params, batch, p, m, b, tau, max_steps=cap)
      method = "diffusion" if k is None else f"diffusion forced K={k}"
      rows.append(dict(r, method=method, forced_k=k,
                       speedup=r["tokens_per_s"] / ar["tokens_per_s"]))
      print(f"[e2e] batch {batch} B={b} tau {tau} ({method}): {r['tokens_per_s']:.1f} tok/s, "
            f"NFE/token {r['nfe_per_token']:.3f}, speed-up {rows[-1]['speedup']:.2f}", flush=True)
    if FLAGS.head_buckets <= 1:
      continue
    r = _run(config, params, batch, p, m, b, taus[0], FLAGS.head_buckets)
    rows.append(dict(r, method="diffusion+head_buckets",
                     speedup=r["tokens_per_s"] / ar["tokens_per_s"]))
    print(f"[e2e] batch {batch} B={b} tau {taus[0]} head_buckets {FLAGS.head_buckets}: "
          f"{r['tokens_per_s']:.1f} tok/s", flush=True)
  return rows


def sweeps(config, params):
  rows = []
  tau, b = FLAGS.sweep_threshold, FLAGS.block_size
  cases = [("output_len", FLAGS.prompt_len, n) for n in FLAGS.output_lens]
  cases += [("prompt_len", n, FLAGS.max_new_tokens) for n in FLAGS.prompt_lens]
  for axis, p, m in cases:
    ar = _run(config, params, 1, p, m, 1, 1.0)
    diff = _run(config, params, 1, p, m, b, tau)
    rows.append(dict(axis=axis, prompt_len=p, max_new=m, ar_tokens_per_s=ar["tokens_per_s"],
                     diffusion_tokens_per_s=diff["tokens_per_s"],
                     speedup=diff["tokens_per_s"] / ar["tokens_per_s"],
                     nfe_per_token=diff["nfe_per_token"], ar_compile_s=ar["compile_s"],
                     diffusion_compile_s=diff["compile_s"]))
    print(f"[sweep] prompt {p} output {m}: speed-up {rows[-1]['speedup']:.2f}", flush=True)
  return rows


# ---- report -----------------------------------------------------------------------------------


def _table(rows, columns):
  lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)
  lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in columns) + " |" for r in rows]
  return "\n".join(lines)


def _plots(result, out_dir):
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  files = []
  if result.get("steps"):
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for batch in sorted({r["batch"] for r in result["steps"]}):
      for head in ("all", "one"):
        rs = [r for r in result["steps"] if r["batch"] == batch and r["cache"] == "sized"
              and r["lm_head"] == head]
        ax.plot([r["block"] for r in rs], [r["ratio"] for r in rs], marker="o",
                label=f"batch {batch}, LM head {head}")
    ax.set(xlabel="block size B", ylabel="block step / 1-token step", xscale="log")
    ax.legend(fontsize=7)
    files.append(_save(fig, out_dir, "step_cost_ratio.png"))
  if result.get("sweep"):
    for axis in ("output_len", "prompt_len"):
      rs = [r for r in result["sweep"] if r["axis"] == axis]
      fig, ax = plt.subplots(figsize=(5, 3.5))
      key = "max_new" if axis == "output_len" else "prompt_len"
      ax.plot([r[key] for r in rs], [r["speedup"] for r in rs], marker="o")
      ax.axhline(1.0, color="gray", lw=0.5)
      ax.set(xlabel=axis.replace("_", " "), ylabel="diffusion / AR tokens/s", xscale="log")
      files.append(_save(fig, out_dir, f"speedup_vs_{axis}.png"))
  return files


def _save(fig, out_dir, name):
  path = os.path.join(out_dir, name)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  return path


def main(argv):
  del argv
  os.makedirs(FLAGS.out_dir, exist_ok=True)
  config, params, what = _model()
  result = dict(model=what, backend=jax.default_backend(), devices=str(jax.devices()),
                flags={k: getattr(FLAGS, k) for k in ("prompt_len", "max_new_tokens",
                                                     "block_size", "max_steps_per_block",
                                                     "naive_cache_len", "head_buckets")})
  sections = {"steps": step_costs, "e2e": end_to_end, "sweep": sweeps}
  for name in FLAGS.sections:
    result[name] = sections[name](config, params)
  result["plots"] = _plots(result, FLAGS.out_dir)
  with open(os.path.join(FLAGS.out_dir, "bench_diffusion.json"), "w") as f:
    json.dump(result, f, indent=2)
  tables = [f"# bench_diffusion: {what}, backend {result['backend']}"]
  columns = {
      "steps": ["batch", "cache", "cache_len", "block", "lm_head", "one_token_ms", "block_ms",
                "ratio", "compile_s"],
      "e2e": ["method", "batch", "block", "tau", "max_steps_per_block", "head_buckets",
              "tokens_per_s",
              "nfe_per_token", "denoise_steps_per_token", "tokens_per_forward", "speedup",
              "compile_s"],
      "sweep": ["axis", "prompt_len", "max_new", "ar_tokens_per_s", "diffusion_tokens_per_s",
                "speedup", "nfe_per_token", "ar_compile_s", "diffusion_compile_s"],
  }
  for name in FLAGS.sections:
    tables += [f"\n## {name}\n", _table(result[name], columns[name])]
  with open(os.path.join(FLAGS.out_dir, "bench_diffusion.md"), "w") as f:
    f.write("\n".join(tables) + "\n")
  print("\n".join(tables))


if __name__ == "__main__":
  cli.run(main)
