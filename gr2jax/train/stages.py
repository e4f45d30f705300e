"""The trainers of the training stages, keyed by their names in gr2jax/stage_registry.py, as
Stage values for the one loop (gr2jax/train/loop.py).

  sft    GR2 SFT: decoupled lambda_r / lambda_o cross-entropy (train/sft.py)
  ar_rl  GR2 GRPO on AR rollouts (train/rl.py), from the SFT export
  cft    masked-diffusion fine-tuning (train/cft.py), from the AR GR2 export converted to B
  opd    on-policy distillation from the frozen AR GR2 (train/opd.py), from the CFT export; or
         (opd.objective 'self') CFT's loss on the model's own valid slow-decode answers
         (train/self_distill.py)
  rl     trace-replay GRPO (train/rl.py), from the OPD export

A trainer is a loss builder and, for an on-policy stage, a prepare builder (`Trainer`); each
reads the stage's typed settings as `ctx.config.settings`. A loss builder registers itself as the
trainer of its stages where it is defined (`@trainer("cft")`, `@trainer("ar_rl", "rl",
prepare=_rl_prepare)`): `TRAINERS` is filled as this module loads; nothing else lists them. Each
loss is a train/step.py `Loss`: the function and the Batch fields it reads (only those go to the
device). The on-policy stages (ar_rl, opd, rl) sample and score with the rollout of the model's
own policy at the run's decode spec and the stage's own rollout settings
(`StageBlock.rollout`: AR RL samples at its `rl.temperature`, RL and OPD at their `temperature`
and commit at their `rollout_tau`; train/rollout.py `make_rollout`) and share one prepare
(train/rollouts.py): AR RL and RL bind the GR2 reward, OPD the teacher.
"""

import dataclasses
import functools
from collections.abc import Callable

from gr2jax import load, stage_registry
from gr2jax.train import cft, opd, rl, rollouts, self_distill, sft
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import rollout as rollout_lib
from gr2jax.train.loop import Context, Stage
from gr2jax.train.step import Loss


@dataclasses.dataclass(frozen=True)
class Trainer:
  """How a stage trains: Context -> step.Loss, and Context -> prepare (rollouts) or None
  (loop.Stage's make_loss / make_prepare)."""
  make_loss: Callable
  make_prepare: Callable | None = None


TRAINERS: dict[str, Trainer] = {}  # the stages of gr2jax/stage_registry.py, by name (@trainer)


def trainer(*names: str, prepare: Callable | None = None) -> Callable:
  """Registers the decorated loss builder (Context -> step.Loss), with its prepare builder
  (Context -> prepare) for an on-policy stage, as the trainer of the stages `names`.

  Raises:
    ValueError: a name that is not a stage of gr2jax/stage_registry.py, or has a trainer.
  """
  def register(make_loss: Callable) -> Callable:
    for name in names:
      stage_registry.spec(name)  # a declared stage (ValueError naming the stages)
      if name in TRAINERS:
        raise ValueError(f"stage {name!r} has a trainer already")
      TRAINERS[name] = Trainer(make_loss, prepare)
    return make_loss
  return register


def _rollout(ctx: Context) -> rollout_lib.Rollout:
  """The trained model's rollout: its own decoder at the run's decode spec and the stage's
  rollout settings (their temperature, and a diffusion stage's commit threshold), responses of
  R tokens."""
  shrink = ctx.config.replay_shrink  # None in an AR stage's view: its rollout replays nothing
  return rollout_lib.make_rollout(ctx.model_config, ctx.config.decode, ctx.response_len,
                                  1 if shrink is None else shrink,
                                  **ctx.config.settings.rollout())


def _chunks(ctx: Context) -> dict:
  """How a prepare cuts its rollouts and forwards: config.train.prepare_chunk rows per call,
  each chunk placed with the batch sharding (gr2jax/chunks.py)."""
  return dict(chunk_rows=ctx.config.train.prepare_chunk,
              sharding=mesh_lib.batch_sharding(ctx.mesh))


@trainer("sft")
def _sft_loss(ctx: Context) -> Loss:
  return Loss(functools.partial(sft.sft_loss, config=ctx.model_config), sft.FIELDS)


def _rl_prepare(ctx: Context):
  c = ctx.config.settings
  reward_fn = rl.answer_rewards(ctx.tokenizer, ctx.train.labels, ctx.model_config.eos_token_ids,
                                alpha=c.alpha)
  weights = rl.reward_weights(c.valid_weight, c.speed_weight)
  return functools.partial(rollouts.prepare, rollout=_rollout(ctx), group_size=c.group_size,
                           reward_fn=reward_fn, reward_weights=weights, **_chunks(ctx))


@trainer("ar_rl", "rl", prepare=_rl_prepare)
def _rl_loss(ctx: Context) -> Loss:
  rollout = _rollout(ctx)
  return Loss(functools.partial(rl.rl_loss, rollout=rollout, eps_low=ctx.config.settings.eps_low,
                                eps_high=ctx.config.settings.eps_high), rl.fields(rollout))


@trainer("cft")
def _cft_loss(ctx: Context) -> Loss:
  c = ctx.config.settings
  return Loss(functools.partial(cft.cft_loss, config=ctx.model_config, eps=c.eps,
                                complementary=c.complementary, rate_power=c.rate_power),
              cft.FIELDS)


def _opd_prepare(ctx: Context):
  if ctx.config.settings.objective == "self":
    return self_distill.targets(_rollout(ctx).policy, ctx.tokenizer, ctx.train.labels,
                                pad_id=ctx.model_config.pad_token_id)
  dtype = opd.TEACHER_DTYPES[ctx.config.settings.teacher_dtype]
  context = ctx.config.settings.context
  teacher_config, teacher_params = load.load_model(ctx.config.settings.teacher)
  teacher = opd.teacher(teacher_params, teacher_config,
                        mask_token_id=ctx.model_config.mask_token_id, dtype=dtype)
  rollout = _rollout(ctx)

  def prepare(params, batch, key):
    train, stats = rollouts.prepare(params, batch, key, rollout=rollout,
                                    group_size=ctx.config.settings.group_size, teacher=teacher,
                                    **_chunks(ctx))
    return opd.student_context(train, context, rollout), stats

  return prepare


@trainer("opd", prepare=_opd_prepare)
def _opd_loss(ctx: Context) -> Loss:
  if ctx.config.settings.objective == "self":  # CFT's loss on its own answers
    return Loss(functools.partial(cft.cft_loss, config=ctx.model_config,
                                  certainty=ctx.config.settings.certainty), cft.FIELDS)
  rollout = _rollout(ctx)
  return Loss(functools.partial(opd.opd_loss, rollout=rollout), opd.fields(rollout))


def stage(name: str) -> Stage:
  """The loop's Stage of a training stage: its trainer, its kind from its declaration.

  Raises:
    ValueError: `name` is not a stage, or no loss builder registered itself for it (@trainer).
  """
  declared = stage_registry.spec(name)
  if name not in TRAINERS:
    raise ValueError(f"stage {name!r} has no trainer: register its loss builder with "
                     f"@trainer({name!r}) (gr2jax/train/stages.py)")
  found = TRAINERS[name]
  return Stage(name, found.make_loss, found.make_prepare, diffusion=declared.diffusion)
