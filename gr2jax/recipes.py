"""The named recipes: every setting of a reproduction, in one place (gr2jax/recipe.py types them).

A recipe is one ConfigDict; each config file is a view of it that names the stage to run:

  python experiments/run.py --config=table2.py --workdir=W                (tiny, every stage)
  python experiments/run.py --config=cft.py --workdir=W                   (tiny, the CFT stage)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=/models/Qwen3-8B \
      --workdir=W                                                         (the paper's scale)
  python experiments/run.py --config=table2.py:smoke --workdir=W          (tiny, a few steps)
  python experiments/run.py --config=table2.py:qwen3_0_6b,smoke --config.hf_dir=DIR ...

The variant is `RECIPE[,smoke]` (`smoke` alone = `tiny,smoke`): `smoke` cuts any recipe to a
handful of steps on a few hundred training and 32 evaluation users, and its teacher step to one
batch of 8 users (CI; minutes on 2 CPU cores). Override any field on the
command line: `--config.stages.cft.train.steps=100`, `--config.decode.eval_tau=0.9`,
`--config.data.prompt.history_items=10`; a misspelt field is an error.

Recipes: `tiny` (the CPU default: a from-scratch `tiny` model on the terse prompt) and
`qwen3_0_6b`, `qwen3_1_7b`, `qwen3_4b`, `qwen3_8b`, which start from a local HF Qwen3 directory
(`--config.hf_dir`; the model's dimensions come from its config.json) and use the paper's prompt.
The 8B hyper-parameters are the paper's (Diffusion-GR2, arXiv 2607.01170: CFT 3 epochs, OPD constant
lr 1e-6 at 128 prompts x 1.5k steps, RL G = 8, eps 0.2, alpha 0.2, 600 steps at lr 5e-7) or, where
the paper gives none (SFT, AR RL), ours; micro-batches and rollout chunks are the AOT plan's
(docs/plan_qwen3_8b.md, 8 x 80 GB). The smaller scales are scaled choices of ours, not from a
paper and not tuned: the 8B schedule and batches, learning rates raised as the model shrinks
(x2 at 4B, x3 at 1.7B, x5 at 0.6B) and micro-batches halved per halving of the model below 4B.
"""

import dataclasses
import functools
from collections.abc import Callable

import ml_collections

from gr2jax import recipe as recipe_lib
from gr2jax import settings, stage_registry, table_settings, tool_settings
from gr2jax.data import build_settings
from gr2jax.decoding.spec import DecodeSpec

HF_SCALES = {  # name: (learning-rate factor over 8B, micro-batch divisor vs 8B): scaled choices
  "qwen3_0_6b": (5.0, 4), "qwen3_1_7b": (3.0, 2), "qwen3_4b": (2.0, 1), "qwen3_8b": (1.0, 1)}


def _stage(name: str, steps: int, batch_size: int, save_every: int, learning_rate: float,
           warmup_steps: int, constant: bool = False, **own) -> ml_collections.ConfigDict:
  """Stage `name`'s block as the command line's ConfigDict: its train and optimizer blocks
  (stage_registry.TrainSettings / OptimizerSettings defaults, these values over them;
  optimizer.total_steps follows train.steps) and its own block (its settings class's defaults,
  `own` over them). `constant`: the on-policy stages' schedule, a constant lr after a short
  warm-up and no weight decay (the paper: constant 1e-6 for OPD, 5e-7 for RL)."""
  s = ml_collections.ConfigDict()
  s.train = settings.to_config(stage_registry.TrainSettings, dict(
    steps=steps, batch_size=batch_size, save_every=save_every))
  s.optimizer = settings.to_config(stage_registry.OptimizerSettings, dict(
    learning_rate=learning_rate, warmup_steps=warmup_steps, total_steps=steps,
    **(dict(schedule="constant", weight_decay=0.0) if constant else {})))
  s.optimizer.total_steps = s.train.get_ref("steps")
  spec = stage_registry.spec(name)
  if spec.settings is not None:
    s[spec.block] = settings.to_config(spec.settings, own)
  return s


# The training stages' values (gr2jax/stage_registry.py), one tiny-scale function and one HF-scale
# change per stage; the recipes build `stages` from STAGE_VALUES.


def _sft() -> ml_collections.ConfigDict:
  """SFT: ~38k examples (4 epochs of the 9,199 accepted traces), terse prompt."""
  return _stage("sft", 1200, 32, 200, 2e-3, 100)


def _sft_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  del divisor
  s.train.update(dict(steps=900, batch_size=32))  # ~3 epochs of 9.2k traces at batch 32
  s.optimizer.update(dict(learning_rate=1e-5 * lr_factor, warmup_steps=30))


def _ar_rl() -> ml_collections.ConfigDict:
  """AR RL (GR2 GRPO): 8 prompts x G rollouts per step."""
  return _stage("ar_rl", 60, 8, 20, 1e-4, 5, constant=True)


def _ar_rl_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=600, batch_size=128, micro_batches=16 // divisor,
                      prepare_chunk=256))  # GR2 gives no count: the AOT plan's 600
  s.optimizer.learning_rate = 1e-6 * lr_factor


def _cft() -> ml_collections.ConfigDict:
  """CFT: 10 epochs of the 9,199 tiny traces at peak lr 4e-3 (valid on validation users at lr
  5e-4: .760 / .868 at 1.7 / 3 epochs; at 3 epochs .868 / .908 / .928 / .947 / .937 at lr
  5e-4 / 1e-3 / 2e-3 / 4e-3 / 8e-3; at lr 4e-3 .947 / .972 at 3 / 5 epochs, duplicates
  106 -> 55, docs/results/onpolicy_ablation.md; the 4-layer model's final export at 5 / 10
  epochs, first 2,000 validation users: valid .9825 / .994 at tau 1.0, .971 / .9845 at tau 0.9
  with the paper's commit rule, docs/results/table2.md)."""
  return _stage("cft", 5750, 16, 100, 4e-3, 30)  # rate_power 2 (CFTSettings): valid .696 ->
  #   .765 at tau 1.0 from one AR RL export, docs/results/benchmarks/cft_validity/README.md (h)


def _cft_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  del divisor
  s.train.update(dict(steps=860, batch_size=32))  # paper: 3 epochs of 9.2k at batch 32
  s.optimizer.learning_rate = 1e-5 * lr_factor
  s.cft.rate_power = 1.0  # t ~ U(eps, 1), as proposed (Diffusion-GR2, arXiv 2607.01170, CFT):
  #                         the tiny model's p = 2 is a CPU measurement, untested at scale


def _opd() -> ml_collections.ConfigDict:
  """OPD: 20 x 8 prompts; lr 5e-5 for 40 steps lowered validity .70 -> .30; 5e-6: CFT valid
  .702 -> .733 in 20 steps (README); on validation users 5e-6 gains ~.02 in 100 steps while
  2e-5 collapses by 100 (.78 -> .51) (docs/results/onpolicy_ablation.md)."""
  s = _stage("opd", 20, 8, 20, 5e-6, 2, constant=True)
  s.train.micro_batches = 4  # rollout rows per micro-batch bound the replay's memory
  return s


def _opd_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=1500, batch_size=128, micro_batches=32 // divisor,
                      prepare_chunk=256))  # paper: 128 prompts x ~1.5k steps, 1 epoch
  s.optimizer.learning_rate = 1e-6 * lr_factor  # paper: constant 1e-6
  s.opd.teacher_dtype = "bfloat16"  # f32: [512, 256, 151,936] = 80 GB per step (the plan)


def _rl() -> ml_collections.ConfigDict:
  """Diffusion RL (TraceRL-style GRPO): 4 prompts x G per step; after the 3-epoch CFT and OPD,
  valid on validation users .863 -> .866 / .876 / .875 at 60 / 120 / 180 steps: it stops
  improving by 120; after the 5-epoch CFT, rollout temperatures 0.25-1, rollout taus 0.5-0.9
  and 32 prompts per step all leave tau-0.9 validity within one standard error of CFT's
  (docs/results/onpolicy_ablation.md)."""
  s = _stage("rl", 120, 4, 20, 2e-5, 2, constant=True)
  s.train.micro_batches = 4
  return s


def _rl_hf(s: ml_collections.ConfigDict, lr_factor: float, divisor: int) -> None:
  s.train.update(dict(steps=600, batch_size=128, micro_batches=64 // divisor,
                      prepare_chunk=256))  # paper: 600 steps
  s.optimizer.learning_rate = 5e-7 * lr_factor  # paper: 5e-7


@dataclasses.dataclass(frozen=True)
class StageValues:
  """A training stage's values per scale.

  Attributes:
    tiny: () -> its block at the tiny scale (train, optimizer, its own settings).
    hf: (block, learning-rate factor over 8B, micro-batch divisor vs 8B) -> None: the block
      changed in place to an HF scale (HF_SCALES).
    smoke_rows: a stage with a rows field (gr2jax/stage_registry.py): that field's value in a
      smoke run, which trains 2 prompts per step.
  """
  tiny: Callable[[], ml_collections.ConfigDict]
  hf: Callable[[ml_collections.ConfigDict, float, int], None]
  smoke_rows: int | None = None


# 8 rollout rows per on-policy step in a smoke run (AR RL, RL: 2 prompts x 4; OPD: 2 x 2): at 4 x G
# these steps were most of an HF recipe's smoke (bf16 on CPU, ~1,000-token rows)
STAGE_VALUES = {
  "sft": StageValues(_sft, _sft_hf),
  "ar_rl": StageValues(_ar_rl, _ar_rl_hf, smoke_rows=4),
  "cft": StageValues(_cft, _cft_hf),
  "opd": StageValues(_opd, _opd_hf, smoke_rows=2),
  "rl": StageValues(_rl, _rl_hf, smoke_rows=4),
}


def _tiny() -> ml_collections.ConfigDict:
  """The tiny CPU recipe (docs/calibration_tiny_prompt.md; README Table 2: 43 min on 2 cores)."""
  c = settings.to_config(recipe_lib.RunSettings)  # recipe, hf_dir, upstream, replay_shrink...
  c.data = settings.to_config(build_settings.DataSettings)  # the data build (the prompt in
  #   data.prompt: the tiny one, terse, docs/calibration_tiny_prompt.md)
  c.model = settings.to_config(recipe_lib.ModelBlock)  # the 4-layer `tiny_deep` preset: after
  #   the whole chain, valid on validation users at tau 0.9 .971 against .952 with the 2-layer
  #   `tiny` (docs/results/onpolicy_ablation.md "A deeper tiny model")
  # the one decode spec (its fields, defaults and meaning: gr2jax/decoding/spec.py DecodeSpec);
  # the tiny model commits a token new to the block at one place per step
  # (gr2jax/diffusion/commit.py): tau-0.9 validity +.0065 on validation users for 4% more
  # forwards per token; the paper's rule ('confidence') at the HF scales
  c.decode = settings.to_config(DecodeSpec, dict(commit_order="distinct"))
  c.mesh = settings.to_config(recipe_lib.Mesh)
  c.eval = settings.to_config(recipe_lib.EvalSettings)
  c.table = settings.to_config(table_settings.TableSettings)  # Table 2 / 3 / 4, Figure 6
  c.teacher = settings.to_config(build_settings.TeacherSettings)  # the LLM-teacher step: its
  #   traces become data.teacher_traces ('' hf_dir = the rule teacher)
  c.stages = ml_collections.ConfigDict()
  for name in stage_registry.names():
    c.stages[name] = STAGE_VALUES[name].tiny()
  return c


def _qwen3(c: ml_collections.ConfigDict, name: str) -> None:
  """An HF scale (module docstring for the sources): the paper's prompt, bf16, remat."""
  lr_factor, divisor = HF_SCALES[name]
  c.model.preset = ""  # the model is --config.hf_dir's
  c.decode.commit_order = DecodeSpec().commit_order  # the paper's commit rule
  c.model.remat = "full"
  c.model.param_dtype = "bfloat16"
  c.model.attention_chunk_bytes = 1 << 30  # accelerator-sized attention chunks
  # cuBLAS gemms, not Triton: XLA's H100 compiler (deviceless, default Triton tiles without
  # autotuning) found no tiles for the train steps' dots: "INTERNAL: Couldn't find output tile
  # sizes that satisfy hlo: %dot.721 = bf16[9824,4096]" (8B SFT, fsdp 8) and bf16[20784,1024]
  # (0.6B OPD, one chip); with this flag every 8B / 0.6B program compiled (docs/plan_qwen3_8b.md
  # "On the real compilers"). XLA parses it on every platform; only GPU compiles read it.
  c.xla_flags = ("--xla_gpu_enable_triton_gemm=false",)
  p = c.data.prompt  # the paper's prompt (GR2, arXiv 2602.07774)
  p.style = "chat"
  p.answer_format = "sid"
  p.evidence = "raw"
  p.fields = ("sid", "brand", "leaf", "title")
  p.history_items = 20
  p.max_citations = 3
  c.table.diffusion_splits = ("test_1615", "test")
  t = c.teacher  # the paper's teacher (Qwen3-32B, --config.teacher.hf_dir), GR2's prompt
  t.update(dict(prompt="chat", temperature=0.7, top_p=0.95, max_new_tokens=512, batch_size=64,
                num_users=0))
  for stage in stage_registry.names():
    STAGE_VALUES[stage].hf(c.stages[stage], lr_factor, divisor)


def _smoke(c: ml_collections.ConfigDict) -> None:
  """Every stage, the teacher step and every row on a few examples with a handful of steps
  (CI)."""
  c.data.learned_headroom = False
  c.data.rqvae.epochs = 10
  c.table.splits = ("test_1615",)
  c.table.diffusion_splits = ("test_1615",)
  c.eval.limit = 32  # every split read, Table 3's full split (32 users of `test`) too
  c.eval.batch_size = 16  # two batches of the 32 users: Table 3's tokens/s is timed after the first
  c.decode.max_steps_per_block = 4  # untrained models commit ~1 token per step
  c.table.speed_examples = 4
  c.table.fig6.limit = 8
  c.table.fig6.output_lengths = (16,)  # each forced length compiles two decoders
  c.table.fig6.sweep_examples = 2
  c.table.lossless_drafts = ((c.decode.draft_k, c.decode.draft_tau),)  # one lossless program
  c.table.commit_orders = ("distinct", "confidence")  # every Table 3 row kind, in CI
  c.table.full_split_taus = (0.6,)
  for name, stage in stage_registry.STAGES.items():
    t = c.stages[name].train
    t.update(dict(steps=2, batch_size=4, limit=256, save_every=2, prepare_chunk=0,
                  micro_batches=min(t.micro_batches, 4)))
    if stage.rows_field is not None:  # 2 prompts x STAGE_VALUES' smoke_rows
      t.batch_size = 2
      c.stages[name][stage.block][stage.rows_field] = STAGE_VALUES[name].smoke_rows
  # the teacher step: one batch of 8 users, 2 attempts each (all users: ~1.4 s a user on 2 CPU
  # cores with an HF recipe's 512-token responses, ~9 h)
  t = c.teacher
  t.update(dict(num_users=8, batch_size=8, attempts=min(t.attempts, 2),
                max_new_tokens=min(t.max_new_tokens, 128)))


def _tiny_as_is(c: ml_collections.ConfigDict) -> None:
  """The tiny recipe: `_tiny()` unchanged."""
  del c


# The named recipes: name -> a function that turns the tiny recipe's ConfigDict (`_tiny()`) into
# this recipe in place. A new recipe is a function here (README.md, "How to extend").
RECIPES = {"tiny": _tiny_as_is,
           **{name: functools.partial(_qwen3, name=name) for name in HF_SCALES}}

_BLOCKS = {"eval": ("evaluate", tool_settings.EvaluateSettings),  # the tools' blocks:
           "rerank": ("rerank", tool_settings.RerankSettings),  # config stage -> (field, class)
           "serve": ("serve", tool_settings.ServeSettings)}


def parse_variant(variant: str) -> tuple[str, bool]:
  """(recipe name, smoke) of a variant `RECIPE[,smoke]` ('' = tiny; 'smoke' = tiny,smoke).

  Raises:
    ValueError: an unknown recipe name.
  """
  parts = [p for p in variant.split(",") if p] if variant else []
  smoke = "smoke" in parts
  names = [p for p in parts if p != "smoke"] or ["tiny"]
  if len(names) != 1 or names[0] not in RECIPES:
    raise ValueError(f"unknown variant {variant!r}; expected RECIPE[,smoke] with RECIPE in "
                     f"{list(RECIPES)}, or 'smoke'")
  return names[0], smoke


def config(variant: str = "", stage: str = "table2") -> ml_collections.ConfigDict:
  """The recipe `variant` (`RECIPE[,smoke]`, '' = tiny) as the ConfigDict of `stage`.

  What every config file of experiments/configs/ returns (stage.py for each training stage);
  the command line overrides its fields.

  Args:
    variant: the recipe name, optionally followed by ',smoke'.
    stage: what experiments/run.py runs (its STAGES key); eval, rerank and serve add their
      block.

  Raises:
    ValueError: an unknown recipe name.
  """
  name, smoke = parse_variant(variant)
  c = _tiny()
  RECIPES[name](c)
  c.recipe = name
  if smoke:
    _smoke(c)
  c.stage = stage  # experiments/run.py STAGES key: what this config runs
  if stage in _BLOCKS:
    field, block = _BLOCKS[stage]
    c[field] = settings.to_config(block)
  return c


def schema(c: ml_collections.ConfigDict) -> list[tuple[str, type]]:
  """(block path, its settings class) of every block of a recipe's ConfigDict `c` ('' = the
  top-level fields; a nested block, e.g. data.prompt, is its parent's): the declarations the
  ConfigDict was built from and is read back into (recipe.from_config)."""
  out = [("", recipe_lib.RunSettings), ("data", build_settings.DataSettings),
         ("model", recipe_lib.ModelBlock), ("decode", DecodeSpec), ("mesh", recipe_lib.Mesh),
         ("eval", recipe_lib.EvalSettings), ("table", table_settings.TableSettings),
         ("teacher", build_settings.TeacherSettings)]
  for name in stage_registry.names():
    spec = stage_registry.spec(name)
    out += [(f"stages.{name}.train", stage_registry.TrainSettings),
            (f"stages.{name}.optimizer", stage_registry.OptimizerSettings)]
    if spec.settings is not None:
      out.append((f"stages.{name}.{spec.block}", spec.settings))
  return out + [(field, cls) for field, cls in _BLOCKS.values() if field in c]


def describe(c: ml_collections.ConfigDict) -> list[str]:
  """Every setting of a recipe's ConfigDict `c`, one line each from the schema: `path = value
  (bounds) doc`, the value c's (experiments/run.py --help)."""
  lines = []
  for path, cls in schema(c):
    block = c
    for part in path.split(".") if path else ():
      block = block[part]
    lines += settings.describe(cls, f"{path}." if path else "", block.to_dict())
  return lines


def get(variant: str = "tiny", *, hf_dir: str = ""):
  """The typed recipe (gr2jax.recipe.Recipe) of `variant`, for use from Python.

    recipe = gr2jax.recipes.get("tiny")
    recipe = gr2jax.recipes.get("qwen3_8b", hf_dir="/models/Qwen3-8B")

  Args:
    variant: `RECIPE[,smoke]`.
    hf_dir: the local HF Qwen3 directory of a qwen3_* recipe.
  """
  from gr2jax import recipe

  c = config(variant)
  c.hf_dir = hf_dir
  return recipe.from_config(c)
