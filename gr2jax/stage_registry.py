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
config_checks.py checks the rows of a step, experiments/run.py runs every stage from one config
file (`--config=<stage>.py`: experiments/configs/stage.py), experiments/plan.py takes its stages
and their shapes from it, and each trainer registers itself under the same name where it is
defined (gr2jax/train/stages.py `@trainer`).

A settings class's fields carry their bounds (`integer`, `real`, `flag`, `choice`, `text`
below); its `__post_init__` checks them with gr2jax/model/validate.py's scalar checks, so a
typed block is valid once built. A bad value is a ValueError naming the field (`group_size=0
must be >= 2`; recipe.from_config prefixes `stages.<stage>.<block>.`).
"""

import dataclasses
import functools

from gr2jax.model import validate


def integer(minimum: int | None = None):
  """A field holding an int >= minimum."""
  return dataclasses.field(metadata={"check": functools.partial(validate.integer,
                                                                minimum=minimum)})


def real(**bounds):
  """A field holding a finite real in an interval (validate.real's keyword bounds)."""
  return dataclasses.field(metadata={"check": functools.partial(validate.real, **bounds)})


def flag():
  """A field holding a bool."""
  return dataclasses.field(metadata={"check": validate.boolean})


def choice(*choices: str):
  """A field holding one of `choices`."""
  return dataclasses.field(metadata={"check": functools.partial(validate.one_of,
                                                                choices=choices)})


def text(default: str | None = None):
  """A field holding a string (checked where it is used); `default` for a derived one."""
  if default is None:
    return dataclasses.field(metadata={})
  return dataclasses.field(default=default, metadata={})


@dataclasses.dataclass(frozen=True)
class Settings:
  """A stage's own settings: every field checked at construction (module docstring)."""

  def __post_init__(self):
    for f in dataclasses.fields(self):
      check = f.metadata.get("check")
      if check is not None:
        check("", f.name, getattr(self, f.name))

  def rollout(self) -> dict:
    """This stage's rollout settings (train/rollout.make_rollout's keywords: the sampling
    temperature, a diffusion rollout's commit threshold `tau`); {} for a stage without
    rollouts."""
    return {}


@dataclasses.dataclass(frozen=True)
class ARRLSettings(Settings):
  """GR2 GRPO (train/rl.py): G rollouts per prompt, the ratio clip, the format-reward weight
  (Diffusion-GR2 App. B), the rollouts' sampling temperature, and the advantage weights of the
  validity and speed rewards (train/rl.py reward_weights; an AR rollout's speed never varies)."""
  group_size: int = integer(2)  # GRPO: a group of 1 has no variance, every group is dropped
  eps_low: float = real(low=0.0, high=1.0)
  eps_high: float = real(low=0.0)
  alpha: float = real(low=0.0)
  temperature: float = real(low=0.0, low_open=True)  # rollouts sample
  valid_weight: float = real(low=0.0)
  speed_weight: float = real(low=0.0)

  def rollout(self) -> dict:
    return {"temperature": self.temperature}


@dataclasses.dataclass(frozen=True)
class RLSettings(ARRLSettings):
  """Diffusion RL: AR RL's settings and the rollouts' commit threshold."""
  rollout_tau: float = real(low=0.0, high=1.0, low_open=True)

  def rollout(self) -> dict:
    return {"temperature": self.temperature, "tau": self.rollout_tau}


@dataclasses.dataclass(frozen=True)
class CFTSettings(Settings):
  """CFT (train/cft.py): the masking-rate draw and the masks trained."""
  eps: float = real(low=0.0, high=1.0, high_open=True)
  complementary: bool = flag()
  rate_power: float = real()


@dataclasses.dataclass(frozen=True)
class OPDSettings(Settings):
  """OPD (train/opd.py): G' student trajectories per prompt, their commit threshold and
  sampling temperature, the student's context, the cached teacher log-probs' dtype, the
  objective ('kl': the forward KL to the AR teacher on the
  student's rollouts; 'self': the model's own valid slow-decode answers, train/self_distill.py)
  and its certainty-forcing weight; `teacher` is derived (the teacher stage's export,
  stage_config)."""
  group_size: int = integer(1)
  rollout_tau: float = real(low=0.0, high=1.0, low_open=True)
  temperature: float = real(low=0.0, low_open=True)  # rollouts sample
  context: str = text()
  teacher_dtype: str = text()
  objective: str = choice("kl", "self")
  certainty: float = real(low=0.0)
  teacher: str = text(default="")

  def rollout(self) -> dict:
    return {"temperature": self.temperature, "tau": self.rollout_tau}


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
  settings: type[Settings] | None = None
  teacher: str | None = None
  rows_field: str | None = None

  def rows_per_prompt(self, settings: Settings | None) -> int:
    """Rows of a step per training row: the rows field's value, else 1."""
    return getattr(settings, self.rows_field) if self.rows_field else 1


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


def settings_of(stage: StageSpec, block, where: str) -> Settings | None:
  """The typed settings of a stage's block (a mapping with the class's fields, the derived ones
  left out), checked; a bad value is a ValueError naming `where` + the field."""
  if stage.settings is None:
    return None
  try:
    return stage.settings(**block)
  except ValueError as e:
    raise type(e)(f"{where}{e}") from None

