"""The decoders' forwards at the roofline, what the speed studies predict with: each forward
compiled for one chip of a target by its compiler without hardware (experiments/targets.py;
`compile_step`: the AR step, the block-diffusion step, a drafter's and a verifier's forward, at
any batch, the cache donated), priced max(bytes / bandwidth, FLOPs / (peak x fraction))
(`step_seconds`, `prefill_seconds`, `decode_seconds`), with the forwards per output token of
recorded decodes (`forwards_per_token` of Table 3's rows under the recipe's commit order,
`speculative_forwards_per_token` of bench_speculative.py's grid).

Bytes come from the compiled program's memory_analysis (arguments + outputs not aliased: the
weights and every row's cache buffer, each read once); FLOPs are analytic (plan.forward_flops;
the GPU compiler has no cost analysis). Used by experiments/studies/roofline.py (Table 3 at
batch 1), batch_curve.py (against the batch), bench_speculative.py (the draft-and-verify
roofline) and step_traffic.py (the compiled steps' HLO).
"""

import dataclasses
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from experiments import plan, targets
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.model import params as params_lib
from gr2jax.model import qwen3
from gr2jax.model.cache import KVCache, init_cache


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


def row_forwards_per_token(row: dict) -> float:
  """A Table 3 AR GR2 or Diffusion-GR2 row's decode forwards per output token: its mean forwards
  less the prefill, over its mean response length."""
  return (row["mean_nfe"] - 1) / row["mean_response_len"]


def forwards_per_token(table3: dict) -> dict:
  """{tau or None (AR): row_forwards_per_token} of a saved Table 3 (table3.json): its AR GR2 row
  and its Diffusion-GR2 rows under the recipe's own commit order (its 'commit_order'; the rows of
  the other orders and the lossless rows, whose tau is None too, are not read). A Table 3 written
  before the orders records none and has one row per tau, the recipe's: all of them are read.

  Raises:
    ValueError: a Table 3 with no Diffusion-GR2 row under its commit order.
  """
  order = table3.get("commit_order")
  out = {r["tau"]: row_forwards_per_token(r) for r in table3["rows"]
         if r["row"] == AR_ROW or (r["row"] == DIFFUSION_ROW and r.get("order") == order)}
  if all(tau is None for tau in out):
    raise ValueError(f"this Table 3 has no Diffusion-GR2 row under its commit_order {order!r}")
  return out


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
