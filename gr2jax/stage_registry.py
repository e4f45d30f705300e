"""The training stages, one declaration each: everything else about a stage is derived from it.

  sft    GR2 SFT (AR), from the model (a preset, or the converted HF checkpoint)
  ar_rl  GR2 GRPO on AR rollouts, from the SFT export             (its block: `rl`)
  cft    masked-diffusion fine-tuning, from the AR RL export        (its block: `cft`)
  opd    on-policy distillation, from the CFT export; teacher: AR RL (its block: `opd`)
  rl     trace-replay GRPO, from the OPD export                    (its block: `rl`)

A `StageSpec` names the stage, the stage whose export it starts from, its kind (AR or block
diffusion), its teacher, its block of own settings (the ConfigDict key under
`stages.<stage>.`, and the typed frozen class the recipe turns it into) and the settings field
that multiplies the rows of a step (the group size). From `STAGES`, the recipe derives the
chain, the inits and the stage views (gr2jax/recipe.py), the recipes loop over it for their
values (gr2jax/recipes.py, whose `STAGE_VALUES` holds each stage's values per scale),
StageSettings checks the rows of a step, experiments/run.py runs every stage from one config
file (`--config=<stage>.py`: experiments/configs/stage.py), experiments/plan.py takes its stages
and their shapes from it, and each trainer registers itself under the same name where it is
defined (gr2jax/train/stages.py `@trainer`).

Every block is declared on the one settings schema (gr2jax/settings.py): a stage's `train` and
`optimizer` blocks (TrainSettings, OptimizerSettings: every stage has them), its own block (a
`StageBlock` subclass), and `StageSettings`, the three together, which checks the rule between
them (the rows of a step split into micro-batches). A bad value is a ValueError naming its path
(`stages.ar_rl.rl.group_size=0 must be >= 2`).
"""

import dataclasses

from gr2jax import settings


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainSettings(settings.Settings):
  """A stage's training run: its length, batches, checkpoints, evaluations and probe."""
  WHERE = "train."
  steps: int = settings.integer(doc="optimiser steps (the run ends there; step-capped, not "
                                "epochs)", minimum=1)
  batch_size: int = settings.integer(doc="rows per step (RL / OPD: prompts per step, each with "
                                     "G rollouts)", minimum=1)
  micro_batches: int = settings.integer(1, doc="gradient-accumulation micro-batches per step",
                                        minimum=1)
  prepare_chunk: int = settings.integer(
    0, doc="rows per rollout / prepare-forward call of the on-policy stages (0 = all rows at "
    "once; else a multiple of the mesh's batch shards)", minimum=0)
  seed: int = settings.integer(0, doc="init, shuffling and per-step randomness "
                               "(fold_in(key, step))")
  save_every: int = settings.integer(doc="steps between run checkpoints", minimum=1)
  keep: int = settings.integer(3, doc="run checkpoints kept", minimum=1)
  async_save: bool = settings.flag(True, doc="orbax async checkpointing")
  eval_every: int = settings.integer(0, doc="steps between periodic evaluations (0 = only the "
                                     "final one)", minimum=0)
  probe_prompts: int = settings.integer(
    0, doc="validation prompts of the held-out probe: the stage's own objective at step 0, "
    "every probe_every steps and the end (train/probe.py; 0 = off)", minimum=0)
  probe_every: int = settings.integer(0, doc="steps between probes (0 = the first and the last "
                                      "only)", minimum=0)
  limit: int = settings.integer(0, doc="use only the first N training examples (0 = all; smoke "
                                "runs)", minimum=0)
  restart: bool = settings.flag(False, doc="move this stage's checkpoints + logs aside and start "
                                "from init (a resume refuses checkpoints of other settings)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OptimizerSettings(settings.Settings):
  """AdamW with a warm-up and a cosine or constant schedule (train/optim.py)."""
  WHERE = "optimizer."
  learning_rate: float = settings.real(doc="peak learning rate", low=0.0, low_open=True)
  warmup_steps: int = settings.integer(doc="linear warm-up steps", minimum=0)
  schedule: str = settings.choice("cosine", doc="'cosine' (to end_lr_factor x lr) or "
                                  "'constant' after the warm-up", choices=("cosine", "constant"))
  end_lr_factor: float = settings.real(0.1, doc="cosine floor as a fraction of the peak",
                                       low=0.0, high=1.0)
  total_steps: int = settings.integer(doc="schedule length (the recipes: train.steps)",
                                      minimum=1)
  b1: float = settings.real(0.9, doc="Adam's first-moment decay", low=0.0, high=1.0,
                            high_open=True)
  b2: float = settings.real(0.98, doc="Adam's second-moment decay", low=0.0, high=1.0,
                            high_open=True)
  eps: float = settings.real(1e-8, doc="Adam's epsilon", low=0.0, low_open=True)
  weight_decay: float = settings.real(0.01, doc="AdamW decay (never on norm scales)", low=0.0)
  clip_norm: float = settings.real(1.0, doc="global-norm clipping (0 = off)", low=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageBlock(settings.Settings):
  """A stage's own block (module docstring)."""

  def rollout(self) -> dict:
    """This stage's rollout settings (train/rollout.make_rollout's keywords: the sampling
    temperature, a diffusion rollout's commit threshold `tau`); {} for a stage without
    rollouts."""
    return {}

  def rows_per_prompt(self, field: str) -> int:
    """Rows of a step per prompt: the declaration's rows field (`field`, e.g. the group size)."""
    return getattr(self, field)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ARRLSettings(StageBlock):
  """GR2 GRPO (train/rl.py): G rollouts per prompt, the ratio clip, the format-reward weight
  (Diffusion-GR2 App. B), the rollouts' sampling temperature, and the advantage weights of the
  validity and speed rewards (train/rl.py reward_weights; an AR rollout's speed never varies)."""
  WHERE = "rl."
  group_size: int = settings.integer(8, doc="G rollouts per prompt (paper: 8; a group of 1 has "
                                     "no variance)", minimum=2)
  eps_low: float = settings.real(0.2, doc="ratio clip 1 - eps_low (paper: symmetric 0.2)",
                                 low=0.0, high=1.0)
  eps_high: float = settings.real(0.2, doc="ratio clip 1 + eps_high (> eps_low = DAPO "
                                  "clip-higher)", low=0.0)
  alpha: float = settings.real(0.2, doc="conditional format-reward weight (Diffusion-GR2 "
                               "App. B)", low=0.0)
  temperature: float = settings.real(1.0, doc="rollout sampling temperature (the log-probs use "
                                     "the same)", low=0.0, low_open=True)
  valid_weight: float = settings.real(0.0, doc="advantage weight of R_valid, z-scored on its "
                                      "own (0 = GR2's reward alone)", low=0.0)
  speed_weight: float = settings.real(0.0, doc="the same of R_speed, a valid rollout's tokens "
                                      "per forward (LightningRL; constant in AR RL)", low=0.0)

  def rollout(self) -> dict:
    return {"temperature": self.temperature}


@dataclasses.dataclass(frozen=True, kw_only=True)
class RLSettings(ARRLSettings):
  """Diffusion RL: AR RL's settings and the rollouts' commit threshold."""
  rollout_tau: float = settings.real(0.9, doc="the rollouts' commit threshold (paper: 0.9)",
                                     low=0.0, high=1.0, low_open=True)

  def rollout(self) -> dict:
    return {"temperature": self.temperature, "tau": self.rollout_tau}


@dataclasses.dataclass(frozen=True, kw_only=True)
class CFTSettings(StageBlock):
  """CFT (train/cft.py): the masking-rate draw and the masks trained."""
  WHERE = "cft."
  eps: float = settings.real(1e-3, doc="per-block masking rate t ~ U(eps, 1)", low=0.0,
                             high=1.0, high_open=True)
  complementary: bool = settings.flag(True, doc="also train the inverted mask (every token "
                                      "supervised per pair)")
  rate_power: float = settings.real(2.0, doc="masking-rate density ~ t^(p-1) (1 = U(eps, 1); "
                                    "2 favours heavily masked blocks)")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OPDSettings(StageBlock):
  """OPD (train/opd.py): the student's trajectories, their threshold and temperature, its
  context, the cached teacher log-probs' dtype, the objective and its certainty weight;
  `teacher` is derived (the teacher stage's export, recipe.stage_config)."""
  WHERE = "opd."
  group_size: int = settings.integer(4, doc="G' student trajectories per prompt (paper: 4)",
                                     minimum=1)
  rollout_tau: float = settings.real(0.9, doc="the student rollouts' commit threshold (paper: "
                                     "0.9); with 'self', the threshold its held-out probe "
                                     "decodes at", low=0.0, high=1.0, low_open=True)
  temperature: float = settings.real(1.0, doc="the student rollouts' sampling temperature (the "
                                     "KL compares the untempered policies)", low=0.0,
                                     low_open=True)
  context: str = settings.choice(
    "commit_step", doc="the student's context of token t: 'commit_step' (its canvas when t was "
    "committed) | 'left_clean' (the paper's (P, o_<t); B - 1 replay rounds)",
    choices=("commit_step", "left_clean"))
  teacher_dtype: str = settings.choice(
    "float32", doc="storage of the cached teacher log-probs [B, M, V] ('bfloat16': half the "
    "memory; the loss reads f32)", choices=("float32", "bfloat16"))
  objective: str = settings.choice(
    "kl", doc="'kl': the forward KL to AR GR2 on the student's rollouts (the paper's); 'self': "
    "CFT's loss on the model's own valid slow-decode answers (train/self_distill.py)",
    choices=("kl", "self"))
  certainty: float = settings.real(0.0, doc="'self': the certainty-forcing weight (dParallel: "
                                   "2; 0 = off)", low=0.0)
  teacher: str = settings.derived("", doc="the teacher stage's export (recipe.stage_config)")

  def rollout(self) -> dict:
    return {"temperature": self.temperature, "tau": self.rollout_tau}

  def rows_per_prompt(self, field: str) -> int:
    """'self' decodes each prompt once (greedy, train/self_distill.py): one row per prompt."""
    return 1 if self.objective == "self" else super().rows_per_prompt(field)


@dataclasses.dataclass(frozen=True)
class StageSpec:
  """One training stage (module docstring).

  Attributes:
    name: the stage (its directory under the workdir, its `--config=<name>.py`, its trainer's
      key).
    init: the stage whose export it starts from; None: the model (a preset, or the converted
      HF checkpoint).
    diffusion: it trains a block-diffusion model (an AR init is converted); False: AR.
    block: the key of its own settings under `stages.<name>.` ('' = none).
    settings: the typed frozen class of that block (None = none).
    teacher: the stage whose export it distils from (its settings' `teacher`), or None.
    rows_field: the settings field that multiplies a step's rows (batch_size x it), or None.
  """
  name: str
  init: str | None
  diffusion: bool
  block: str = ""
  settings: type[StageBlock] | None = None
  teacher: str | None = None
  rows_field: str | None = None

  def rows_per_prompt(self, own: StageBlock | None) -> int:
    """Rows of a step per training row: the own block's (its rows field's value), else 1."""
    return own.rows_per_prompt(self.rows_field) if self.rows_field else 1


# The chain's training stages, in order.
STAGES: dict[str, StageSpec] = {s.name: s for s in (
  StageSpec("sft", init=None, diffusion=False),
  StageSpec("ar_rl", init="sft", diffusion=False, block="rl", settings=ARRLSettings,
            rows_field="group_size"),
  StageSpec("cft", init="ar_rl", diffusion=True, block="cft", settings=CFTSettings),
  StageSpec("opd", init="cft", diffusion=True, block="opd", settings=OPDSettings,
            teacher="ar_rl", rows_field="group_size"),
  StageSpec("rl", init="opd", diffusion=True, block="rl", settings=RLSettings,
            rows_field="group_size"),
)}


def names() -> tuple[str, ...]:
  """The training stages in chain order."""
  return tuple(STAGES)


def spec(name: str) -> StageSpec:
  """The declaration of stage `name`; ValueError naming the stages otherwise."""
  if name not in STAGES:
    raise ValueError(f"{name!r} is not a training stage: {names()}")
  return STAGES[name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageSettings(settings.Settings):
  """A stage's whole block `stages.<name>`: train, optimizer and its own block (`own`, under the
  declaration's block name), and the rule between them: the rows of a step (batch_size x the
  stage's rows field, e.g. its group size) split into train.micro_batches (prepare_chunk need
  not divide them: chunks.map_row_chunks pads the last)."""
  stage: str = settings.text(doc="the stage (its declaration in STAGES)", nonempty="a stage")
  train: TrainSettings = settings.value(doc="the training run", what="TrainSettings",
                                        check=lambda w, n, v: None)
  optimizer: OptimizerSettings = settings.value(doc="the optimiser", what="OptimizerSettings",
                                                check=lambda w, n, v: None)
  own: StageBlock | None = settings.value(None, doc="its own block (None: it has none)",
                                          what="StageBlock", check=lambda w, n, v: None)

  def check(self, where: str) -> None:
    s = spec(self.stage)
    group = s.rows_per_prompt(self.own)
    rows = self.train.batch_size * group
    detail = (f" ({where}train.batch_size={self.train.batch_size} x {s.rows_field}={group})"
              if group > 1 else "")
    if rows % self.train.micro_batches:
      raise ValueError(f"{where}train.micro_batches={self.train.micro_batches} must be a "
                       f"divisor of the {rows} rows per step{detail}")

  @classmethod
  def of_stage(cls, name: str, block, where: str) -> "StageSettings":
    """The settings of stage `name` from its block (a mapping: train, optimizer and its own
    block's name), each checked with its path (`where` = 'stages.<name>.')."""
    s = spec(name)
    keys = {"train", "optimizer", *((s.block,) if s.block else ())}
    unknown = sorted(set(block) - keys)
    if unknown:
      raise ValueError(f"{where}{unknown[0]} is not a block of stage {name!r} (its blocks: "
                       f"{', '.join(sorted(keys))})")
    own = s.settings.of(block[s.block], f"{where}{s.block}.") if s.settings else None
    return cls.of(dict(stage=name, train=TrainSettings.of(block["train"], f"{where}train."),
                       optimizer=OptimizerSettings.of(block["optimizer"], f"{where}optimizer."),
                       own=own), where)

  def to_dict(self) -> dict:
    """As the recipe's ConfigDict block: train, optimizer and the own block under its name."""
    out = {"train": self.train.to_dict(), "optimizer": self.optimizer.to_dict()}
    if self.own is not None:
      out[spec(self.stage).block] = self.own.to_dict()
    return dict(sorted(out.items()))
