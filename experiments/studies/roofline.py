r"""A roofline Table 3 at paper scale: Qwen3-8B decoding on one H100 at batch 1, predicted.

  python experiments/studies/roofline.py --out=docs/roofline_table3.json      (~2 H100 compiles)

A prediction, not a measurement (scripts/gpu_check.sh measures on a lent GPU). The two decoders'
steps are compiled for one H100 by XLA's GPU compiler without hardware (experiments/targets.py):
the AR step (one token after the cache: `generate.decode`'s loop body) and the block-diffusion
step (one block of B = 32 after the cache: `diffusion.decode.block_forward`, the denoising and
commit forward), at batch 1 with the static cache of the paper's 2,200-token prompt + 256 new
tokens, bf16. Per step:

  bytes   from the compiled program's memory_analysis: arguments (the weights and the whole KV
          cache buffer, each read once: the attention scores every slot) + outputs not aliased
          (logits; the donated cache's writes are in place).
  FLOPs   analytic (plan.forward_flops; the GPU compiler has no cost analysis).
  time    max(bytes / 3.35 TB/s, FLOPs / 989 TFLOP/s): the H100 SXM roofline.

Forwards per output token are the trained tiny Diffusion-GR2's, read from results/table3.json
(not re-measured): (mean forwards - the prefill) / mean response length at each tau, and the same
for its AR GR2 row. The prediction for a 256-token response after the 2,200-token prompt:
AR tok/s = 256 / (prefill + 256 x f_AR x t_AR), diffusion the same with f_tau x t_block; the
prefill is a roofline of its analytic FLOPs and the weights. Printed next to the paper's AR
71 tok/s and 2.4x / 3.3x / 3.5x (Diffusion-GR2, arXiv 2607.01170), with the paper's AR as a fraction
of the predicted roofline.
"""

import dataclasses
import json
import os
import re
import time

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from experiments import plan, targets
from gr2jax import cli
from gr2jax.apps.tables import PAPER_TABLE3
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.model import params as params_lib
from gr2jax.model import qwen3
from gr2jax.model.cache import KVCache, init_cache

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
  flags.DEFINE_string("out", os.path.join(REPO, "docs", "roofline_table3.json"), "JSON output.")
  flags.DEFINE_string("table3", os.path.join(REPO, "results", "table3.json"),
                      "The tiny Table 3 whose forwards per token the prediction uses.")
  flags.DEFINE_enum("target", "h100", ["h100", "h200"], "The GPU of the roofline.")


def _cache_spec(config, sharding, batch: int, slots: int) -> KVCache:
  """The cache of `batch` rows as ShapeDtypeStructs (init_cache's layout), every buffer on
  `sharding`."""
  return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding),
                      jax.eval_shape(lambda: init_cache(config, batch, slots)))


def compile_forward(fn, config, width: int, s: plan.Shapes, target_name: str, batch: int = 1,
                    queries: int | None = None):
  """Compiles `fn(params, cache, tokens [batch, width], prompt_lengths [batch])` for one device of
  the target, with the cache of `batch` rows of s.prompt_len + s.response_len slots donated and
  the recipe's XLA flags (s.xla_flags, the target's platform's only: targets.recipe_options).

  Args:
    queries: positions per row where the LM head runs (default `width`), for the FLOPs.

  Returns:
    (compiled, {'memory', 'bytes', 'flops', 'tokens', 'batch', 'compile_s', 'options',
    'failures'}): bytes = arguments + outputs not aliased; FLOPs analytic (plan.forward_flops,
    every row scoring every cache slot).
  """
  target = targets.get_target(target_name)
  one_chip = "x".join("1" for _ in target.default_topology.split("x"))
  mesh, target = targets.target_mesh(target_name, one_chip, 1, 1)
  slots = s.prompt_len + s.response_len
  rep = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  shapes = [_cache_spec(config, rep, batch, slots),
            jax.ShapeDtypeStruct((batch, width), jnp.int32, sharding=rep),
            jax.ShapeDtypeStruct((batch,), jnp.int32, sharding=rep)]
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    lowered = jax.jit(fn, donate_argnums=1).lower(
      plan.param_specs(config, mesh, decoding=True), *shapes)
    compiled, record = plan._compile(lowered, target, 0,
                                     targets.recipe_options(target, s.xla_flags))
  mem = plan._memory(compiled)
  flops = batch * plan.forward_flops(config, width, width * slots, width if queries is None
                                     else queries)
  return compiled, {"memory": mem, "bytes": mem["argument"] + mem["output"] - mem["alias"],
                    "flops": flops, "tokens": width, "batch": batch,
                    "compile_s": time.perf_counter() - start, "options": record["options"],
                    "failures": record["failures"]}


def decode_shapes(s: plan.Shapes, target_name: str) -> plan.Shapes:
  """The shapes as the target decodes them: attention_impl 'auto' resolves to the platform's
  kernel on its own backend (targets.Target.kernel), which a compile from this host must name;
  a decode step then runs the GPU's decode kernel (model/decode_attention.py), the TPU's
  reference (model/attention.py)."""
  return plan.with_attention(s, targets.get_target(target_name).kernel)


STEPS = ("ar", "block", "draft", "verify")


def compile_step(kind: str, s: plan.Shapes, target_name: str, batch: int = 1,
                 k: int | None = None):
  """compile_forward of one decoder forward at `batch` rows, with the target's attention
  (decode_shapes):

    ar      one token after the cache (`generate`'s loop body);
    block   one block of s.block_size tokens (`diffusion.decode.block_forward`, the denoising
            and commit forward);
    draft   the drafter's block forward with the LM head at the K = `k` drafted queries;
    verify  the verifier's causal forward of K + 1 tokens after the cache.
  """
  if kind not in STEPS:
    raise ValueError(f"step {kind!r}: expected one of {STEPS}")
  if (kind in ("draft", "verify")) != (k is not None):
    raise ValueError(f"step {kind!r}: k={k} (K is given for draft and verify only)")
  s = decode_shapes(s, target_name)
  if kind in ("ar", "verify"):
    config = dataclasses.replace(s.model, remat="none")

    def fn(params, cache, tokens, prompt_lengths):
      del prompt_lengths
      return qwen3.forward(params, config, tokens, cache=cache, update_cache=True)
    return compile_forward(fn, config, 1 if kind == "ar" else k + 1, s, target_name, batch)
  config = dataclasses.replace(s.diffusion(), remat="none")
  at = None if kind == "block" else np.broadcast_to(np.arange(k, dtype=np.int32), (batch, k))

  def fn(params, cache, tokens, prompt_lengths):
    return diffusion_decode.block_forward(params, config, cache, tokens, prompt_lengths, at)
  return compile_forward(fn, config, s.block_size, s, target_name, batch,
                         s.block_size if at is None else k)


AR_ROW, DIFFUSION_ROW = "AR GR2", "Diffusion-GR2"  # gr2jax/apps/tables.py's Table 3 labels
_LOSSLESS_ROW = re.compile(r"K=(\d+) tau_d=([0-9.]+)$")  # 'Draft + verify (lossless), K=8 tau_d=0'


def forwards_per_token(table3_rows: list[dict]) -> dict:
  """{tau or None (AR): decode forwards per output token} of Table 3's AR GR2 and Diffusion-GR2
  rows (the lossless rows, whose tau is None too, are not read), the prefill removed."""
  return {r["tau"]: (r["mean_nfe"] - 1) / r["mean_response_len"] for r in table3_rows
          if r["row"] in (AR_ROW, DIFFUSION_ROW)}


def lossless_draft(row: dict) -> tuple[int, float] | None:
  """(K, tau_d) of a Table 3 lossless row, read from its label; None for any other row."""
  m = _LOSSLESS_ROW.search(row["row"])
  return (int(m.group(1)), float(m.group(2))) if m else None


def speculative_forwards_per_token(grid_rows: list[dict]) -> dict:
  """{(K, tau_d): {'draft': .., 'verify': ..} forwards per output token} of a draft-and-verify
  grid (experiments/studies/bench_speculative.py's, both prefills excluded)."""
  return {(g["k"], g["tau"]): {part: g["parts"]["all"][f"{part}_forwards"]
                               / g["parts"]["all"]["tokens"] for part in ("draft", "verify")}
          for g in grid_rows}


def step_seconds(step: dict, target: targets.Target, fraction: float = 1.0) -> float:
  """A compiled forward's time at the roofline: max(bytes / bandwidth, FLOPs / (peak x
  `fraction`)), the full bandwidth whatever the fraction of peak FLOP/s."""
  return max(step["bytes"] / target.hbm_bytes_s, step["flops"] / (target.peak_flops * fraction))


def prefill_flops(s: plan.Shapes) -> float:
  """The analytic FLOPs of one row's causal prefill of the prompt."""
  return plan.forward_flops(s.model, s.prompt_len, plan.causal_pairs(s.prompt_len), 1)


def prefill_seconds(s: plan.Shapes, target: targets.Target, batch: int = 1,
                    fraction: float = 1.0) -> float:
  """The prompt's prefill of `batch` rows at the roofline: the weights (bf16) read once, every
  row's analytic FLOPs at `fraction` of peak."""
  weights = params_lib.param_count(s.model) * 2
  return max(weights / target.hbm_bytes_s,
             batch * prefill_flops(s) / (target.peak_flops * fraction))


def decode_seconds(forwards: dict, step_s: dict, prefills: int, prefill_s: float,
                   response_len: int) -> tuple[float, float]:
  """One decode of `response_len` tokens per row at the roofline.

  Args:
    forwards: {step name: forwards per output token} ({'ar': 0.98}; draft-and-verify
      {'draft_k8': .., 'verify_k8': ..}).
    step_s: {step name: seconds per forward} (step_seconds).
    prefills: prompt prefills per decode (2 for draft-and-verify: drafter and verifier).
    prefill_s, response_len: prefill_seconds and the response length.

  Returns:
    (seconds per output token of a row, seconds of the whole decode: prefills + tokens).
  """
  per_token = sum(f * step_s[name] for name, f in forwards.items())
  return per_token, prefills * prefill_s + response_len * per_token


def predict(steps: dict, fpt: dict, s: plan.Shapes, target: targets.Target) -> dict:
  """The roofline times and the predicted tok/s and speed-ups (module docstring)."""
  prefill_s = prefill_seconds(s, target)
  t = {kind: step_seconds(x, target) for kind, x in steps.items()}
  r = s.response_len
  ar_per_token, ar_s = decode_seconds({"ar": fpt[None]}, t, 1, prefill_s, r)
  rows = [{"row": "AR", "tau": None, "forwards_per_token": fpt[None], "step_s": t["ar"],
           "tok_s": r / ar_s, "steady_tok_s": 1 / ar_per_token, "speedup": 1.0,
           "paper_tok_s": PAPER_TABLE3[None][1], "paper_speedup": 1.0}]
  for tau in sorted((k for k in fpt if k is not None), reverse=True):
    per_token, total = decode_seconds({"block": fpt[tau]}, t, 1, prefill_s, r)
    paper = PAPER_TABLE3.get(tau)
    rows.append({"row": "Diffusion-GR2", "tau": tau, "forwards_per_token": fpt[tau],
                 "step_s": t["block"], "tok_s": r / total, "steady_tok_s": 1 / per_token,
                 "speedup": ar_s / total, "paper_tok_s": paper[1] if paper else None,
                 "paper_speedup": paper[2] if paper else None})
  return {"prefill_s": prefill_s, "prefill_flops": prefill_flops(s), "rows": rows,
          "paper_ar_fraction_of_roofline": PAPER_TABLE3[None][1] / rows[0]["tok_s"]}


def markdown(out: dict) -> str:
  steps = out["steps"]
  lines = [f"Prediction (roofline of {out['device_kind']}: {out['hbm_bytes_s'] / 1e12:.2f} TB/s, "
           f"{out['peak_flops'] / 1e12:.0f} TFLOP/s), Qwen3-8B bf16, batch 1, prompt "
           f"{out['prompt_len']:,} + {out['response_len']} new tokens; steps compiled by XLA's "
           f"GPU compiler ({', '.join(f'{k} {v}' for k, v in out['versions'].items())}).", "",
           "| step | tokens per forward | GB moved (args + outputs) | GFLOP | time at the roofline "
           "| bound |", "|---|---|---|---|---|---|"]
  for kind, x in steps.items():
    t_mem, t_flop = x["bytes"] / out["hbm_bytes_s"], x["flops"] / out["peak_flops"]
    lines.append(f"| {kind} | {x['tokens']} | {x['bytes'] / 1e9:.2f} | {x['flops'] / 1e9:,.0f} | "
                 f"{max(t_mem, t_flop) * 1e3:.2f} ms | "
                 f"{'memory' if t_mem >= t_flop else 'compute'} |")
  lines.append(f"| prefill ({out['prompt_len']:,} tokens, analytic) | {out['prompt_len']} | "
               f"{out['weights_bytes'] / 1e9:.2f} (weights) | "
               f"{out['prediction']['prefill_flops'] / 1e9:,.0f} | "
               f"{out['prediction']['prefill_s'] * 1e3:.1f} ms | compute |")
  lines += ["", "| row | tau | forwards per output token (tiny, results/table3.json) | predicted "
                "tok/s (steady, no prefill) | predicted speed-up | paper tok/s | paper speed-up |",
            "|---|---|---|---|---|---|---|"]
  for r in out["prediction"]["rows"]:
    tau = "-" if r["tau"] is None else f"{r['tau']:g}"
    paper_tok = "-" if r["paper_tok_s"] is None else f"{r['paper_tok_s']}"
    paper_x = "-" if r["paper_speedup"] is None else f"{r['paper_speedup']:g}x"
    lines.append(f"| {r['row']} | {tau} | {r['forwards_per_token']:.3f} | {r['tok_s']:.0f} "
                 f"({r['steady_tok_s']:.0f}) | {r['speedup']:.2f}x | {paper_tok} | {paper_x} |")
  fraction = out["prediction"]["paper_ar_fraction_of_roofline"]
  lines += ["", f"The paper's AR 71 tok/s is {fraction:.0%} of the predicted AR roofline."]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  plan.use_host_devices(1)
  s = plan.PRESETS["qwen3_8b"]
  target = targets.get_target(FLAGS.target)
  with open(FLAGS.table3) as f:
    fpt = forwards_per_token(json.load(f)["rows"])
  steps = {}
  for kind in ("ar", "block"):
    _, steps[kind] = compile_step(kind, s, FLAGS.target)
    print(f"[roofline] {kind}: {steps[kind]['bytes'] / 1e9:.2f} GB, compile "
          f"{steps[kind]['compile_s']:.0f} s", flush=True)
  out = {"target": FLAGS.target, "device_kind": targets.devices(target, "1x1x1")[0].device_kind,
         "hbm_bytes_s": target.hbm_bytes_s, "peak_flops": target.peak_flops,
         "prompt_len": s.prompt_len, "response_len": s.response_len, "block_size": s.block_size,
         "weights_bytes": params_lib.param_count(s.model) * 2, "versions": plan.versions(),
         "table3": os.path.relpath(FLAGS.table3, REPO), "steps": steps,
         "prediction": predict(steps, fpt, s, target)}
  out["markdown"] = markdown(out)
  with open(FLAGS.out, "w") as f:
    json.dump(out, f, indent=1, default=float)
  print(json.dumps(out["prediction"], indent=1, default=float))
  print(out["markdown"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
