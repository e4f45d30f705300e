r"""AR decode benchmark: gr2jax `generate` vs transformers `generate` on the same weights.

CPU (the default; both sides fp32, torch limited to --torch_threads to match XLA's cores):
  python experiments/bench_decode.py     # tiny,small x batch 1,8 x prompt 256,1024
GPU (random bf16 weights, no transformers run, model-bandwidth utilisation):
  python experiments/bench_decode.py --presets=qwen3_8b --random_weights --hf=false \
      --dtype=bfloat16 --batch_sizes=1 --peak_bw_gbs=4800

For each (preset, batch, prompt length) it times, after one warm-up call of the same shape:
gr2jax prefill and the on-device decode loop separately (compile time = first call - warm call),
and transformers' greedy `generate` end to end (plus one prompt forward as its prefill) for each
--torch_threads value; `speedup` is against the fastest of them, `speedup_vs_t2` against 2
threads. Every run
generates exactly --new_tokens tokens (no EOS). Without --random_weights a seeded random
`transformers.Qwen3ForCausalLM` is saved and converted with weights_conversion/convert_hf.py, so
both sides run identical weights. Prints one JSON line per row and a table at the end.

Model-bandwidth utilisation (with --peak_bw_gbs): bytes that must be read per decode step =
all weights except the embedding table (only B rows of it are read; a tied head counts once) +
the valid KV cache (mean length prompt + new/2), divided by the measured step time and the peak.
Every row also has frac_copy: the same GB/s over a 1 GiB numpy copy timed right after the row in
the same process (experiments/limits.py), a ratio to this machine's limit.
"""

import dataclasses
import json
import os
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from experiments import limits
from gr2jax import cli, load
from gr2jax.model import generate as gen
from gr2jax.model import params as params_lib
from gr2jax.model.cache import init_cache
from gr2jax.model.config import PRESETS, ModelConfig

FLAGS = flags.FLAGS
cli.define_list("presets", ["tiny", "small"], "ModelConfig presets.", cli.choice(PRESETS))
cli.define_list("batch_sizes", [1, 8], "Batch sizes.", cli.integer(1))
cli.define_list("prompt_lens", [256, 1024], "Prompt lengths (all prompts full length).",
                cli.integer(1))
# >= 2: the decode loop's time is per step after the first token
cli.define("new_tokens", 128, "Tokens generated per example.", cli.integer(2))
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "param and compute dtype.")
flags.DEFINE_bool("hf", True, "Also time transformers generate (CPU torch) on the same weights.")
flags.DEFINE_bool("random_weights", False, "Init gr2jax params directly on device (no HF model, "
                  "no conversion); for big presets on a GPU box.")
cli.define_list("torch_threads", [2, 1], "torch.set_num_threads values to time transformers "
                "with (2 matches XLA's cores; on a loaded 2-core box 1 thread can be much "
                "faster, so the speed-up is reported against the best).", cli.integer(1))
cli.define("peak_bw_gbs", None, "Peak memory bandwidth in GB/s, for the MBU column (e.g. 4800 "
           "for an H200).", cli.number(0, low_open=True))
flags.DEFINE_string("json_out", None, "Also write all rows to this JSON file.")


def _timed(fn):
  """(result, seconds) of fn() with every output array ready."""
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - start


def build_models(preset: str):
  """(config, gr2jax params, HF model or None) with identical weights (see the module doc)."""
  config = getattr(ModelConfig, preset)(param_dtype=FLAGS.dtype, compute_dtype=FLAGS.dtype,
                                        eos_token_ids=())
  if FLAGS.random_weights:
    init = jax.jit(params_lib.init_params, static_argnums=0)
    return config, jax.block_until_ready(init(config, jax.random.key(0))), None
  import torch
  import transformers

  from weights_conversion import convert_hf

  torch.manual_seed(0)
  hf_model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config.to_hf_dict()))
  with tempfile.TemporaryDirectory() as tmp:
    hf_model.save_pretrained(os.path.join(tmp, "hf"))
    convert_hf.convert(os.path.join(tmp, "hf"), os.path.join(tmp, "ckpt"), FLAGS.dtype)
    loaded_config, params = load.load_model(os.path.join(tmp, "ckpt"))
  config = dataclasses.replace(loaded_config, eos_token_ids=(), compute_dtype=FLAGS.dtype)
  return config, params, hf_model.to(getattr(torch, FLAGS.dtype)).eval()


def bench_gr2jax(config, params, prompts: np.ndarray, new: int) -> dict:
  """Prefill + decode loop timings (first call = compile + run, then one warm call)."""
  b, p = prompts.shape
  tokens, lengths = jnp.asarray(prompts, jnp.int32), jnp.full((b,), p, jnp.int32)

  def run():
    (logits, cache), t_prefill = _timed(lambda: gen.prefill(
      params, config, tokens, lengths, init_cache(config, b, p + new)))
    (out, _), t_decode = _timed(lambda: gen.decode(
      params, config, cache, logits, jax.random.key(0),
      gen.ARDecoding(max_new_tokens=new, stop_token_ids=())))
    return out, t_prefill, t_decode

  _, first_prefill, first_decode = run()
  out, t_prefill, t_decode = run()
  assert int(out.nfe) == new - 1 and out.tokens.shape == (b, new)
  return {"prefill_s": t_prefill, "decode_s": t_decode,
          "compile_s": (first_prefill - t_prefill) + (first_decode - t_decode),
          "tok_s": b * new / (t_prefill + t_decode),
          "decode_tok_s": b * (new - 1) / t_decode, "tokens": np.asarray(out.tokens)}


def bench_hf(model, prompts: np.ndarray, new: int) -> dict:
  """transformers greedy generate, warm (one warm-up call of the same shape first)."""
  import torch

  ids = torch.from_numpy(prompts.astype(np.int64))
  kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=new,
                min_new_tokens=new, eos_token_id=None, pad_token_id=0)
  with torch.no_grad():
    start = time.perf_counter()
    model.generate(ids, **kwargs)
    first = time.perf_counter() - start
    start = time.perf_counter()
    out = model.generate(ids, **kwargs)
    total = time.perf_counter() - start
    start = time.perf_counter()
    model(ids, attention_mask=kwargs["attention_mask"], use_cache=True)
    t_prefill = time.perf_counter() - start
  b = prompts.shape[0]
  return {"total_s": total, "first_call_s": first, "prefill_s": t_prefill,
          "tok_s": b * new / total, "decode_tok_s": b * (new - 1) / max(total - t_prefill, 1e-9),
          "tokens": out[:, prompts.shape[1]:].numpy()}


def compare_hf(hf_model, prompts: np.ndarray, new: int, ours: dict) -> dict:
  """transformers timings for each --torch_threads, the best of them, and the speed-ups."""
  import torch

  row, best = {}, None
  for threads in FLAGS.torch_threads:
    torch.set_num_threads(threads)
    theirs = bench_hf(hf_model, prompts, new)
    row.update({f"hf_t{threads}_{k}": v for k, v in theirs.items() if k != "tokens"})
    row[f"speedup_vs_t{threads}"] = ours["tok_s"] / theirs["tok_s"]
    if best is None or theirs["tok_s"] > best[1]["tok_s"]:
      best = threads, theirs
  threads, theirs = best
  row.update({f"hf_{k}": v for k, v in theirs.items() if k != "tokens"})
  row.update(hf_threads=threads, speedup=ours["tok_s"] / theirs["tok_s"],
             same_tokens_frac=float(np.mean(ours["tokens"] == theirs["tokens"])))
  return row


def bandwidth(config: ModelConfig, params, b: int, p: int, new: int, step_s: float) -> dict:
  """Bytes read per decode step, achieved GB/s and MBU (see the module doc)."""
  weights = sum(x.nbytes for x in jax.tree.leaves(params))
  if not config.tie_word_embeddings:
    weights -= params["embed"].nbytes
  itemsize = jnp.dtype(config.compute_dtype).itemsize
  kv = 2 * config.num_layers * b * (p + new / 2) * config.num_kv_heads * config.head_dim * itemsize
  gbs = (weights + kv) / step_s / 1e9
  copy_gbs = limits.copy_rate_gbs(1024)
  row = {"bytes_per_step": int(weights + kv), "achieved_gbs": gbs, "copy_gbs": copy_gbs,
         "frac_copy": gbs / copy_gbs}
  if FLAGS.peak_bw_gbs:
    row["mbu"] = gbs / FLAGS.peak_bw_gbs
  return row


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)  # orbax logs every leaf at INFO
  rows = []
  for preset in FLAGS.presets:
    config, params, hf_model = build_models(preset)
    for b in FLAGS.batch_sizes:
      for p in FLAGS.prompt_lens:
        prompts = np.random.default_rng(0).integers(0, config.vocab_size, (b, p))
        new = FLAGS.new_tokens
        row = {"preset": preset, "batch": b, "prompt": p, "new_tokens": new,
               "dtype": FLAGS.dtype, "device": jax.devices()[0].device_kind,
               "params": params_lib.param_count(config)}
        ours = bench_gr2jax(config, params, prompts, new)
        row.update({f"gr2jax_{k}": v for k, v in ours.items() if k != "tokens"})
        row.update(bandwidth(config, params, b, p, new, ours["decode_s"] / (new - 1)))
        if FLAGS.hf and hf_model is not None:
          row.update(compare_hf(hf_model, prompts, new, ours))
        print(json.dumps(row), flush=True)
        rows.append(row)
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(rows, f, indent=1)
  print_table(rows)


def print_table(rows: list[dict]) -> None:
  cols = [("preset", "{}"), ("batch", "{}"), ("prompt", "{}"), ("gr2jax_tok_s", "{:.0f}"),
          ("gr2jax_decode_tok_s", "{:.0f}"), ("gr2jax_prefill_s", "{:.3f}"),
          ("gr2jax_compile_s", "{:.1f}"), ("hf_tok_s", "{:.0f}"), ("hf_decode_tok_s", "{:.0f}"),
          ("hf_prefill_s", "{:.3f}"), ("hf_threads", "{}"), ("speedup", "{:.2f}x"),
          ("speedup_vs_t2", "{:.2f}x"), ("same_tokens_frac", "{:.2f}"),
          ("achieved_gbs", "{:.1f}"), ("frac_copy", "{:.2f}"), ("mbu", "{:.1%}")]
  cols = [(c, f) for c, f in cols if any(c in r for r in rows)]
  print("| " + " | ".join(c for c, _ in cols) + " |")
  print("|" + "---|" * len(cols))
  for r in rows:
    print("| " + " | ".join(f.format(r[c]) if c in r else "" for c, f in cols) + " |")


if __name__ == "__main__":
  cli.run(main)
