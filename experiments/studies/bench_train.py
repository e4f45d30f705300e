r"""Train-step benchmark: tokens/s of every stage's train step, compile time, micro-batches, MFU.

CPU, the stages side by side (tiny, fp32, the tiny default's shapes):
  python experiments/studies/bench_train.py --presets=tiny --stages=sft,cft,opd,rl --batch_size=16 \
      --micro_batches=2 --steps=3 --prompt_width=64 --prompt_tokens=57 --response_width=48 \
      --response_tokens=35 --replay_rounds=16 --replay_sweep=2,4,8,16,31 \
      --json_out=docs/results/benchmarks/bench_train_stages.json \
      --md_out=docs/results/benchmarks/bench_train_stages.md
CPU, SFT micro-batch scaling (tiny + small):
  python experiments/studies/bench_train.py --json_out=docs/results/benchmarks/bench_train.json
GPU (random bf16 weights at qwen3_8b shapes, MFU against the chip's peak):
  python experiments/studies/bench_train.py --presets=qwen3_8b --dtype=bfloat16 --remat=full \
      --batch_size=8 --prompt_width=1024 --response_width=1024 --micro_batches=1,2 --peak_tflops=989

Train steps (one row per preset x stage x micro-batch count): a fresh TrainState (random params,
the stage config's optimiser), the stage's REAL loss (`stages.TRAINERS[name].make_loss` on the
stage's view of the tiny recipe) in the one step factory (gr2jax/train/step.py), on
synthetic rows with the shapes the stage's own batch has (`synthetic_batch`, a training Batch
with every field; the step gets the fields its loss reads, `Loss.fields`, as the loop places
them): the prompt / response arrays (SFT and CFT), OPD's and RL's decoded trajectories (a step
map over --replay_rounds rounds, replay.Rounds of that count, teacher log-probs [B, M, V], pi_old
log-probs, advantages). Every stage gets the same rows (prompts, responses), so the
token counts agree across stages:

  response tokens = the real response tokens of the rows (--response_tokens each; for OPD / RL
                    the trajectory's tokens), the tokens a stage learns from;
  processed tokens = the tokens of the forward the loss runs per row (`forward_len`): SFT's
                    P + M, CFT's two-stream layout P + 3 R (complementary pair), the replay's
                    P + (1 + S) R (R = M rounded up to the block size, S replay rounds).

Compile time (lower + compile) is apart; then one warm step and the median of --steps timed
steps. The host-side `prepare` of OPD / RL (rollouts, teacher forward, pi_old replay) is not part
of the step and not timed here; the replay section prices its forwards. FLOPs are analytic and
dense (6 x matmul params x processed tokens + 12 x L x N^2 x heads x head_dim for the attention,
every key scored as our attention does, + the LM head at the M response queries);
MFU = FLOPs / step time / peak.

Replay (--replay_sweep): the forward of `replay.replay` (as OPD calls it, with the
[B, M, V] distributions) over trajectories of S rounds vs the AR teacher's one causal forward over
[prompt | response] (`opd.teacher_log_probs`) for the same rows and the same model weights; the
cost ratio next to the token ratio (P + (1 + S) R) / (P + M).
Attention (--attention): the reference path of the two-stream layouts (CFT, the replay) per
noisy block ('per_block', attention.two_stream, the library's path) and/or over the dense
[N, N] mask ('dense', attention.two_stream_path(False), the path before it). Each step
(replay forward) is compiled once per path and the paths' calls alternate, so both in one run
give each per_block row a `speedup` (dense time / per-block time) that a change of the
machine's load during the run does not bias. `temp_mb` is the compiled step's (forward's)
temporary memory (XLA memory_analysis).
Prints one JSON line per row and the tables; --json_out / --md_out write them.

Replay attention, before / after (docs/results/benchmarks/replay_attention.md):
  python experiments/studies/bench_train.py --presets=tiny --stages=opd,rl --batch_size=16 \
      --micro_batches=2 --steps=3 --prompt_width=320 --prompt_tokens=290 --response_width=48 \
      --response_tokens=35 --replay_rounds=16 --replay_sweep=8,16,31 --attention=dense,per_block \
      --json_out=docs/results/benchmarks/replay_attention.json
"""

import dataclasses
import functools
import json
import sys
import time

import jax
import numpy as np
from absl import flags

from gr2jax import cli, recipe, recipes
from gr2jax.data.batches import Batch
from gr2jax.diffusion import decode, layout, replay
from gr2jax.model import attention
from gr2jax.model import params as params_lib
from gr2jax.model.config import PRESETS, ModelConfig
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import opd, optim
from gr2jax.train import state as state_lib
from gr2jax.train import step as step_lib
from gr2jax.train.loop import Context
from gr2jax.train.stages import TRAINERS

FLAGS = flags.FLAGS

# The stages this benchmark times (AR RL's step is RL's with an AR policy).
STAGE_NAMES = ("sft", "cft", "opd", "rl")
# --attention: the reference path of the two-stream layouts (module docstring).
ATTENTION_PATHS = {"per_block": True, "dense": False}


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command-line flags (defined only when run as a script, so tests import this module
  without defining absl flags twice), each value checked when absl parses it, before anything
  is built."""
  f = {"flag_values": flag_values}
  cli.define_list("presets", ["tiny", "small"], "ModelConfig presets.", cli.choice(PRESETS), **f)
  cli.define_list("stages", ["sft"], "Stages to time.", cli.choice(STAGE_NAMES), **f)
  flags.DEFINE_integer("vocab_size", 3072, "Vocab of the tiny/small presets (the project's BPE).",
                       lower_bound=1, **f)
  flags.DEFINE_integer("batch_size", 16, "Rows per step (OPD / RL: trajectories).",
                       lower_bound=1, **f)
  flags.DEFINE_integer("seq_len", 0, "Shorthand: P = seq_len // 2, M = the rest (0 = use "
                       "--prompt_width / --response_width).", lower_bound=0, **f)
  flags.DEFINE_integer("prompt_width", 48, "P: prompt slots per row.", lower_bound=1, **f)
  flags.DEFINE_integer("prompt_tokens", 0, "Real prompt tokens per row (0 = P).", lower_bound=0,
                       **f)
  flags.DEFINE_integer("response_width", 48, "M: response slots per row.", lower_bound=1, **f)
  flags.DEFINE_integer("response_tokens", 0, "Real response tokens per row (0 = M).",
                       lower_bound=0, **f)
  flags.DEFINE_integer("replay_rounds", 16, "S: the replay rounds of the OPD / RL rows (the "
                       "tiny default's trained rollouts need 16: docs/results/benchmarks/"
                       "bench_train_stages.md).", lower_bound=1, **f)
  cli.define_list("replay_sweep", [], "Round counts of the replay-vs-causal-forward section "
                  "(empty = skipped).", cli.integer(1), allow_empty=True, **f)
  cli.define_list("micro_batches", [1, 2, 4], "Micro-batch counts to time (each dividing "
                  "--batch_size).", cli.integer(1), **f)
  cli.define_list("attention", ["per_block"], "Two-stream attention paths to time, each over "
                  "every row: per_block is the library's.", cli.choice(ATTENTION_PATHS), **f)
  flags.DEFINE_integer("steps", 5, "Timed steps per row (after the compiling one).",
                       lower_bound=1, **f)
  flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"], "param and compute dtype.", **f)
  flags.DEFINE_enum("remat", "none", ["none", "full"], "Layer rematerialisation.", **f)
  cli.define("peak_tflops", None, "Peak dense TFLOP/s of one device for MFU (H100 989).",
             cli.number(0, low_open=True), **f)
  flags.DEFINE_string("json_out", None, "Also write all rows to this JSON file.", **f)
  flags.DEFINE_string("md_out", None, "Also write the tables to this markdown file.", **f)
  flags.register_multi_flags_validator(
    ["micro_batches", "batch_size"],
    lambda v: all(v["batch_size"] % m == 0 for m in v["micro_batches"]),
    "each --micro_batches entry must divide --batch_size", flag_values=flag_values)


@dataclasses.dataclass(frozen=True)
class Rows:
  """The shapes of the benchmark's rows, shared by every stage.

  Attributes:
    rows: rows per step (OPD / RL: trajectories).
    prompt_width, prompt_tokens: P and the real prompt tokens per row.
    response_width, response_tokens: M and the real response tokens per row.
    rounds: S, the replay rounds of the OPD / RL trajectories.
  """

  rows: int
  prompt_width: int
  prompt_tokens: int
  response_width: int
  response_tokens: int
  rounds: int


def stage_config(name: str) -> recipe.StageView:
  """The tiny recipe's view of stage `name` (gr2jax/recipe.stage_config: its real settings)."""
  return recipe.stage_config(recipes.get("tiny"), name, "")


def diffusion_model(base: ModelConfig, block_size: int) -> ModelConfig:
  """The AR base converted to block size B with a mask token (the last id, as bench_diffusion's
  random weights)."""
  return dataclasses.replace(base, block_size=block_size, mask_token_id=base.vocab_size - 1)


def step_map(width: int, block_size: int, rounds: int) -> np.ndarray:
  """A decoded trajectory's commit steps [width]: each block's seed, then its other positions
  spread over steps 0 .. rounds - 1 in order (every round of a full block commits >= 1 token)."""
  j = np.arange(width) % block_size
  steps = (j - 1) * rounds // max(block_size - 1, 1)
  return np.where(j == 0, decode.SEED_STEP, steps).astype(np.int32)


def synthetic_batch(config: ModelConfig, shape: Rows, seed: int = 0) -> Batch:
  """A training Batch with every stage's fields on random rows of the given shape.

  The same seed gives every stage the same prompts and responses; OPD / RL see the response as
  the decoded trajectory (committed in full, the stop at response_tokens).
  """
  rng = np.random.default_rng(seed)
  b, p, m = shape.rows, shape.prompt_width, shape.response_width
  lp, lr = shape.prompt_tokens, shape.response_tokens
  v = config.vocab_size
  prompts = np.zeros((b, p), np.int32)
  prompts[:, :lp] = rng.integers(1, v - 1, (b, lp))
  responses = rng.integers(1, v - 1, (b, m)).astype(np.int32)  # never the mask token (v - 1)
  real = (np.arange(m)[None, :] < lr) & np.ones((b, 1), bool)
  teacher = rng.standard_normal((b, m, v)).astype(np.float32)
  if config.mask_token_id is not None:
    teacher[..., config.mask_token_id] = -np.inf
  teacher -= np.log(np.sum(np.exp(teacher), axis=-1, keepdims=True))
  return Batch(
    prompt_tokens=prompts, prompt_lengths=np.full((b,), lp, np.int32),
    example_mask=np.ones((b,), bool),
    response_tokens=np.where(real, responses, config.pad_token_id).astype(np.int32),
    response_lengths=np.full((b,), lr, np.int32), response_weights=real.astype(np.float32),
    trace_tokens=responses,
    commit_step=np.ascontiguousarray(np.broadcast_to(
      step_map(m, config.block_size, shape.rounds), (b, m))),
    replay_rounds=replay.Rounds(shape.rounds), teacher_log_probs=teacher,
    logp_old=np.full((b, m), -np.log(v), np.float32),
    advantages=rng.standard_normal(b).astype(np.float32))


def forward_len(name: str, config: ModelConfig, cfg, shape: Rows) -> int:
  """Tokens of the one forward the stage's loss runs per row (module docstring)."""
  if name == "sft":
    return shape.prompt_width + shape.response_width
  streams = shape.rounds if name in ("opd", "rl") else (2 if cfg.settings.complementary else 1)
  return shape.prompt_width + (1 + streams) * layout.padded_width(shape.response_width,
                                                                  config.block_size)


def step_flops(config: ModelConfig, batch: int, seq: int, head_queries: int) -> float:
  """Dense forward + backward FLOPs: 6 x matmul params x tokens + attention scores/values over
  every (query, key) pair + the LM head at `head_queries` per row."""
  d, f, layers = config.hidden_size, config.intermediate_size, config.num_layers
  nh, kv, h = config.num_heads, config.num_kv_heads, config.head_dim
  per_layer = d * nh * h * 2 + d * kv * h * 2 + 3 * d * f  # q, o, k, v, gate/up/down
  attention = 2 * 2 * layers * seq * seq * nh * h  # QK^T and PV, forward, per row
  head = d * config.vocab_size * head_queries
  return 6.0 * (layers * per_layer * seq + head) * batch + 3.0 * attention * batch


def traced_with(path: str, build):
  """build() with the two-stream attention path `path` (--attention), which a function reads
  when it is traced: build must trace (lower) the functions it returns."""
  with attention.two_stream_path(ATTENTION_PATHS[path]):
    return build()


def temp_megabytes(compiled) -> float | None:
  """The compiled program's temporary buffers in MB (XLA memory_analysis; None where the
  backend does not report it)."""
  analysis = compiled.memory_analysis()
  return None if analysis is None else round(analysis.temp_size_in_bytes / 1e6, 1)


def median_seconds(calls: dict, steps: int) -> dict:
  """{name: the median wall time of `steps` calls of calls[name]} after one warm call of each;
  the calls alternate, so a machine whose load changes during the run slows them alike."""
  for call in calls.values():
    call()
  times = {name: [] for name in calls}
  for _ in range(steps):
    for name, call in calls.items():
      t0 = time.perf_counter()
      call()
      times[name].append(time.perf_counter() - t0)
  return {name: float(np.median(t)) for name, t in times.items()}


def bench_stage(name: str, base: ModelConfig, shape: Rows, micro_batches: int, steps: int,
                mesh, peak_tflops: float | None = None,
                paths: tuple[str, ...] = ("per_block",)) -> list[dict]:
  """Times stage `name`'s jitted train step on synthetic rows (module docstring), compiled with
  each two-stream attention path and timed alternately: one row per path."""
  cfg = stage_config(name)
  config = base if name == "sft" else diffusion_model(base, cfg.decode.block_size)
  ctx = Context(cfg, config, None, None, None, shape.prompt_width, shape.response_width, mesh, "")
  loss_fn = TRAINERS[name].make_loss(ctx)
  optimizer = optim.make_optimizer(cfg.optimizer)
  abstract = state_lib.abstract_state(params_lib.abstract_params(config), optimizer)
  shardings = state_lib.state_shardings(config, abstract, mesh)
  init = jax.jit(lambda k: state_lib.create_state(params_lib.init_params(config, k), optimizer, 0),
                 out_shardings=shardings)
  batch = synthetic_batch(config, shape).select(loss_fn.fields)
  compiled, compile_s, carry, calls = {}, {}, {}, {}
  with jax.set_mesh(mesh):
    for path in paths:
      train_step = step_lib.make_train_step(  # a fresh jit: traced with this path
        loss_fn, optimizer, micro_batches=micro_batches, state_shardings=shardings,
        batch_sharding=mesh_lib.batch_sharding(mesh))
      carry[path] = {"state": init(jax.random.key(0))}
      t0 = time.perf_counter()
      compiled[path] = traced_with(
        path, lambda step=train_step, path=path: step.lower(carry[path]["state"], batch).compile())
      compile_s[path] = time.perf_counter() - t0

      def call(path=path):
        carry[path]["state"], metrics = compiled[path](carry[path]["state"], batch)
        carry[path]["loss"] = float(jax.block_until_ready(metrics["loss"]))

      calls[path] = call
    seconds = median_seconds(calls, steps)
  b = shape.rows
  seq = forward_len(name, config, cfg, shape)
  flops = step_flops(config, b, seq, shape.response_width)
  rows = []
  for path, step_s in seconds.items():
    row = {"stage": name, "attention": path, "params": params_lib.param_count(config),
           "batch": b, "prompt": f"{shape.prompt_tokens}/{shape.prompt_width}",
           "response": f"{shape.response_tokens}/{shape.response_width}",
           "block": config.block_size, "rounds": shape.rounds if name in ("opd", "rl") else None,
           "forward_len": seq, "micro_batches": micro_batches, "dtype": config.param_dtype,
           "remat": config.remat, "devices": len(mesh.devices.flat),
           "backend": jax.default_backend(), "compile_s": round(compile_s[path], 2),
           "temp_mb": temp_megabytes(compiled[path]), "step_s": round(step_s, 4),
           "loss": round(carry[path]["loss"], 4),
           "response_tokens_per_s": round(b * shape.response_tokens / step_s, 1),
           "processed_tokens_per_s": round(b * seq / step_s, 1),
           "tflops_per_s": round(flops / step_s / 1e12, 3)}
    if peak_tflops:
      row["mfu"] = round(flops / step_s / 1e12 / peak_tflops / row["devices"], 4)
    rows.append(row)
  return rows


def add_ratios(rows: list[dict]) -> None:
  """Each row's step time and tokens/s relative to the SFT row of its micro-batch count and
  attention path."""
  sft = {(r["micro_batches"], r["attention"]): r for r in rows if r["stage"] == "sft"}
  for r in rows:
    ref = sft.get((r["micro_batches"], r["attention"]))
    if ref:
      r["step_vs_sft"] = round(r["step_s"] / ref["step_s"], 2)
      r["response_tps_vs_sft"] = round(r["response_tokens_per_s"]
                                       / ref["response_tokens_per_s"], 3)


def add_speedups(rows: list[dict], key: tuple[str, ...], time_col: str) -> None:
  """Each per_block row's `speedup`: the dense row's time_col over its own, rows matched on
  `key` (the other columns that name a row)."""
  dense = {tuple(r[c] for c in key): r for r in rows if r["attention"] == "dense"}
  for r in rows:
    ref = dense.get(tuple(r[c] for c in key))
    if ref and r["attention"] != "dense":
      r["speedup"] = round(ref[time_col] / r[time_col], 2)


def bench_replay(base: ModelConfig, shape: Rows, rounds: list[int], steps: int,
                 block_size: int = 32, paths: tuple[str, ...] = ("per_block",)) -> list[dict]:
  """The replay's forward at each round count, compiled with each two-stream attention path,
  vs one causal forward over [prompt | response], all timed alternately: one row per count and
  path."""
  diff = diffusion_model(base, block_size)
  ar = dataclasses.replace(diff, block_size=1, mask_token_id=None)
  params = params_lib.init_params(diff, jax.random.key(0))

  def replay_fn(params, prompts, prompt_lengths, trace, commit_step, lengths, *, num_rounds):
    return replay.replay(params, diff,
                         replay.Trace(prompts, prompt_lengths, trace, commit_step, lengths),
                         num_rounds=num_rounds, temperature=1.0, return_log_probs=True)

  def causal_fn(params, prompts, prompt_lengths, trace, lengths):
    return opd.teacher_log_probs(params, ar, prompts, prompt_lengths, trace, lengths,
                                 mask_token_id=diff.mask_token_id)

  def compile_timed(fn, *args, **static):  # traced here: a new function, not jit's cached trace
    t0 = time.perf_counter()
    compiled = jax.jit(lambda *a, **k: fn(*a, **k), static_argnames=tuple(static)).lower(
      *args, **static).compile()
    return compiled, time.perf_counter() - t0

  run = lambda compiled, args: jax.block_until_ready(compiled(*args))
  causal_len = shape.prompt_width + shape.response_width
  out = []
  for s in rounds:
    batch = synthetic_batch(diff, dataclasses.replace(shape, rounds=s))
    prompt = (params, batch.prompt_tokens, batch.prompt_lengths)
    args = (*prompt, batch.trace_tokens, batch.commit_step, batch.response_lengths)
    causal_args = (*prompt, batch.trace_tokens, batch.response_lengths)
    compiled = {path: traced_with(path, functools.partial(compile_timed, replay_fn, *args,
                                                          num_rounds=s)) for path in paths}
    calls = {path: functools.partial(run, c, args) for path, (c, _) in compiled.items()}
    calls["causal"] = functools.partial(run, compile_timed(causal_fn, *causal_args)[0],
                                        causal_args)
    seconds = median_seconds(calls, steps)
    n = forward_len("rl", diff, None, dataclasses.replace(shape, rounds=s))
    for path, (c, compile_s) in compiled.items():
      row = {"attention": path, "rounds": s, "batch": shape.rows, "block": block_size,
             "replay_len": n, "causal_len": causal_len, "token_ratio": round(n / causal_len, 2),
             "replay_ms": round(seconds[path] * 1e3, 2),
             "causal_ms": round(seconds["causal"] * 1e3, 2),
             "cost_ratio": round(seconds[path] / seconds["causal"], 2),
             "replay_compile_s": round(compile_s, 2), "replay_temp_mb": temp_megabytes(c)}
      print(json.dumps(row), flush=True)
      out.append(row)
  return out


def table(rows: list[dict], cols: list[str]) -> str:
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  cell = lambda v: "-" if v is None else str(v)
  lines += ["| " + " | ".join(cell(r.get(c)) for c in cols) + " |" for r in rows]
  return "\n".join(lines)


STEP_COLS = ["stage", "attention", "batch", "prompt", "response", "block", "rounds",
             "forward_len", "micro_batches", "compile_s", "temp_mb", "step_s", "speedup",
             "response_tokens_per_s", "processed_tokens_per_s", "step_vs_sft",
             "response_tps_vs_sft", "tflops_per_s"]
REPLAY_COLS = ["attention", "rounds", "batch", "block", "replay_len", "causal_len",
               "token_ratio", "replay_ms", "speedup", "causal_ms", "cost_ratio",
               "replay_compile_s", "replay_temp_mb"]


def main(argv):
  del argv
  mesh = mesh_lib.make_mesh()
  p, m = FLAGS.prompt_width, FLAGS.response_width
  if FLAGS.seq_len:
    p, m = FLAGS.seq_len // 2, FLAGS.seq_len - FLAGS.seq_len // 2
  shape = Rows(FLAGS.batch_size, p, FLAGS.prompt_tokens or p, m, FLAGS.response_tokens or m,
               FLAGS.replay_rounds)
  result = {"steps": [], "replay": []}
  for preset in FLAGS.presets:
    overrides = {} if preset.startswith("qwen3") else {"vocab_size": FLAGS.vocab_size}
    base = dataclasses.replace(ModelConfig.preset(preset, "--presets", **overrides),
                               param_dtype=FLAGS.dtype, compute_dtype=FLAGS.dtype,
                               remat=FLAGS.remat, attention_chunk_bytes=8 << 20)
    rows, replays = [], []
    paths = tuple(FLAGS.attention)
    for name in FLAGS.stages:
      for mb in FLAGS.micro_batches:
        for row in bench_stage(name, base, shape, mb, FLAGS.steps, mesh, FLAGS.peak_tflops,
                               paths):
          row = dict(preset=preset, **row)
          print(json.dumps(row), flush=True)
          rows.append(row)
    if FLAGS.replay_sweep:
      replays += [dict(preset=preset, **r) for r in bench_replay(
        base, shape, FLAGS.replay_sweep, FLAGS.steps, paths=paths)]
    add_ratios(rows)
    add_speedups(rows, ("stage", "micro_batches"), "step_s")
    add_speedups(replays, ("rounds",), "replay_ms")
    result["steps"] += rows
    result["replay"] += replays
  cols = ["preset"] + STEP_COLS + (["mfu"] if FLAGS.peak_tflops else [])
  text = "## train steps\n\n" + table(result["steps"], cols) + "\n"
  if result["replay"]:
    text += "\n## replay forward vs causal forward\n\n" + table(
      result["replay"], ["preset"] + REPLAY_COLS) + "\n"
  print(text)
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(dict(result, backend=jax.default_backend(), devices=len(jax.devices())), f,
                indent=1)
  if FLAGS.md_out:
    with open(FLAGS.md_out, "w") as f:
      f.write(f"# bench_train: `{' '.join(sys.argv[1:])}`\n\n{text}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
