r"""The GPU check: one prepared run that measures what experiments/plan.py can only predict.

  bash scripts/gpu_check.sh                       # qwen3_8b, random bf16 weights, a GPU box
  bash scripts/gpu_check.sh --preset=tiny --out_dir=/tmp/gpu_check      # CPU smoke run (slow test)

Sections, each a subprocess with its own time limit (PRESETS[...]['budget_s']; the qwen3_8b
limits sum to under 10 min), so one that fails or runs over leaves the others' numbers:
  decode_kernel  this file --section=decode_kernel: the GPU decode kernel
             (gr2jax/model/decode_attention.py, which the decode sections below run) against the
             einsum reference over the same bf16 cache buffers, at the AR step's and the block
             step's shapes: max |difference| and the time of each (the Pallas interpreter on CPU).
  ar_decode  experiments/bench_decode.py: AR decode tokens/s at batch 1 and model-bandwidth
             utilisation, MBU = (weights + KV cache bytes read per step) / step time / peak HBM
             bandwidth of the device (target >= 70%).
  diffusion  experiments/bench_diffusion.py --sections=e2e: block diffusion (B = 32) vs
             AR at tau in {0.9, 0.6, 0.4} with --forced_tokens_per_step (random weights commit one
             token per step; the forced schedule emulates K tokens per step at each tau).
  train      this file --section=train: SFT and CFT train steps (experiments/plan.py's stage
             definitions, remat on, bf16 params, fp32 moments) on all local devices (fsdp), at
             1 and 2 rows per device, then the largest micro-batch the memory line predicts
             fits (compiled, checked with memory_analysis, run); MFU = model FLOPs
             (plan.forward_flops) / step time / (peak x devices) (target >= 40%). When the
             train state (~24 bytes per param incl. the update's fp32 temporaries; 8B: ~200 GB)
             does not fit 3/4 of the local memory (fewer than ~4 H100s), the section times the
             full-depth forward + backward alone (mode 'grad'; reported per row).
  exactness  this file --section=exactness: the teacher-forced check of greedy decodes in bf16
             (gr2jax/decoding/exactness.py): AR and the lossless mode (a drafter made of the
             verifier's first layers) decode the same prompts at batch 1, 8 and 16; per batch
             and decoder, the positions whose committed token is not the verifier's teacher-forced
             arg-max at that batch (flips), the largest flip margin (absolute and relative to the
             position's largest logit), flips beyond exactness.TOLERANCE, and the rows that differ
             from the batch-1 decode (and, for lossless, from AR's at the same batch).
Then OUT/gpu_check.json (everything) and OUT/gpu_check.md (five tables).
"""

import json
import math
import os
import subprocess
import sys
import time

from absl import flags

from gr2jax import cli  # light: absl and the workdir lock only

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FLAGS = flags.FLAGS


# A --forced_tokens_per_step entry (here and in experiments/bench_diffusion.py): tau:K.
FORCED = cli.fields(":", TAU=cli.number(0, 1, low_open=True), K=cli.integer(1))


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command line's flags (defined only when run as a script: the tests import this
  module's sections), each checked when absl parses it: a bad value is refused before any
  section runs."""
  flags.DEFINE_enum("preset", "qwen3_8b", ["qwen3_8b", "tiny"], "Model and shapes (PRESETS).",
                    flag_values=flag_values)
  flags.DEFINE_string("out_dir", "runs/gpu_check", "Where the JSON, logs and table go.",
                      flag_values=flag_values)
  flags.DEFINE_enum("section", "all", ["all", "decode_kernel", "ar_decode", "diffusion", "train",
                                       "exactness", "report"],
                    "'all' runs every section as a subprocess, then the report.",
                    flag_values=flag_values)
  cli.define_list("forced_tokens_per_step", ["0.9:3", "0.6:4", "0.4:5"],
                  "tau:K pairs of the diffusion section (K tokens per denoising step; chosen "
                  "near the paper's frontier, 2.4x / 3.3x / 3.5x over AR).", FORCED,
                  flag_values=flag_values)


# Peak bf16 dense FLOP/s and HBM bytes/s by device_kind substring (first match wins).
PEAKS = (("H200", 989e12, 4.8e12), ("H100 PCIe", 756e12, 2.0e12), ("H100", 989e12, 3.35e12),
         ("A100", 312e12, 2.0e12), ("B200", 2250e12, 8.0e12), ("L40S", 362e12, 0.864e12))
STATE_BYTES_PER_PARAM = 24  # bf16 params + grads, fp32 mu + nu, the update's fp32 temporaries

# exactness: (prompt slots, new tokens per row, prompts, the drafter's layers, K = its block).
PRESETS = {
  "qwen3_8b": dict(prompt_len=2200, new_tokens=128, block_size=32, repeats=2,
                   max_rows_per_device=16, exactness=(128, 64, 16, 2, 8),
                   budget_s=dict(decode_kernel=30, ar_decode=120, diffusion=160, train=160,
                                 exactness=120)),
  "tiny": dict(prompt_len=64, new_tokens=32, block_size=8, repeats=1, max_rows_per_device=2,
               exactness=(16, 32, 16, 2, 8),
               budget_s=dict(decode_kernel=200, ar_decode=300, diffusion=400, train=400,
                             exactness=300)),
}
EXACTNESS_BATCHES = (1, 8, 16)


def peaks(device_kind: str) -> tuple[float | None, float | None]:
  """(peak FLOP/s, peak HBM bytes/s) of a device kind, (None, None) when unknown (CPU)."""
  for name, flops, bw in PEAKS:
    if name.lower() in device_kind.lower():
      return flops, bw
  return None, None


# ---- sections run as subprocesses ------------------------------------------------------------


def _commands(out_dir: str) -> dict[str, list[str]]:
  p = PRESETS[FLAGS.preset]
  py = sys.executable
  return {
    "decode_kernel": [py, os.path.abspath(__file__), f"--preset={FLAGS.preset}",
                      "--section=decode_kernel", f"--out_dir={out_dir}"],
    "ar_decode": [py, os.path.join(REPO, "experiments", "bench_decode.py"),
                  f"--presets={FLAGS.preset}", "--random_weights", "--hf=false",
                  "--dtype=bfloat16", "--batch_sizes=1", f"--prompt_lens={p['prompt_len']}",
                  f"--new_tokens={p['new_tokens']}",
                  f"--json_out={os.path.join(out_dir, 'ar_decode.json')}"],
    "diffusion": [py, os.path.join(REPO, "experiments", "bench_diffusion.py"),
                  f"--preset={FLAGS.preset}", "--param_dtype=bfloat16",
                  "--sections=e2e", "--batch_sizes=1",
                  "--thresholds=" + ",".join(f"{tau:g}" for tau, _ in
                                             FLAGS.forced_tokens_per_step),
                  "--forced_tokens_per_step=" + ",".join(
                    FORCED.text(x) for x in FLAGS.forced_tokens_per_step),
                  f"--block_size={p['block_size']}", f"--prompt_len={p['prompt_len']}",
                  f"--max_new_tokens={p['new_tokens']}", "--head_buckets=1",
                  f"--repeats={p['repeats']}", f"--out_dir={os.path.join(out_dir, 'diffusion')}"],
    "train": [py, os.path.abspath(__file__), f"--preset={FLAGS.preset}", "--section=train",
              f"--out_dir={out_dir}"],
    "exactness": [py, os.path.abspath(__file__), f"--preset={FLAGS.preset}",
                  "--section=exactness", f"--out_dir={out_dir}"],
  }


def run_sections(out_dir: str) -> dict:
  """Runs each section as a subprocess under its time limit; logs to OUT/<section>.log."""
  status = {}
  for name, cmd in _commands(out_dir).items():
    limit = PRESETS[FLAGS.preset]["budget_s"][name]
    start = time.perf_counter()
    with open(os.path.join(out_dir, f"{name}.log"), "w") as log:
      try:
        rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=limit,
                            cwd=REPO).returncode
        state = "ok" if rc == 0 else f"failed (exit {rc})"
      except subprocess.TimeoutExpired:
        state = f"timed out after {limit} s"
    status[name] = {"status": state, "seconds": time.perf_counter() - start}
    print(f"[gpu_check] {name}: {state} in {status[name]['seconds']:.0f} s "
          f"(log {os.path.join(out_dir, name + '.log')})", flush=True)
  return status


# ---- decode kernel section -------------------------------------------------------------------


def decode_kernel_section(out_dir: str) -> list[dict]:
  """The decode kernel vs the reference at the preset's step shapes (OUT/decode_kernel.json)."""
  import jax
  import jax.numpy as jnp

  from experiments import limits
  from gr2jax.model import attention, decode_attention
  from gr2jax.model.config import ModelConfig

  decode_attention.DECODE_INTERPRET = jax.default_backend() != "gpu"
  cfg = PRESETS[FLAGS.preset]
  config = getattr(ModelConfig, FLAGS.preset)()
  n, kv, h = config.num_heads, config.num_kv_heads, config.head_dim
  prompt, slots = cfg["prompt_len"], cfg["prompt_len"] + cfg["new_tokens"]
  keys = jax.random.split(jax.random.key(0), 3)
  k_cache = jax.random.normal(keys[1], (kv, h, slots), jnp.bfloat16)
  v_cache = jax.random.normal(keys[2], (kv, slots, h), jnp.bfloat16)
  no_new = jnp.zeros((1, 0, kv, h), jnp.bfloat16)
  reference = jax.jit(lambda q, k, v, m: attention.reference(q, no_new, no_new, k, v, m, 1 << 30))
  kernel = jax.jit(decode_attention.decode_attention)
  rows = []
  for step, t in (("ar", 1), ("block", cfg["block_size"])):
    q = jax.random.normal(keys[0], (1, t, n, h), jnp.bfloat16)
    seen = prompt + (jnp.arange(t) + 1 if step == "ar" else jnp.full(t, t))  # after the write
    mask = jnp.arange(slots)[None, None, :] < seen[None, :, None]  # [1, T, S]
    want, got = reference(q, k_cache, v_cache, mask), kernel(q, k_cache, v_cache, mask)
    rows.append({"step": step, "device": jax.devices()[0].device_kind, "queries": t,
                 "slots": slots, "max_abs_diff": float(jnp.max(jnp.abs(
                   got.astype(jnp.float32) - want.astype(jnp.float32)))),
                 "reference_ms": 1e3 * limits.best_seconds(reference, q, k_cache, v_cache, mask,
                                                           repeats=5),
                 "kernel_ms": 1e3 * limits.best_seconds(kernel, q, k_cache, v_cache, mask,
                                                        repeats=5)})
    print(json.dumps(rows[-1]), flush=True)
  with open(os.path.join(out_dir, "decode_kernel.json"), "w") as f:
    json.dump(rows, f, indent=1)
  return rows


# ---- exactness section -----------------------------------------------------------------------


def exactness_rows(params: dict, config, spec, prompts, lengths, drafter_layers: int,
                   batches=EXACTNESS_BATCHES, on_row=lambda row: None) -> list[dict]:
  """The teacher-forced check of AR's and the lossless mode's greedy decodes of the same prompts
  at each batch size (module docstring).

  AR decodes with `params`; the lossless mode verifies with them and drafts with a
  block-diffusion model made of their embeddings and first `drafter_layers` layers (block
  spec.k, the mask token the last id: a cheap drafter whose drafts the verifier partly accepts).
  The decoders read the params in their layout (fused q/k/v, one buffer per layer); the check's
  forward reads them stacked, as training and the causal scorer do: another kernel for the same
  function, as a serving stack's teacher-forced forward is.

  Args:
    params: the model's param pytree (stacked), in the precision under test.
    config: its AR config (a stop token in config.eos_token_ids ends a row early).
    spec: the lossless mode's speculative.DraftDecoding; its max_new_tokens is both decoders'
      response cap.
    prompts: [N, P] int right-padded prompts; lengths: [N]; N a multiple of every batch size.
    drafter_layers: the drafter's depth.
    batches: batch sizes; the prompts are decoded in consecutive chunks of each.
    on_row: called with each row as it lands.

  Returns:
    One row per (batch, decoder): batch, decoder, exactness.summary's fields, vs_batch_1 (how the
    decode differs from the same decoder's at the first batch size, exactness.differences) and,
    for lossless, vs_ar (from AR's at the same batch).
  """
  import dataclasses

  import jax
  import numpy as np

  from gr2jax.decoding import exactness
  from gr2jax.diffusion import convert, speculative
  from gr2jax.model import generate
  from gr2jax.model.params import layer_list

  decoding = layer_list(params)
  verifier = speculative.Model(decoding, config)
  drafter = speculative.Model(
    {**decoding, "layers": decoding["layers"][:drafter_layers]},
    dataclasses.replace(convert.to_diffusion(config, spec.k, config.vocab_size - 1),
                        num_layers=drafter_layers))
  decoders = {
    "ar": lambda p, n: generate.generate(decoding, config, p, n,
                                         generate.ARDecoding(max_new_tokens=spec.max_new_tokens)),
    "lossless": lambda p, n: speculative.speculative_generate(drafter, verifier, p, n, spec)}
  first, rows = {}, []
  for b in batches:
    decoded = {}
    for name, decode in decoders.items():
      parts = []
      for start in range(0, len(prompts), b):
        p, n = prompts[start:start + b], lengths[start:start + b]
        out = decode(p, n)
        parts.append((np.asarray(out.tokens), np.asarray(out.lengths),
                      exactness.teacher_forced_check(params, config, p, n, out.tokens,
                                                     out.lengths)))
      tokens, out_lengths, check = jax.tree.map(lambda *x: np.concatenate(x), *parts)
      decoded[name] = tokens, out_lengths
      first.setdefault(name, decoded[name])
      row = {"batch": b, "decoder": name, **exactness.summary(check),
             "vs_batch_1": exactness.differences(tokens, out_lengths, *first[name])}
      if name == "lossless":
        row["vs_ar"] = exactness.differences(tokens, out_lengths, *decoded["ar"])
      rows.append(row)
      on_row(row)
  return rows


def exactness_section(out_dir: str) -> list[dict]:
  """exactness_rows at the preset's model in bf16 (random weights); writes OUT/exactness.json,
  each row as it lands."""
  import jax
  import numpy as np

  from gr2jax.diffusion import speculative
  from gr2jax.model import params as params_lib
  from gr2jax.model.config import ModelConfig

  prompt_len, new_tokens, n, drafter_layers, k = PRESETS[FLAGS.preset]["exactness"]
  config = getattr(ModelConfig, FLAGS.preset)(param_dtype="bfloat16", compute_dtype="bfloat16",
                                              eos_token_ids=())  # every row to the cap
  params = jax.jit(params_lib.init_params, static_argnums=0)(config, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompts = rng.integers(1, config.vocab_size - 1, (n, prompt_len), dtype=np.int32)
  lengths = rng.integers(prompt_len // 2, prompt_len + 1, n).astype(np.int32)
  spec = speculative.DraftDecoding(max_new_tokens=new_tokens, k=k, draft_tau=0.0, draft_steps=1)
  device = jax.devices()[0].device_kind
  rows = []

  def save(row):
    rows.append({**row, "device": device})
    print(json.dumps(rows[-1]), flush=True)
    with open(os.path.join(out_dir, "exactness.json"), "w") as f:
      json.dump(rows, f, indent=1)

  exactness_rows(params, config, spec, prompts, lengths, drafter_layers, on_row=save)
  return rows


# ---- train section ---------------------------------------------------------------------------


def _concrete_batch(stage, rows: int, shapes, sharding):
  """Random tokens, full lengths, unit weights for the stage's batch fields, placed on devices."""
  import jax
  import numpy as np

  from gr2jax.data.batches import Batch

  rng = np.random.default_rng(0)
  vocab = stage.config.vocab_size - 2  # below the mask token
  full = {"prompt_lengths": shapes.prompt_len, "response_lengths": shapes.response_len}
  out = {}
  for name, (shape, dtype) in stage.batch(rows).items():
    if name in full:
      x = np.full(shape, full[name], np.int32)
    elif np.dtype(dtype) == np.int32:
      x = rng.integers(0, vocab, shape, dtype=np.int32)
    else:
      x = np.ones(shape, np.dtype(dtype))
    out[name] = jax.device_put(x, sharding)
  return Batch(**out)


def _mode(config, devices: int, limit) -> str:
  """'train_step' when the whole train state fits 3/4 of the local memory, else 'grad' (forward
  + backward of the full-depth model, no optimiser: the optimiser update is memory-bound and
  small next to fwd + bwd, so the MFU changes little, while dropping layers would not be the
  model's mix of layer and LM-head FLOPs)."""
  from gr2jax.model import params as params_lib

  if limit is None:
    return "train_step"
  state = STATE_BYTES_PER_PARAM * params_lib.param_count(config)
  return "train_step" if state <= 0.75 * limit * devices else "grad"


def _time_step(call, compiled, carry, batch, repeats: int):
  """(fastest step seconds, carry) after one warm-up call."""
  import jax

  carry, out = call(compiled, carry, batch)
  jax.block_until_ready(out)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    carry, out = call(compiled, carry, batch)
    jax.block_until_ready(out)
    times.append(time.perf_counter() - start)
  return min(times), carry


def _runner(stage, mesh, mode: str, optimizer):
  """(lower(batch spec) -> Lowered, call(compiled, carry, batch) -> (carry, out), carry)."""
  import jax

  from gr2jax.model import params as params_lib
  from gr2jax.model import sharding as model_sharding
  from gr2jax.train import mesh as mesh_lib
  from gr2jax.train import state as state_lib
  from gr2jax.train import step as step_lib

  batch_sh = mesh_lib.batch_sharding(mesh)
  config = stage.config
  with_sh = lambda tree, sh: jax.tree.map(
    lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, sh)
  if mode == "train_step":
    abstract = state_lib.abstract_state(params_lib.abstract_params(config), optimizer)
    shardings = state_lib.state_shardings(config, abstract, mesh)
    with jax.set_mesh(mesh):
      step = step_lib.make_train_step(stage.loss, optimizer, state_shardings=shardings,
                                      batch_sharding=batch_sh)
      carry = jax.jit(lambda: state_lib.create_state(params_lib.init_params(
        config, jax.random.key(0)), optimizer, 0), out_shardings=shardings)()
    return (lambda spec: step.lower(with_sh(abstract, shardings), spec),
            lambda c, state, batch: c(state, batch), carry)
  param_sh = model_sharding.param_shardings(config, mesh)
  grad = jax.jit(lambda p, b: jax.grad(lambda q: stage.loss(q, b, jax.random.key(0))[0])(p),
                 in_shardings=(param_sh, batch_sh), out_shardings=param_sh)
  with jax.set_mesh(mesh):
    carry = jax.jit(lambda: params_lib.init_params(config, jax.random.key(0)),
                    out_shardings=param_sh)()
  return (lambda spec: grad.lower(with_sh(params_lib.abstract_params(config), param_sh), spec),
          lambda c, params, batch: (params, c(params, batch)), carry)


def train_section(out_dir: str) -> list[dict]:
  """SFT and CFT step MFU at growing micro-batches (module docstring); writes OUT/train.json."""
  import jax

  from experiments import plan
  from gr2jax.train import mesh as mesh_lib

  devices = jax.local_devices()
  n = len(devices)
  limit = (devices[0].memory_stats() or {}).get("bytes_limit")
  kind = devices[0].device_kind
  peak, _ = peaks(kind)
  shapes = plan.PRESETS[FLAGS.preset]
  cfg = PRESETS[FLAGS.preset]
  mesh = mesh_lib.make_mesh(1, n, 1, devices=devices)
  batch_sh = mesh_lib.batch_sharding(mesh)
  rows_out = []
  for name in ("sft", "cft"):
    stage = plan.train_stages(shapes)[name]
    mode = _mode(stage.config, n, limit)
    lower, call, carry = _runner(stage, mesh, mode, plan._optimizer())
    tried = []
    per_device = 1
    while per_device:
      rows = per_device * n
      batch = _concrete_batch(stage, rows, shapes, batch_sh)
      spec = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
                          batch)
      row = {"stage": name, "mode": mode, "device": kind, "devices": n,
             "rows_per_device": per_device, "tokens_per_row": stage.work.tokens}
      try:
        with jax.set_mesh(mesh):
          start = time.perf_counter()
          compiled = lower(spec).compile()
          row["compile_s"] = time.perf_counter() - start
          mem = compiled.memory_analysis()
          row["gib_per_device"] = (mem.argument_size_in_bytes + mem.output_size_in_bytes
                                   - mem.alias_size_in_bytes + mem.temp_size_in_bytes) / 2**30
          if limit and row["gib_per_device"] * 2**30 > limit:
            raise MemoryError(f"needs {row['gib_per_device']:.1f} GiB > {limit / 2**30:.1f}")
          step_s, carry = _time_step(call, compiled, carry, batch, cfg["repeats"])
      except (MemoryError, jax.errors.JaxRuntimeError) as e:
        if isinstance(e, jax.errors.JaxRuntimeError) and "RESOURCE_EXHAUSTED" not in str(e):
          raise
        row.update(fits=False, error=str(e)[:300])
        rows_out.append(row)
        _save(out_dir, rows_out)
        print(f"[train] {name} {per_device} rows/device: does not fit ({row['error'][:120]})",
              flush=True)
        break
      flops = 3 * rows * stage.work.model_flops(stage.config)
      row.update(fits=True, step_s=step_s, tokens_per_s=rows * stage.work.tokens / step_s,
                 model_flops=flops, mfu=flops / (step_s * peak * n) if peak else None)
      rows_out.append(row)
      tried.append(row)
      _save(out_dir, rows_out)  # each row as it lands: a section stopped by its limit keeps them
      print(f"[train] {name} ({mode}) {per_device} rows/device: {step_s:.3f} s/step, "
            f"{row['tokens_per_s']:.0f} tok/s, MFU {row['mfu']}", flush=True)
      per_device = _next_rows(tried, limit, cfg["max_rows_per_device"])
    del carry
  _save(out_dir, rows_out)
  return rows_out


def _save(out_dir: str, rows: list[dict]) -> None:
  with open(os.path.join(out_dir, "train.json"), "w") as f:
    json.dump(rows, f, indent=1)


def _next_rows(tried: list[dict], limit, cap: int) -> int:
  """1, 2, then the largest rows/device the memory line through them predicts fits (0 = stop)."""
  done = [t["rows_per_device"] for t in tried]
  if len(done) < 2:
    return min(2, cap) if 2 not in done and cap >= 2 else 0
  if limit is None:
    return 0
  a, b = tried[0], tried[1]
  slope = (b["gib_per_device"] - a["gib_per_device"]) / (b["rows_per_device"] -
                                                         a["rows_per_device"])
  best = a["rows_per_device"] + (limit / 2**30 - a["gib_per_device"]) / max(slope, 1e-9)
  best = min(cap, 2 ** int(math.log2(max(best, 1))))
  return best if best > max(done) else 0


# ---- report ----------------------------------------------------------------------------------


def _load(path):
  if not os.path.exists(path):
    return None
  with open(path) as f:
    return json.load(f)


def _fmt(v, spec="{:.3g}"):
  if v is None:
    return "n/a"
  return spec.format(v) if isinstance(v, float) else str(v)


def report(out_dir: str, status: dict) -> dict:
  """Merges the sections' outputs into OUT/gpu_check.json and OUT/gpu_check.md."""
  ar = _load(os.path.join(out_dir, "ar_decode.json")) or []
  diffusion = _load(os.path.join(out_dir, "diffusion", "bench_diffusion.json")) or {}
  train = _load(os.path.join(out_dir, "train.json")) or []
  kernel = _load(os.path.join(out_dir, "decode_kernel.json")) or []
  exact = _load(os.path.join(out_dir, "exactness.json")) or []
  for r in ar:
    _, bw = peaks(r.get("device", ""))
    r["mbu"] = r["achieved_gbs"] * 1e9 / bw if bw else None
  result = {"preset": FLAGS.preset, "status": status, "decode_kernel": kernel, "ar_decode": ar,
            "diffusion": diffusion.get("e2e", []), "train": train, "exactness": exact}
  lines = [f"# GPU check ({FLAGS.preset})", "",
           "| section | status | seconds |", "|---|---|---|"]
  lines += [f"| {k} | {v['status']} | {v['seconds']:.0f} |" for k, v in status.items()]
  lines += ["", "## Decode kernel vs the reference (one layer's attention, bf16 cache)", "",
            "| step | device | queries | slots | max abs diff | reference ms | kernel ms |",
            "|---|---|---|---|---|---|---|"]
  lines += [f"| {r['step']} | {r['device']} | {r['queries']} | {r['slots']} | "
            f"{r['max_abs_diff']:.3g} | {r['reference_ms']:.3f} | {r['kernel_ms']:.3f} |"
            for r in kernel]
  lines += ["", "## AR decode, batch 1 (target MBU >= 70%)", "",
            "| device | prompt | new | decode tok/s | ms/token | GB/s | MBU |",
            "|---|---|---|---|---|---|---|"]
  for r in ar:
    lines.append(f"| {r['device']} | {r['prompt']} | {r['new_tokens']} | "
                 f"{r['gr2jax_decode_tok_s']:.1f} | {1e3 / r['gr2jax_decode_tok_s']:.2f} | "
                 f"{r['achieved_gbs']:.0f} | {_fmt(r['mbu'], '{:.1%}')} |")
  lines += ["", "## Block diffusion vs AR, batch 1 (forced K tokens per denoising step)", "",
            "| method | tau | max steps/block | tok/s | NFE/token | speed-up vs AR |",
            "|---|---|---|---|---|---|"]
  for r in result["diffusion"]:
    lines.append(f"| {r['method']} | {r['tau']} | {r['max_steps_per_block']} | "
                 f"{r['tokens_per_s']:.1f} | {r['nfe_per_token']:.3f} | "
                 f"{_fmt(r.get('speedup'), '{:.2f}x')} |")
  lines += ["", "## Train step (target MFU >= 40%)", "",
            "| stage | mode | device x n | rows/device | tokens/row | GiB/device | step s | "
            "tokens/s | MFU |", "|---|---|---|---|---|---|---|---|---|"]
  for r in train:
    lines.append(f"| {r['stage']} | {r['mode']} | {r['device']} x {r['devices']} | "
                 f"{r['rows_per_device']} | {r['tokens_per_row']} | "
                 f"{_fmt(r.get('gib_per_device'), '{:.1f}')} | "
                 + (f"{r['step_s']:.3f} | {r['tokens_per_s']:.0f} | {_fmt(r['mfu'], '{:.1%}')} |"
                    if r["fits"] else "does not fit | | |"))
  lines += ["", "## Exactness in bf16: the teacher-forced check (gr2jax/decoding/exactness.py)", "",
            "| batch | decoder | positions | flips | flip rate | max flip margin | relative | "
            "beyond tolerance | rows differing from batch 1 | rows differing from AR |",
            "|---|---|---|---|---|---|---|---|---|---|"]
  for r in exact:
    lines.append(f"| {r['batch']} | {r['decoder']} | {r['positions']} | {r['flips']} | "
                 f"{r['flip_rate']:.2%} | {_fmt(r['max_flip_margin'])} | "
                 f"{_fmt(r['max_flip_relative'])} | {r['beyond_tolerance']} | "
                 f"{r['vs_batch_1']['rows_differing']} / {r['vs_batch_1']['rows']} | "
                 + (f"{r['vs_ar']['rows_differing']} / {r['vs_ar']['rows']} |" if "vs_ar" in r
                    else "|"))
  with open(os.path.join(out_dir, "gpu_check.json"), "w") as f:
    json.dump(result, f, indent=1)
  with open(os.path.join(out_dir, "gpu_check.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  return result


def main(argv):
  del argv
  out_dir = os.path.abspath(FLAGS.out_dir)
  os.makedirs(out_dir, exist_ok=True)
  if FLAGS.section == "train":
    train_section(out_dir)
  elif FLAGS.section == "decode_kernel":
    decode_kernel_section(out_dir)
  elif FLAGS.section == "exactness":
    exactness_section(out_dir)
  elif FLAGS.section in ("ar_decode", "diffusion"):
    cmd = _commands(out_dir)[FLAGS.section]
    sys.exit(subprocess.run(cmd, cwd=REPO).returncode)
  else:
    status = run_sections(out_dir) if FLAGS.section == "all" else _load(
      os.path.join(out_dir, "gpu_check.json")).get("status", {})
    report(out_dir, status)
    failed = [k for k, v in status.items() if v["status"] != "ok"]
    if failed:
      sys.exit(f"gpu_check: sections {failed} did not finish; see their logs in {out_dir}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
