r"""Ahead-of-time plan: every train step and decoder of the recipe, compiled on a simulated mesh.

  python experiments/plan.py                       # qwen3_8b, fsdp 8 and fsdp x tp 4 x 2 (~25 min)
  python experiments/plan.py --preset=tiny --out_dir=/tmp/plan     # seconds (tests/test_plan.py)
  python experiments/plan.py --stages=sft,opd --layouts=8x1        # a subset

Nothing is allocated: each step is `jax.jit(...).lower(ShapeDtypeStructs with shardings)
.compile()` on 8 host CPU devices (XLA_FLAGS=--xla_force_host_platform_device_count=8, set by
`main` before JAX starts; importing this module changes nothing), bf16 params, fp32 Adam
moments, remat 'full'. Per (stage, layout) it reports:

  memory    compiled.memory_analysis() per device: arguments, outputs, temporaries; the total a
            device holds is arg + out - alias + temp (the donated state aliases its output).
            Train steps are compiled at two micro-batch sizes (1 and 2 rows per batch shard, the
            real step: global batch, lax.scan over micro-batches); the total is linear in the
            micro-batch, and the line gives the largest micro-batch whose total fits a card
            (80 GB H100, 141 GB H200) minus a reserve (--reserve, 10%: CUDA context, NCCL
            buffers, fragmentation; run with XLA_PYTHON_CLIENT_MEM_FRACTION=0.95).
            Decoders are compiled at the rows one rollout call decodes: the stages' configs cut
            their rollouts into calls of train.prepare_chunk rows (gr2jax/chunks.py; all rows
            when 0), the largest such call of the stages a decoder serves.
  FLOPs     analytic (`forward_flops`): XLA's cost_analysis counts a loop body once (the layer
            scan, the attention-chunk map, micro-batches, decode loops), so it is useless on the
            real step. The formula is checked against cost_analysis on small configs where every
            loop has one trip (1 layer, one attention chunk, one micro-batch; `verify_flops`).
            Model FLOPs (MFU numerator) = 3 x forward with only the attention pairs the mask
            allows; executed FLOPs add the remat forward and the dense attention (our attention
            scores every key, masked or not, apart from the causal group skip).
  time      step time = model FLOPs / (MFU x peak x devices) at 40% MFU of an H100 (989 TFLOP/s
            bf16 dense) per device; stage wall time = steps x step time, plus for OPD / RL the
            rollouts and the prepare-side forwards (teacher log-probs, pi_old replay), each
            max(FLOPs at 40% MFU, HBM bytes at peak bandwidth) per decoder forward.

Outputs: --out_dir/plan_<preset>.json, and the tables either in --out_dir/plan_<preset>.md or,
with --doc, between the `<!-- plan:begin -->` / `<!-- plan:end -->` markers of that markdown
file, whose hand-written parts are kept (docs/plan_qwen3_8b.md). `--render=JSON --doc=...`
re-renders without compiling.
"""

import dataclasses
import importlib.metadata
import importlib.util
import json
import math
import os
import re
import time
from collections.abc import Callable

import jax
import jax.numpy as jnp
import ml_collections
from absl import flags

from experiments import targets
from gr2jax import chunks, cli, recipes, stage_registry
from gr2jax import recipe as recipe_lib
from gr2jax.data.batches import Batch
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.diffusion import (
  layout,
  replay,
  speculative,
)
from gr2jax.model import (
  attention,
  qwen3,
)
from gr2jax.model import generate as generate_lib
from gr2jax.model import params as params_lib
from gr2jax.model import sharding as model_sharding
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.train import loop, opd, optim
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import stages as train_stages_lib
from gr2jax.train import state as state_lib
from gr2jax.train import step as step_lib

H100_PEAK_FLOPS = targets.TARGETS["h100"].peak_flops  # bf16 dense, per device
H100_HBM_BYTES_S = targets.TARGETS["h100"].hbm_bytes_s  # H100 SXM HBM3
GIB = 2**30
# The per-device batch of the 8B configs (fsdp 8) is what the one-chip 0.6B plan keeps.
DEVICES_8B = 8
_FLAG = "--xla_force_host_platform_device_count"

FLAGS = flags.FLAGS
# The training stages (gr2jax/stage_registry.py, chain order), then the decoders: plan order.
STAGES = stage_registry.names()
# The stages that sample their rows (a trainer with a prepare, gr2jax/train/stages.py).
ON_POLICY = tuple(n for n in STAGES if train_stages_lib.TRAINERS[n].make_prepare is not None)
PROGRAMS = (*STAGES, "ar_decode", "diffusion_decode", "speculative_decode")


def _xla_option(text: str) -> tuple[str, bool] | None:
  name, _, value = text.partition("=")
  return (name, value == "true") if name and value in ("true", "false") else None


# An --xla_options entry: (name, value).
XLA_OPTION = cli.Item("name=true|false", _xla_option,
                      text=lambda option: f"{option[0]}={str(option[1]).lower()}")


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command-line flags (defined only when run as a script, so importing this module from
  another absl program, e.g. experiments/bench_gpu_check.py, defines nothing), each value
  checked when absl parses it, before anything is compiled."""
  f = {"flag_values": flag_values}
  flags.DEFINE_enum("preset", "qwen3_8b", ["qwen3_8b", "qwen3_0_6b", "tiny"],
                    "Model and shapes (PRESETS).", **f)
  flags.DEFINE_enum("target", "cpu", list(targets.TARGETS), "The compiler: 8 simulated CPU "
                    "devices, or a GPU / TPU compiler without hardware (experiments/targets.py).",
                    **f)
  flags.DEFINE_string("topology", None, "The target's devices (default: 8); GPU "
                      "SLICESxHOSTSxDEVICES (1x1x8, 1x2x4, 1x1x1), TPU the chip grid (2x2x2, "
                      "2x4, 1x1).", **f)
  flags.DEFINE_list("layouts", ["8x1", "4x2"], "Meshes as FSDPxTP over the target's devices.",
                    **f)
  flags.DEFINE_enum("attention", "reference", ["reference", "kernel"], "ModelConfig."
                    "attention_impl of every program: the einsum reference, or the target's "
                    "fused kernel (targets.Target.kernel: cuDNN on GPU, splash on TPU).", **f)
  cli.define_list("stages", list(PROGRAMS), "Which steps to compile.", cli.choice(PROGRAMS), **f)
  flags.DEFINE_integer("points", 2, "Micro-batch sizes compiled per train step: the stage "
                       "config's, then its half (or double); 2 give the memory line.",
                       lower_bound=1, **f)
  flags.DEFINE_bool("verify_flops", True, "Check the FLOP formula against cost_analysis on small "
                    "one-trip configs.", **f)
  cli.define("mfu", 0.4, "Model-FLOP utilisation of the time prediction.",
             cli.number(0, 1, low_open=True), **f)
  cli.define("reserve", 0.1, "Fraction of each card kept free (not given to XLA).",
             cli.number(0, 1, high_open=True), **f)
  cli.define("forwards_per_token", 0.5, "Block-diffusion rollout forwards per output token "
             "(denoising + commit; the tau = 0.9 target), time model.",
             cli.number(0, low_open=True), **f)
  flags.DEFINE_integer("opt_level", 0, "xla_backend_optimization_level of the CPU compiles (0: "
                       "faster compiles; buffer sizes do not depend on it).", lower_bound=0,
                       upper_bound=3, **f)
  cli.define_list("xla_options", [], "XLA options every compile of the run starts with beyond "
                  "the recipe's xla_flags (config xla_flags, those of the target's platform), "
                  "as name=true|false.", XLA_OPTION, allow_empty=True, **f)
  flags.DEFINE_string("compare_block", "plan:targets", "The --doc block --compare fills.", **f)
  flags.DEFINE_list("compare", None, "Only render these saved plan JSONs side by side (one per "
                    "target) into --doc's `plan:targets` block.", **f)
  flags.DEFINE_string("out_dir", "docs", "Where plan_<preset>.json / .md go.", **f)
  flags.DEFINE_bool("append", False, "Merge the rows compiled into the saved plan JSON of the "
                    "same preset, target, topology and attention (merge_plans) instead of "
                    "replacing it: one stage per run, rows accumulate.", **f)
  flags.DEFINE_string("doc", None, "Also replace the generated block of this markdown file.",
                      **f)
  flags.DEFINE_string("render", None, "Only re-render this saved plan JSON (into --doc).", **f)


@dataclasses.dataclass(frozen=True)
class Settings:
  """How the plan compiles and what it assumes (the flags of the same names)."""

  points: int = 2
  mfu: float = 0.4
  reserve: float = 0.1
  forwards_per_token: float = 0.5
  opt_level: int = 0


# ---- shapes ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LossView:
  """What a stage's trainer reads of its view (recipe.StageView) to build its loss
  (train/stages.py TRAINERS' make_loss: `ctx.config.settings`, `.decode`, `.replay_shrink`), a
  recipe's; a plan has no workdir, so no init path or teacher export."""

  settings: stage_registry.StageBlock | None
  decode: DecodeSpec
  replay_shrink: int | None


@dataclasses.dataclass(frozen=True)
class Shapes:
  """The shapes a plan compiles: a recipe's (_from_recipe; gr2jax/recipes.py).

  Attributes:
    model: the AR model as trained (bf16, remat, chunk budget); diffusion stages add the block
      size and the mask token.
    prompt_len, response_len: P and R (paper: prompts ~2,200 tokens, responses ~256).
    block_size: diffusion B (paper: 32).
    max_steps_per_block: the decoder's cap (paper: 64); sets the replay's round count.
    batch_size: {stage: training rows per step (sequences, or prompts of an on-policy stage)}.
    group: {stage: rows of a step per training row (the registry's rows field: the group size
      of an on-policy stage; 1 otherwise)}.
    steps: optimiser steps per stage.
    teacher_dtype: OPD's cached teacher log-probs (config opd.teacher_dtype).
    prepare_chunk: {stage: rows per rollout / prepare-forward call} (config train.prepare_chunk;
      0 = all rows at once).
    micro_batches: {stage: gradient-accumulation micro-batches per step} (config
      train.micro_batches): the micro-batch every target compiles first.
    xla_flags: the recipe's XLA flags (config xla_flags): every compile for a target starts
      with those of its platform (targets.recipe_options).
    views: {stage: LossView}: what the stage's trainer builds its loss from (train/stages.py
      TRAINERS), the recipe's.
  """

  model: ModelConfig
  prompt_len: int
  response_len: int
  block_size: int
  max_steps_per_block: int
  batch_size: dict
  group: dict
  steps: dict
  views: dict
  teacher_dtype: str = "float32"
  prepare_chunk: dict = dataclasses.field(default_factory=dict)
  micro_batches: dict = dataclasses.field(default_factory=dict)
  xla_flags: tuple = ()

  def diffusion(self) -> ModelConfig:
    return dataclasses.replace(self.model, block_size=self.block_size,
                               mask_token_id=self.model.vocab_size - 1)

  def rows(self, stage: str) -> int:
    """Sequences per step of `stage` (an on-policy stage's trajectories: prompts x group)."""
    return self.batch_size[stage] * self.group[stage]

  @property
  def rounds(self) -> int:
    return replay.rounds_needed(self.block_size, self.max_steps_per_block)


def recipe_config(name: str, variant: str = "") -> ml_collections.ConfigDict:
  """Recipe `variant` as stage `name`'s config (`experiments/run.py --config=<name>.py`), what a
  run of that stage reads."""
  return recipes.config(variant, name)


def stage_config(name: str, variant: str = "") -> ml_collections.ConfigDict:
  """The training settings of stage `name` in recipe `variant` (gr2jax/recipes.py's
  `stages.<name>`: train, optimizer, its own block), what a run of that stage uses."""
  return recipe_config(name, variant).stages[name]


def _from_recipe(variant: str, model: ModelConfig, per_device_of: int = 1) -> Shapes:
  """The Shapes of recipe `variant` (gr2jax/recipes.py: every row count, group size, step count,
  the block size and step cap, OPD's teacher dtype, the prepare chunks, the micro-batches and
  the XLA flags) for `model` at the paper's P and R (~2,200 prompt and ~256 response tokens: a
  data build gives a run its own). `per_device_of=8` keeps the per-device rows of a recipe
  written for 8 devices on one device (prepare chunks / 8, micro-batches x 8)."""
  c = recipe_config("table2", variant)
  st = c.stages
  train = {name: st[name].train for name in STAGES}
  recipe = recipe_lib.from_config(c)
  own = {name: recipe.stages[name].own for name in STAGES}
  return Shapes(
    model=model, prompt_len=2200, response_len=256, block_size=c.decode.block_size,
    max_steps_per_block=c.decode.max_steps_per_block,
    batch_size={name: t.batch_size for name, t in train.items()},
    group={name: stage_registry.spec(name).rows_per_prompt(own[name]) for name in STAGES},
    steps={name: t.steps for name, t in train.items()},
    teacher_dtype=st.opd.opd.teacher_dtype, xla_flags=tuple(c.xla_flags),
    prepare_chunk={name: train[name].prepare_chunk // per_device_of for name in ON_POLICY},
    micro_batches={name: t.micro_batches * per_device_of for name, t in train.items()},
    views={name: LossView(own[name], recipe.decode, recipe.replay_shrink
                          if stage_registry.spec(name).diffusion else None) for name in STAGES})


def _presets() -> dict:
  train = dict(param_dtype="bfloat16", compute_dtype="bfloat16", remat="full")
  return {
    "qwen3_8b": _from_recipe("qwen3_8b", ModelConfig.qwen3_8b(attention_chunk_bytes=1 << 30,
                                                              **train)),
    # Qwen3-0.6B on one chip with the 8B recipe's shapes, steps and batches and its per-device
    # rows (micro-batches x 8, rollout calls / 8: SFT / CFT 4 rows per micro-batch, AR RL 8,
    # OPD / RL 2, rollout calls of 32 rows): the 8B plan's memory on one device.
    "qwen3_0_6b": _from_recipe("qwen3_8b", ModelConfig.qwen3_0_6b(
      attention_chunk_bytes=1 << 30, **train), per_device_of=DEVICES_8B),
    "tiny": _compile_test(_from_recipe("", ModelConfig.tiny(attention_chunk_bytes=1 << 24,
                                                             **train))),
  }


# The compile-test preset's rows per step: a multiple of the 8 simulated devices.
TINY_ROWS = 16


def _compile_test(s: Shapes) -> Shapes:
  """A compile-test shape (not a recipe) from the tiny recipe's Shapes `s`: every program of the
  plan in seconds on CPU. P = 48, R = 16, B = 4, a step cap of 8, 10 steps per stage; each
  stage's rows per prompt are the recipe's (its registry rows field, s.group), with the fewest
  prompts whose rows are a multiple of TINY_ROWS (SFT 16 x 1, AR RL 2 x 8, OPD 4 x 4): shapes
  for every stage of gr2jax/stage_registry.py, a new one included."""
  return dataclasses.replace(
    s, prompt_len=48, response_len=16, block_size=4, max_steps_per_block=8,
    batch_size={name: TINY_ROWS // math.gcd(TINY_ROWS, g) for name, g in s.group.items()},
    steps=dict.fromkeys(s.group, 10))


PRESETS = _presets()


# ---- FLOPs -----------------------------------------------------------------------------------


def forward_flops(config: ModelConfig, tokens: float, pairs: float, queries: float) -> float:
  """Matmul FLOPs of one forward (2 per multiply-add).

  Args:
    config: the model.
    tokens: tokens through the layers.
    pairs: attention (query, key) pairs scored.
    queries: positions where the LM head runs.

  Returns:
    L (tokens x 2 (D (N + 2K) H + N H D + 3 D F) + pairs x 4 N H) + queries x 2 D V.
  """
  c = config
  per_token = 2 * c.hidden_size * (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
  per_token += 2 * c.num_heads * c.head_dim * c.hidden_size
  per_token += 6 * c.hidden_size * c.intermediate_size
  per_pair = 4 * c.num_heads * c.head_dim
  return c.num_layers * (tokens * per_token + pairs * per_pair) + queries * 2 * c.hidden_size * (
    c.vocab_size)


def causal_pairs(n: int) -> int:
  return n * (n + 1) // 2


def layout_pairs(config: ModelConfig, p: int, r: int, streams: int) -> int:
  """Attention pairs the two-stream layout allows for one full-length row (prompt P, response R)."""
  noisy = jnp.zeros((1, streams, r), bool)
  inputs = layout.two_stream_inputs(config, jnp.zeros((1, p), jnp.int32), jnp.array([p]),
                                    jnp.zeros((1, r), jnp.int32), jnp.array([r]), noisy)
  return int(jnp.sum(inputs.mask))


@dataclasses.dataclass(frozen=True)
class Work:
  """One forward's shape per row: tokens, allowed and dense attention pairs, LM-head queries."""

  tokens: int
  pairs: int
  dense_pairs: int
  queries: int

  def model_flops(self, config):
    return forward_flops(config, self.tokens, self.pairs, self.queries)

  def dense_flops(self, config):
    return forward_flops(config, self.tokens, self.dense_pairs, self.queries)


# ---- train stages ----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TrainStage:
  """A train step to plan.

  Attributes:
    name: the stage.
    config: the model it trains.
    rows: sequences per optimiser step.
    loss: loss_fn(params, batch, key) (train/step.py contract).
    batch: rows -> {name: (shape, dtype)}.
    work: one row's forward (Work).
    prepare: per row, host-side forwards before the step: [(config, Work)] (teacher, pi_old).
    rollout: per row, the decoder that samples it: (config, block_size, forwards per token: None
      = the plan's --forwards_per_token, 1.0 = the slow decode) or None.
  """

  name: str
  config: ModelConfig
  rows: int
  loss: Callable
  batch: Callable[[int], dict]
  work: Work
  prepare: tuple = ()
  rollout: tuple | None = None


def train_stages(s: Shapes) -> dict[str, TrainStage]:
  """Every training stage of gr2jax/stage_registry.py at the shapes of `s`: its model and kind,
  rows, rollout and prepare from its declaration; its loss as its trainer builds it
  (train/stages.py TRAINERS) from the recipe's view of the stage, decoding at these shapes."""
  p, r = s.prompt_len, s.response_len
  i32, f32 = jnp.int32, jnp.float32
  ar, diff = s.model, s.diffusion()
  teacher_dtype = opd.TEACHER_DTYPES[s.teacher_dtype]
  rp = layout.padded_width(r, s.block_size)

  # Each Batch field's (shape, dtype) at n rows; a stage's batch holds the fields its loss reads
  # (what the loop places: step.Loss.fields, declared by the loss's module).
  field_specs = {
    "prompt_tokens": lambda n: ((n, p), i32), "prompt_lengths": lambda n: ((n,), i32),
    "response_tokens": lambda n: ((n, r), i32), "response_lengths": lambda n: ((n,), i32),
    "response_weights": lambda n: ((n, r), f32), "example_mask": lambda n: ((n,), f32),
    "advantages": lambda n: ((n,), f32), "logp_old": lambda n: ((n, r), f32),
    "trace_tokens": lambda n: ((n, r), i32), "commit_step": lambda n: ((n, r), i32),
    "teacher_log_probs": lambda n: ((n, r, diff.vocab_size), teacher_dtype),
  }

  # The replayed batches (an on-policy diffusion stage's) replay s.rounds rounds.
  rounds = replay.Rounds(s.rounds)

  def loss(name, config):
    """(loss_fn, the Batch fields it reads) as the stage's trainer builds them: the recipe's
    view of the stage with this plan's block size and step cap."""
    view = s.views[name]
    view = dataclasses.replace(view, decode=dataclasses.replace(
      view.decode, block_size=s.block_size, max_steps_per_block=s.max_steps_per_block))
    context = loop.Context(view, config, None, None, None, p, r, None, "")
    built = train_stages_lib.TRAINERS[name].make_loss(context)
    if "replay_rounds" not in built.fields:
      return built.fn, built.fields
    return (lambda params, batch, key: built.fn(params, batch.replace(replay_rounds=rounds), key),
            built.fields)

  # [prompt | response], causal; the LM head at the R response queries (sft.py, the AR policy).
  ar_scored = Work(p + r, causal_pairs(p + r), (p + r) ** 2, r)
  n_cft = p + 3 * rp
  cft_work = Work(n_cft, layout_pairs(diff, p, r, 2), n_cft ** 2, r)
  n_replay = p + (1 + s.rounds) * rp
  replay_work = Work(n_replay, layout_pairs(diff, p, r, s.rounds), n_replay ** 2, r)

  def model(name, fields=("replay_rounds",)):
    """(config, work) of a stage's model: AR scores [prompt | response]; a diffusion stage
    replays its rollouts (a loss reading replay_rounds), else trains the two-stream CFT
    layout."""
    if not stage_registry.spec(name).diffusion:
      return ar, ar_scored
    return diff, replay_work if "replay_rounds" in fields else cft_work

  def stage(name):
    declared = stage_registry.spec(name)
    # The replay's rounds (static) are given, not the batch's.
    fn, fields = loss(name, diff if declared.diffusion else ar)
    config, work = model(name, fields)
    batch = lambda n: {f: field_specs[f](n) for f in fields if f != "replay_rounds"}
    if name not in ON_POLICY:
      return TrainStage(name, config, s.rows(name), fn, batch, work)
    block = s.block_size if declared.diffusion else 1
    if "teacher_log_probs" not in fields and "logp_old" not in fields:
      # OPD's 'self' objective: its targets are its own slow decode (one token per forward),
      # trained with CFT's loss; no rollout is scored before the step.
      return TrainStage(name, config, s.rows(name), fn, batch, work, rollout=(config, block, 1.0))
    # Sampled by its own decoder; its prepare scores the rollouts with its teacher, else itself.
    return TrainStage(name, config, s.rows(name), fn, batch, work,
                      prepare=(model(declared.teacher or name),),
                      rollout=(config, block, None))

  return {name: stage(name) for name in STAGES}


def _optimizer():
  return optim.make_optimizer(stage_registry.OptimizerSettings(
    learning_rate=1e-5, warmup_steps=10, total_steps=1000))


def _memory(compiled) -> dict:
  m = compiled.memory_analysis()
  out = {"argument": m.argument_size_in_bytes, "output": m.output_size_in_bytes,
         "alias": m.alias_size_in_bytes, "temp": m.temp_size_in_bytes}
  out["total"] = out["argument"] + out["output"] - out["alias"] + out["temp"]
  return out


class CompileError(RuntimeError):
  """A compile that failed with no documented fix (targets.FIXES); `failures` verbatim."""

  def __init__(self, failures: list[dict]):
    super().__init__(failures[-1]["error"])
    self.failures = failures


def _compile(lowered, target: targets.Target, opt_level: int, fixes: dict | None = None):
  """Compiles for `target`; a failure with a documented fix (targets.FIXES) is recorded verbatim
  and the compile repeated with the fix. `fixes` holds the fixes a run has needed so far: they
  apply from the start, and a new one is added (one failure per run, not one per program).

  Returns:
    (compiled, {'options': the XLA options it compiled with, 'failures': [{'options', 'error'}]}).

  Raises:
    CompileError: a failure without a fix (or the fix failed too).
  """
  fixes = {} if fixes is None else fixes
  fix, failures = dict(fixes) or None, []
  while True:
    options = target.compiler_options(fix, opt_level)
    try:
      return lowered.compile(compiler_options=options), {"options": options,
                                                         "failures": failures}
    except Exception as e:  # XLA raises JaxRuntimeError / XlaRuntimeError subclasses
      failures.append({"options": options, "error": str(e)})
      print(f"[plan] compile failed with {options}: {str(e)[:300]}", flush=True)
      new = targets.fix_for(target, str(e))
      if new is None or new == fix:
        raise CompileError(failures) from e
      fix = {**(fix or {}), **new}
      fixes.update(new)


def _specs(fields: dict, sharding) -> Batch:
  return Batch(**{k: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
                  for k, (shape, dtype) in fields.items()})


def compile_train_step(stage: TrainStage, mesh, micro_rows: int, opt_level: int = 0,
                       target: targets.Target = targets.TARGETS["cpu"],
                       fixes: dict | None = None) -> dict:
  """Compiles the stage's real step (global batch, micro-batches of `micro_rows`) on `mesh` (of
  `target`'s devices)."""
  optimizer = _optimizer()
  abstract = state_lib.abstract_state(params_lib.abstract_params(stage.config), optimizer)
  shardings = state_lib.state_shardings(stage.config, abstract, mesh)
  abstract = jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                          abstract, shardings)
  batch_sh = mesh_lib.batch_sharding(mesh)
  batch = _specs(stage.batch(stage.rows), batch_sh)
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    step = step_lib.make_train_step(stage.loss, optimizer,
                                    micro_batches=stage.rows // micro_rows,
                                    state_shardings=shardings, batch_sharding=batch_sh)
    lowered = step.lower(abstract, batch)
    lower_s = time.perf_counter() - start
    compiled, record = _compile(lowered, target, opt_level, fixes)
  return {"micro_rows": micro_rows, "micro_batches": stage.rows // micro_rows,
          "lower_s": lower_s, "compile_s": time.perf_counter() - start - lower_s,
          "memory": _memory(compiled), **record, "compiled": compiled}


def memory_line(points: list[dict]) -> Callable[[int], float]:
  """micro rows -> total bytes per device, the line through the compiled points (flat with one:
  then only the compiled micro-batch is known)."""
  xs = [pt["micro_rows"] for pt in points]
  ys = [pt["memory"]["total"] for pt in points]
  slope = (ys[-1] - ys[0]) / (xs[-1] - xs[0]) if len(xs) > 1 else 0.0
  return lambda m: ys[0] + slope * (m - xs[0])


def fit_micro_rows(points: list[dict], rows: int, multiple: int, budget: float):
  """The largest micro-batch (a multiple of `multiple` dividing `rows`) whose predicted total
  fits `budget` bytes, from the line through the compiled points; None if none fits. With one
  point only micro-batches up to the compiled one are judged (memory grows with the rows).

  Returns:
    (micro_rows or None, predicted total bytes (at the smallest micro-batch judged when none
    fits), whether it was compiled).
  """
  xs = [pt["micro_rows"] for pt in points]
  predict = memory_line(points)
  top = rows if len(xs) > 1 else xs[0]
  smallest = multiple if len(xs) > 1 else xs[0]
  best = None
  for m in range(multiple, top + 1, multiple):
    if rows % m == 0 and predict(m) <= budget:
      best = m
  if best is None:
    return None, predict(smallest), smallest in xs
  return best, predict(best), best in xs


# ---- decoders --------------------------------------------------------------------------------


def param_specs(config, mesh, *, decoding: bool = False) -> dict:
  """The params as ShapeDtypeStructs with their shardings on `mesh`; `decoding`: in the decoders'
  layout (params.layer_list: a buffer per layer, q, k and v fused), as a decode step takes them."""
  abstract = (params_lib.abstract_decoding_params if decoding else params_lib.abstract_params)
  return jax.tree.map(lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
                      abstract(config),
                      model_sharding.param_shardings(config, mesh, decoding=decoding))


def compile_decoder(kind: str, s: Shapes, mesh, rows: int, opt_level: int = 0,
                    target: targets.Target = targets.TARGETS["cpu"],
                    fixes: dict | None = None) -> dict:
  """Compiles AR sampling (prefill + decode loop), block-diffusion decoding or greedy
  draft-and-verify (the diffusion drafter and the AR verifier both resident; K = B) of `rows`
  prompts."""
  config = (s.model if kind == "ar_decode" else s.diffusion())
  config = dataclasses.replace(config, remat="none")
  params = param_specs(config, mesh)
  p, r = s.prompt_len, s.response_len
  batch_sh = mesh_lib.batch_sharding(mesh)
  tokens = jax.ShapeDtypeStruct((rows, p), jnp.int32, sharding=batch_sh)
  lengths = jax.ShapeDtypeStruct((rows,), jnp.int32, sharding=batch_sh)
  key = jax.eval_shape(lambda: jax.random.key(0))
  if kind == "ar_decode":
    decoding = generate_lib.ARDecoding(max_new_tokens=r, temperature=1.0)

    def fn(params, tokens, lengths, key):
      logits, cache = qwen3.ragged_prefill(params, config, tokens, lengths,
                                           init_cache(config, rows, p + r), read_cache=False)
      return generate_lib.decode(params, config, cache, logits, key, decoding)[0]
  elif kind == "speculative_decode":
    verifier = dataclasses.replace(s.model, remat="none")
    decoding = speculative.DraftDecoding(max_new_tokens=r, k=s.block_size, draft_tau=0.9,
                                         draft_steps=s.max_steps_per_block)
    params = (params, param_specs(verifier, mesh))

    def fn(params, tokens, lengths, key):
      return speculative.speculative_generate(
        speculative.Model(params[0], config), speculative.Model(params[1], verifier), tokens,
        lengths, decoding, key=key)
  else:
    def fn(params, tokens, lengths, key):
      return diffusion_decode.block_diffusion_generate(
        params, config, tokens, lengths, diffusion_decode.BlockDecoding(
          threshold=0.9, max_steps_per_block=s.max_steps_per_block, max_new_tokens=r,
          temperature=1.0), key=key)
  start = time.perf_counter()
  with jax.set_mesh(mesh):
    lowered = jax.jit(fn).lower(params, tokens, lengths, key)
    lower_s = time.perf_counter() - start
    compiled, record = _compile(lowered, target, opt_level, fixes)
  return {"rows": rows, "lower_s": lower_s, "compile_s": time.perf_counter() - start - lower_s,
          "memory": _memory(compiled), **record, "compiled": compiled}


def decode_seconds(config: ModelConfig, rows: int, p: int, r: int, block: int, devices: int,
                   tp: int, settings: Settings,
                   target: targets.Target = targets.TARGETS["cpu"],
                   forwards_per_token: float | None = None) -> dict:
  """Time model of one rollout batch (module docstring): per forward max(FLOPs at the MFU,
  weights / tp + the rows' KV cache read at HBM bandwidth), per device of `target`; a block
  decode takes forwards_per_token x r forwards (None: settings.forwards_per_token)."""
  kv_per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 2  # bf16 K + V
  weights = params_lib.param_count(config) * 2 - config.vocab_size * config.hidden_size * 2
  flops = forward_flops(config, rows * p, rows * causal_pairs(p), rows)
  rate = settings.mfu * target.peak_flops * devices
  seconds = max(flops / rate,
                (weights / tp + rows * p * kv_per_slot / devices) / target.hbm_bytes_s)
  per_token = settings.forwards_per_token if forwards_per_token is None else forwards_per_token
  num_forwards = r if block == 1 else math.ceil(per_token * r)
  for i in range(num_forwards):
    cache = p + (i + 1) * r / num_forwards
    width = 1 if block == 1 else block
    f = forward_flops(config, rows * width, rows * width * cache, rows * width)
    read = weights / tp + rows * cache * kv_per_slot / devices
    seconds += max(f / rate, read / target.hbm_bytes_s)
    flops += f
  return {"flops": flops, "forwards": num_forwards + 1, "seconds": seconds}


# ---- FLOP check ------------------------------------------------------------------------------


def verify_flops(names=None) -> list[dict]:
  """The FLOP formula vs cost_analysis where every loop has one trip (module docstring).

  Small 8B-shaped configs (1 layer, one attention chunk, no remat, one micro-batch, one device):
  fwd + bwd of each loss = 3 x forward with dense attention.

  Args:
    names: the train stages to check (default all).

  Returns:
    [{'loss', 'analytic', 'cost_analysis', 'ratio'}].
  """
  base = dict(vocab_size=8192, hidden_size=512, num_layers=1, num_heads=8, num_kv_heads=2,
              head_dim=64, intermediate_size=1536, attention_chunk_bytes=1 << 40,
              param_dtype="float32", compute_dtype="float32")
  # Two rows per step: two sequences, or one prompt's group of two.
  group = {n: 2 if stage_registry.spec(n).rows_field else 1 for n in STAGES}
  small = Shapes(model=ModelConfig(**base), prompt_len=96, response_len=32, block_size=8,
                 max_steps_per_block=8, batch_size={n: 2 // g for n, g in group.items()},
                 group=group, steps={},
                 views=PRESETS["tiny"].views)  # the tiny recipe's settings (FLOPs ignore them)
  rows = []
  for name, stage in train_stages(small).items():
    if names is not None and name not in names:
      continue
    params = params_lib.abstract_params(stage.config)
    batch = _specs(stage.batch(stage.rows), None)
    grad = jax.jit(jax.grad(lambda p, b, loss=stage.loss: loss(p, b, jax.random.key(0))[0]))
    with attention.two_stream_path(False):  # the formula's dense attention (the kernels')
      cost = grad.lower(params, batch).compile().cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    analytic = 3 * stage.rows * stage.work.dense_flops(stage.config)
    rows.append({"loss": name, "analytic": analytic, "cost_analysis": float(cost["flops"]),
                 "ratio": float(cost["flops"]) / analytic})
    print(f"[flops] {name}: analytic {analytic:.4g} cost_analysis {cost['flops']:.4g} ratio "
          f"{rows[-1]['ratio']:.3f}", flush=True)
  return rows


# ---- the plan --------------------------------------------------------------------------------


def _layout(text: str) -> tuple[int, int]:
  fsdp, tp = text.lower().split("x")
  return int(fsdp), int(tp)


def micro_points(stage: TrainStage, s: Shapes, multiple: int, points: int) -> list[int]:
  """The micro-batch rows to compile: the stage config's (rows / train.micro_batches, raised to
  the next multiple of the batch shards dividing the rows), then its half (or else its double)
  for the memory line."""
  valid = [m for m in range(multiple, stage.rows + 1, multiple) if stage.rows % m == 0]
  if not valid:
    raise ValueError(f"{stage.name}: {stage.rows} rows per step cannot split over {multiple} "
                     f"batch shards")
  stated = stage.rows // s.micro_batches.get(stage.name, 1)
  first = min((m for m in valid if m >= stated), default=valid[-1])
  rest = [m for m in (first // 2, first * 2) if m in valid and m != first]
  return [first, *rest][:points]


def custom_calls(compiled) -> dict:
  """{custom-call target: count} in the compiled HLO (cuBLAS, cuDNN, Mosaic kernels...)."""
  found = re.findall(r'custom_call_target="([^"]+)"', compiled.as_text())
  return {name: found.count(name) for name in sorted(set(found))}


def _point(compile_fn, *args) -> dict:
  """One compile as a JSON-able dict: the memory, the options, the failures verbatim."""
  try:
    out = compile_fn(*args)
  except CompileError as e:
    return {"error": e.failures[-1]["error"], "failures": e.failures}
  out["custom_calls"] = custom_calls(out.pop("compiled"))
  return out


def plan_train(stage: TrainStage, s: Shapes, mesh, fsdp: int, tp: int, settings: Settings,
               target: targets.Target = targets.TARGETS["cpu"],
               fixes: dict | None = None) -> dict:
  multiple = mesh_lib.batch_size_multiple(mesh)
  devices = fsdp * tp
  points, failed = [], []
  for m in micro_points(stage, s, multiple, settings.points):
    point = _point(compile_train_step, stage, mesh, m, settings.opt_level, target, fixes)
    (failed if "error" in point else points).append({"micro_rows": m, **point})
    if "error" in point:
      print(f"[plan] {stage.name} {fsdp}x{tp} micro {m}: FAILED", flush=True)
      continue
    mem = point["memory"]
    print(f"[plan] {stage.name} {fsdp}x{tp} micro {m}: total {mem['total'] / GIB:.1f} GiB "
          f"(arg {mem['argument'] / GIB:.1f}, temp {mem['temp'] / GIB:.1f}); compile "
          f"{point['compile_s']:.0f} s", flush=True)
  model = 3 * stage.rows * stage.work.model_flops(stage.config)
  executed = 4 * stage.rows * stage.work.dense_flops(stage.config)  # fwd + bwd + remat forward
  rate = settings.mfu * target.peak_flops * devices
  step_s = model / rate
  steps = s.steps[stage.name]
  row = {"kind": "train", "stage": stage.name, "mesh": f"{fsdp}x{tp}", "rows": stage.rows,
         "tokens_per_row": stage.work.tokens, "points": points, "failed": failed,
         "config_micro_rows": stage.rows // s.micro_batches.get(stage.name, 1),
         "model_flops": model, "executed_flops": executed, "step_s": step_s, "steps": steps}
  for card, capacity in target.cards.items():
    if not points:
      row[f"fit_{card}"] = None
      continue
    m, predicted, compiled = fit_micro_rows(points, stage.rows, multiple,
                                            capacity * (1 - settings.reserve))
    row[f"fit_{card}"] = {"micro_rows": m, "micro_batches": stage.rows // m if m else None,
                          "predicted_total": predicted, "compiled": compiled,
                          "judged_from": multiple if len(points) > 1 else points[0]["micro_rows"]}
  extra = 0.0
  for config, work in stage.prepare:
    extra += stage.rows * work.model_flops(config) / rate
  if stage.rollout is not None:
    config, block, per_token = stage.rollout
    chunk = rollout_rows(s, stage.name)
    extra += math.ceil(stage.rows / chunk) * decode_seconds(
      config, chunk, s.prompt_len, s.response_len, block, devices, tp, settings,
      target, per_token)["seconds"]
  row["prepare_s"] = extra
  row["stage_h"] = steps * (step_s + extra) / 3600
  return row


# The train stages whose rollouts each decoder samples (none: one row per batch shard).
DECODER_STAGES = {
  "ar_decode": tuple(n for n in ON_POLICY if not stage_registry.spec(n).diffusion),
  "diffusion_decode": tuple(n for n in ON_POLICY if stage_registry.spec(n).diffusion),
  "speculative_decode": ()}


def rollout_rows(s: Shapes, stage: str) -> int:
  """Rows one rollout call of an AR RL / OPD / RL step decodes: its trajectories, in calls of the
  stage config's train.prepare_chunk (gr2jax/chunks.py)."""
  return chunks.chunk_size(s.rows(stage), s.prepare_chunk.get(stage, 0))


def plan_decoder(kind: str, s: Shapes, mesh, fsdp: int, tp: int, settings: Settings,
                 target: targets.Target = targets.TARGETS["cpu"],
                 fixes: dict | None = None) -> dict:
  rows = max((rollout_rows(s, stage) for stage in DECODER_STAGES[kind]),
             default=mesh_lib.batch_size_multiple(mesh))
  config = s.model if kind == "ar_decode" else s.diffusion()
  block = 1 if kind == "ar_decode" else s.block_size
  devices = fsdp * tp
  timing = decode_seconds(config, rows, s.prompt_len, s.response_len, block, devices, tp,
                          settings, target)
  row = {"kind": "decode", "stage": kind, "mesh": f"{fsdp}x{tp}", "rows": rows,
         "prompt_len": s.prompt_len, "new_tokens": s.response_len, **timing,
         **_point(compile_decoder, kind, s, mesh, rows, settings.opt_level, target, fixes)}
  if "error" in row:
    print(f"[plan] {kind} {fsdp}x{tp} rows {rows}: FAILED", flush=True)
    return row
  mem = row["memory"]
  models = 2 if kind == "speculative_decode" else 1  # drafter + verifier resident
  params_dev = models * params_lib.param_count(config) * 2 / devices
  per_row = max(mem["total"] - params_dev, 0) / (rows / mesh_lib.batch_size_multiple(mesh))
  row["per_row_bytes"] = per_row
  for card, capacity in target.cards.items():
    room = capacity * (1 - settings.reserve) - params_dev
    row[f"rows_per_shard_{card}"] = int(room // per_row) if per_row else None
  print(f"[plan] {kind} {fsdp}x{tp} rows {rows}: total {mem['total'] / GIB:.1f} GiB "
        f"(arg {mem['argument'] / GIB:.1f}, temp {mem['temp'] / GIB:.1f}); compile "
        f"{row['compile_s']:.0f} s", flush=True)
  return row


def versions() -> dict:
  """The installed compiler packages (the plan's provenance)."""
  out = {}
  for name in ("jax", "jaxlib", "jax-cuda12-plugin", "jax-cuda12-pjrt", "nvidia-cuda-nvcc-cu12",
               "nvidia-cudnn-cu12", "libtpu"):
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      pass
  return out


def with_attention(s: Shapes, impl: str) -> Shapes:
  """The shapes with every program's attention_impl set ('reference', 'cudnn', 'splash')."""
  return dataclasses.replace(s, model=dataclasses.replace(s.model, attention_impl=impl))


def run_plan(preset: str, layouts: list[str], stages: list[str], settings: Settings | None = None,
             verify: bool = True, target: str = "cpu", topology: str | None = None,
             save: Callable[[dict], None] | None = None, attention: str = "reference",
             options: dict | None = None) -> dict:
  """Compiles every requested step on every layout; returns the plan dict.

  Args:
    preset: a PRESETS key.
    layouts: meshes as 'FSDPxTP' (e.g. '8x1', '4x2') over the target's devices.
    stages: train stages (train_stages) and/or 'ar_decode', 'diffusion_decode'.
    settings: Settings.
    verify: also run verify_flops (on the CPU; the CPU target only).
    target: a targets.TARGETS key.
    topology: the target's devices (targets.devices; default its 8-device topology).
    save: called with the plan so far after every row (a long run keeps what it compiled).
    attention: 'reference' or 'kernel' (the target's fused attention, targets.Target.kernel).
    options: XLA options every compile starts with beyond the recipe's xla_flags of the
      target's platform (targets.recipe_options); a failure with a documented fix
      (targets.FIXES) is recorded verbatim and the fix added.
  """
  settings = Settings() if settings is None else settings
  tgt = targets.get_target(target)
  impl = tgt.kernel if attention == "kernel" else "reference"
  s = with_attention(PRESETS[preset], impl)
  train = train_stages(s)
  unknown = set(stages) - {*train, *DECODER_STAGES}
  if unknown:
    raise ValueError(f"unknown stages {sorted(unknown)}")
  t0 = time.perf_counter()
  result = {"preset": preset, "target": target, "attention": impl,
            "topology": topology or tgt.default_topology, "settings": dataclasses.asdict(settings),
            "mfu": settings.mfu, "reserve": settings.reserve,
            "peak_flops": tgt.peak_flops, "hbm_bytes_s": tgt.hbm_bytes_s, "cards": tgt.cards,
            "jax": jax.__version__, "versions": versions(),
            "shapes": {k: v for k, v in dataclasses.asdict(s).items() if k != "model"},
            "model": dataclasses.asdict(s.model), "params": params_lib.param_count(s.model),
            "rows": []}
  recipe_options = targets.recipe_options(tgt, s.xla_flags)
  result["recipe_options"] = recipe_options
  # + the documented fixes the run needs (targets.FIXES)
  fixes = {**recipe_options, **(options or {})}
  for text in layouts:
    fsdp, tp = _layout(text)
    mesh, _ = targets.target_mesh(target, topology, fsdp, tp)
    result["device_kind"] = mesh.devices.flat[0].device_kind
    for name in stages:
      if name in train:
        row = plan_train(train[name], s, mesh, fsdp, tp, settings, tgt, fixes)
      else:
        row = plan_decoder(name, s, mesh, fsdp, tp, settings, tgt, fixes)
      result["rows"].append(row)
      result["wall_s"] = time.perf_counter() - t0
      if save is not None:
        save(result)
  if verify and tgt.platform == "cpu":
    result["flop_check"] = verify_flops()
  result["wall_s"] = time.perf_counter() - t0
  return result


# ---- report ----------------------------------------------------------------------------------


def _gib(x):
  return f"{x / GIB:.1f}"


def _fit(fit: dict | None) -> str:
  if fit is None:
    return "not compiled (failures below)"
  if fit["micro_rows"] is None:
    rows = fit.get("judged_from")
    where = f"{rows} rows" if rows else "1 row/shard"
    return f"**no** ({where}: {_gib(fit['predicted_total'])} GiB)"
  mark = "" if fit["compiled"] else " (pred.)"
  return f"{fit['micro_rows']} x {fit['micro_batches']}{mark}"


def _first_line(error: str) -> str:
  return error.strip().splitlines()[0][:400].replace("|", "\\|")


def _options(point: dict) -> str:
  """The XLA options a compile needed beyond the target's defaults (targets.FIXES)."""
  fixed = {k: v for k, v in point.get("options", {}).items()
           if k != "xla_backend_optimization_level"}
  return "".join(f" `--{k}={str(v).lower()}`" for k, v in fixed.items())


def markdown(result: dict) -> str:
  """The plan's tables (train steps, decoders, failures, FLOP check) as markdown."""
  target = result.get("target", "cpu")
  where = ("8 simulated devices" if target == "cpu" else
           f"target `{target}` ({result['device_kind']}, topology {result['topology']}, "
           f"compile-only), attention `{result.get('attention', 'reference')}`")
  cards = list(result["cards"])
  lines = [f"Preset `{result['preset']}` ({result['params'] / 1e9:.2f}B params), jax "
           f"{result['jax']}, {where}; {result['mfu']:.0%} MFU of "
           f"{result['peak_flops'] / 1e12:.0f} TFLOP/s per device; cards keep "
           f"{result['reserve']:.0%} free. Plan wall time {result['wall_s'] / 60:.1f} min."]
  if result.get("versions"):
    lines.append("Packages: " + ", ".join(f"{k} {v}" for k, v in result["versions"].items())
                 + ".")
  if result.get("recipe_options"):
    lines.append("XLA options from the recipe's xla_flags (every compile):"
                 + _options({"options": result["recipe_options"]}) + ".")
  shapes = result.get("shapes", {})
  if "prepare_chunk" in shapes:
    calls = ", ".join(f"{k} {v or 'all'}" for k, v in shapes["prepare_chunk"].items())
    lines.append(f"From the stage configs: OPD's cached teacher log-probs in "
                 f"{shapes['teacher_dtype']}; rows per rollout / prepare-forward call: {calls}.")
  fits = " | ".join(f"{c}: micro rows x M" for c in cards)
  lines += ["", f"| stage | mesh fsdp x tp | step batch (rows x tokens) | GiB/device at micro "
                f"rows (arg / temp) | {fits} | model TFLOP/step | step s | prepare s | steps | "
                f"stage h |", "|" + "---|" * (9 + len(cards))]
  failures = []
  for r in result["rows"]:
    if r["kind"] != "train":
      continue
    mem = ", ".join(f"{p['micro_rows']}: {_gib(p['memory']['total'])} "
                    f"({_gib(p['memory']['argument'])} / {_gib(p['memory']['temp'])})"
                    f"{_options(p)}" for p in r["points"])
    mem = ", ".join(filter(None, [mem] + [f"{p['micro_rows']}: failed" for p in
                                          r.get("failed", [])]))
    failures += [(r["stage"], r["mesh"], p) for p in r["points"] + r.get("failed", [])
                 if p.get("failures")]
    fit = " | ".join(_fit(r[f"fit_{c}"]) for c in cards)
    lines.append(f"| {r['stage']} | {r['mesh']} | {r['rows']} x {r['tokens_per_row']} | {mem} | "
                 f"{fit} | {r['model_flops'] / 1e12:,.0f} | {r['step_s']:.1f} | "
                 f"{r['prepare_s']:.1f} | {r['steps']} | {r['stage_h']:.1f} |")
  decoders = [r for r in result["rows"] if r["kind"] == "decode"]
  if decoders:
    fits = " / ".join(cards)
    lines += ["", f"| decoder | mesh | rows per call x (prompt + new) | GiB/device (arg / temp) | "
                  f"rows per batch shard that fit {fits} | forwards | s per call |",
              "|" + "---|" * 7]
    for r in decoders:
      failures += [(r["stage"], r["mesh"], r)] if r.get("failures") else []
      if "error" in r:
        mem, fit = "failed", "-"
      else:
        m = r["memory"]
        mem = f"{_gib(m['total'])} ({_gib(m['argument'])} / {_gib(m['temp'])}){_options(r)}"
        fit = " / ".join(str(r[f"rows_per_shard_{c}"]) for c in cards)
      lines.append(f"| {r['stage']} | {r['mesh']} | {r['rows']} x ({r['prompt_len']} + "
                   f"{r['new_tokens']}) | {mem} | {fit} | {r['forwards']} | "
                   f"{r['seconds']:.1f} |")
  if failures:
    lines += ["", "| compile failure (first line; verbatim in the JSON) | options | avoided by |",
              "|---|---|---|"]
    for stage, mesh, point in failures:
      fixed = "error" not in point
      for f in point["failures"]:
        lines.append(f"| {stage} {mesh}: `{_first_line(f['error'])}` | {f['options'] or '-'} | "
                     f"{_options(point).strip() if fixed else '**none: not compiled**'} |")
  calls = [(r["stage"], r["mesh"], c) for r in result["rows"] for c in
           ([r] if r["kind"] == "decode" else r["points"]) if c.get("custom_calls")]
  if calls:
    lines += ["", "| program | custom calls in the compiled HLO (count) |", "|---|---|"]
    for stage, mesh, c in calls:
      micro = f" micro {c['micro_rows']}" if "micro_rows" in c else ""
      found = ", ".join(f"`{k}` {v}" for k, v in c["custom_calls"].items())
      lines.append(f"| {stage} {mesh}{micro} | {found} |")
  if result.get("flop_check"):
    lines += ["", "| FLOP check (1 layer, 1 chunk, 1 micro-batch) | analytic | cost_analysis | "
                  "ratio |", "|---|---|---|---|"]
    for r in result["flop_check"]:
      lines.append(f"| {r['loss']} | {r['analytic']:.4g} | {r['cost_analysis']:.4g} | "
                   f"{r['ratio']:.3f} |")
  return "\n".join(lines) + "\n"


def compare_markdown(results: list[dict]) -> str:
  """One table, one column per target: GiB per device at the stage config's micro-batch (compiled,
  or on the memory line: 'pred.') with its temporaries, and the largest micro-batch that fits
  the target's card (rows x micro-batches)."""
  def label(r):
    kernel = r.get("attention", "reference")
    return f"{r.get('target', 'cpu')} {r.get('topology', '8')}" + (
      "" if kernel == "reference" else f" {kernel}")
  head = " | ".join(f"{label(r)} ({', '.join(r['cards'])}): GiB (temp); fits" for r in results)
  lines = [f"| stage | mesh | rows x tokens | config micro rows | {head} |",
           "|" + "---|" * (4 + len(results))]
  keys = []  # the (stage, mesh) rows that two plans share (all rows of a single plan)
  for r in results:
    keys += [(x["stage"], x["mesh"]) for x in r["rows"] if (x["stage"], x["mesh"]) not in keys]
  count = lambda key: sum(any((x["stage"], x["mesh"]) == key for x in r["rows"]) for r in results)
  keys = [k for k in keys if count(k) >= min(2, len(results))]
  for stage, mesh in keys:
    cells, first = [], None
    for r in results:
      row = next((x for x in r["rows"] if (x["stage"], x["mesh"]) == (stage, mesh)), None)
      if row is None:
        cells.append("-")
        continue
      first = first or row
      card = list(r["cards"])[0]
      if row["kind"] == "decode":
        mem = row.get("memory")
        cells.append("failed" if "error" in row else
                     f"{_gib(mem['total'])} ({_gib(mem['temp'])}){_options(row)}; "
                     f"{row[f'rows_per_shard_{card}']} rows/shard")
        continue
      if not row["points"]:
        cells.append("failed")
        continue
      micro = row.get("config_micro_rows",
                      row["rows"] // PRESETS[r["preset"]].micro_batches.get(stage, 1))
      at = next((p for p in row["points"] if p["micro_rows"] == micro), None)
      total = at["memory"]["total"] if at else memory_line(row["points"])(micro)
      temp = f" ({_gib(at['memory']['temp'])})" if at else " (pred.)"
      cells.append(f"{_gib(total)}{temp}{_options(at or row['points'][0])}; "
                   f"{_fit(row[f'fit_{card}'])}")
    if first["kind"] == "decode":
      shape, micro = f"{first['rows']} x ({first['prompt_len']} + {first['new_tokens']})", "-"
    else:
      shape = f"{first['rows']} x {first['tokens_per_row']}"
      micro = first.get("config_micro_rows", first["rows"] // PRESETS[
        results[0]["preset"]].micro_batches.get(stage, 1))
    lines.append(f"| {stage} | {mesh} | {shape} | {micro} | {' | '.join(cells)} |")
  return "\n".join(lines) + "\n"


def doc_block(result: dict) -> str:
  """The doc block a plan run fills: `plan` (the CPU proxy of the 8B preset, as before), else
  `plan:<preset>:<target>`."""
  target = result.get("target", "cpu")
  kernel = "" if result.get("attention", "reference") == "reference" else ":kernel"
  return "plan" if (result["preset"], target, kernel) == ("qwen3_8b", "cpu", "") else (
    f"plan:{result['preset']}:{target}{kernel}")


def update_doc(path: str, table: str, block: str = "plan") -> None:
  """Replaces the text between `<!-- {block}:begin -->` and `<!-- {block}:end -->` in `path`
  (appends the block when absent); the rest of the file is kept."""
  text = open(path).read() if os.path.exists(path) else ""
  begin, end = f"<!-- {block}:begin -->", f"<!-- {block}:end -->"
  block = f"{begin}\n{table}{end}"
  if begin in text and end in text:
    text = text[:text.index(begin)] + block + text[text.index(end) + len(end):]
  else:
    text = f"{text.rstrip()}\n\n{block}\n" if text else f"{block}\n"
  with open(path, "w") as f:
    f.write(text)


MERGE_KEYS = {"preset": None, "target": None, "topology": None, "attention": "reference"}  # what
#   two merged plans share (the default of a key older plans lack)


def merge_plans(old: dict, new: dict) -> dict:
  """`new` with the rows of `old` it did not compile again (a row of `new` replaces `old`'s row
  of the same (stage, mesh)), in PROGRAMS order; the wall time is the sum.

  Raises:
    ValueError: the plans differ in a MERGE_KEYS field.
  """
  for key, default in MERGE_KEYS.items():
    if old.get(key, default) != new.get(key, default):
      raise ValueError(f"--append: the saved plan has {key}={old.get(key)!r}, this run "
                       f"{new.get(key)!r}")
  fresh = {(r["stage"], r["mesh"]): r for r in new["rows"]}
  rows = [fresh.pop((r["stage"], r["mesh"]), r) for r in old["rows"]] + list(fresh.values())
  rows.sort(key=lambda r: PROGRAMS.index(r["stage"]))
  return {**new, "rows": rows, "wall_s": old["wall_s"] + new["wall_s"]}


def use_host_devices(count: int = 8) -> None:
  """CPU backend with `count` host devices; must run before JAX initialises its backend."""
  if _FLAG not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {_FLAG}={count}".strip()
  jax.config.update("jax_platforms", "cpu")


_LAYOUT = re.compile(r"[1-9]\d*x[1-9]\d*")
# The compile-only packages each accelerator platform's deviceless compiler needs
# (requirements-aot.txt; scripts/setup.sh installs them).
AOT_PACKAGES = {"cuda": ("jax_plugins.xla_cuda12", "jax-cuda12-plugin"),
                "tpu": ("libtpu", "libtpu")}


def check_flags(layouts, target: str, find_spec=None) -> None:
  """Refuses flags the plan cannot run with, in one line naming the flag and what it allows:
  a --layouts entry that is not FSDPxTP with positive sizes, a --target whose compile-only
  package is not installed (with its install line).

  Args:
    layouts: the --layouts entries.
    target: the --target name (targets.TARGETS).
    find_spec: importlib.util.find_spec (a stand-in in tests).

  Raises:
    ValueError: naming the flag (main prints it as one line).
  """
  find_spec = find_spec or importlib.util.find_spec
  bad = [text for text in layouts if not _LAYOUT.fullmatch(text.lower())]
  if bad or not layouts:
    raise ValueError(f"--layouts={','.join(layouts)}: each entry is FSDPxTP with positive "
                         f"sizes, e.g. 8x1,4x2 (got {bad or 'none'})")
  platform = targets.get_target(target).platform
  if platform in AOT_PACKAGES:
    module, package = AOT_PACKAGES[platform]
    try:
      found = find_spec(module) is not None
    except ModuleNotFoundError:
      found = False
    if not found:
      raise ValueError(
        f"--target={target} compiles with XLA's {platform} compiler, which needs the "
        f"compile-only package {package} (not installed): pip install -r requirements-aot.txt")


def main(argv):
  del argv
  if not FLAGS.compare and not FLAGS.render:
    try:
      check_flags(FLAGS.layouts, FLAGS.target)
    except ValueError as e:
      raise SystemExit(str(e)) from None
  if FLAGS.compare:  # the targets side by side, from saved plans
    results = []
    for path in FLAGS.compare:
      with open(path) as f:
        results.append(json.load(f))
    table = compare_markdown(results)
    if FLAGS.doc:
      update_doc(FLAGS.doc, table, FLAGS.compare_block)
    print(table)
    return
  if FLAGS.render:  # re-render a saved plan (e.g. after editing the doc's hand-written parts)
    with open(FLAGS.render) as f:
      result = json.load(f)
  else:
    use_host_devices()
    settings = Settings(points=FLAGS.points, mfu=FLAGS.mfu, reserve=FLAGS.reserve,
                        forwards_per_token=FLAGS.forwards_per_token, opt_level=FLAGS.opt_level)
    os.makedirs(FLAGS.out_dir, exist_ok=True)
    name = f"plan_{FLAGS.preset}" + ("" if FLAGS.target == "cpu" else f"_{FLAGS.target}") + (
      "" if FLAGS.attention == "reference" else "_kernel")

    path = os.path.join(FLAGS.out_dir, f"{name}.json")
    saved = None
    if FLAGS.append and os.path.exists(path):
      with open(path) as f:
        saved = json.load(f)

    def merged(result):  # this run's rows, with --append the saved plan's others
      return result if saved is None else merge_plans(saved, result)

    def save(result):
      with open(path, "w") as f:
        json.dump(merged(result), f, indent=1, default=float)

    result = run_plan(FLAGS.preset, FLAGS.layouts, FLAGS.stages, settings, FLAGS.verify_flops,
                      FLAGS.target, FLAGS.topology, save, FLAGS.attention,
                      dict(FLAGS.xla_options))
    save(result)
    result = merged(result)
  table = markdown(result)
  if FLAGS.doc:
    update_doc(FLAGS.doc, table, doc_block(result))
  elif not FLAGS.render:
    with open(os.path.join(FLAGS.out_dir, f"{name}.md"), "w") as f:
      f.write(table)
  print(table)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
