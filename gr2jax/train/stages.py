"""The recipe's training stages as Stage values for the one loop (gr2jax/train/loop.py).

  sft    GR2 SFT: decoupled lambda_r / lambda_o cross-entropy (train/sft.py)
  ar_rl  GR2 GRPO on AR rollouts (train/ar_rl.py), from the SFT export
  cft    masked-diffusion fine-tuning (train/cft.py), from the AR GR2 export converted to B
  opd    on-policy distillation from the frozen AR GR2 (train/opd.py), from the CFT export
  rl     trace-replay GRPO (train/trace_rl.py), from the OPD export
"""

import functools

import numpy as np

from gr2jax import checkpoint
from gr2jax.diffusion import replay
from gr2jax.train import ar_rl, cft, opd, rewards, sft, trace_rl
from gr2jax.train import mesh as mesh_lib
from gr2jax.train.loop import Context, Stage


def _sft_loss(ctx: Context):
  return functools.partial(sft.sft_loss, config=ctx.model_config)


def _ar_rl_loss(ctx: Context):
  rl = ctx.config.rl
  return functools.partial(ar_rl.ar_rl_loss, config=ctx.model_config,
                           temperature=rl.temperature, eps_low=rl.eps_low, eps_high=rl.eps_high)


def _chunks(ctx: Context) -> dict:
  """How a prepare cuts its rollouts and forwards: config.train.prepare_chunk rows per call,
  each chunk placed with the batch sharding (gr2jax/chunks.py)."""
  return dict(chunk_rows=ctx.config.train.prepare_chunk,
              sharding=mesh_lib.batch_sharding(ctx.mesh))


def _ar_rl_prepare(ctx: Context):
  rl = ctx.config.rl
  return functools.partial(ar_rl.prepare, config=ctx.model_config, tokenizer=ctx.tokenizer,
                           labels_of=lambda i: ctx.train.labels[i], group_size=rl.group_size,
                           temperature=rl.temperature, max_new_tokens=ctx.response_len,
                           alpha=rl.alpha, **_chunks(ctx))


def _num_rounds(ctx: Context) -> int:
  d = ctx.config.diffusion
  return replay.rounds_needed(ctx.model_config.block_size, d.max_steps_per_block, d.shrink)


def _cft_loss(ctx: Context):
  return functools.partial(cft.cft_loss, config=ctx.model_config, eps=ctx.config.cft.eps,
                           complementary=ctx.config.cft.complementary,
                           rate_power=ctx.config.cft.rate_power)


def _opd_loss(ctx: Context):
  return functools.partial(opd.opd_loss, config=ctx.model_config,
                           shrink=ctx.config.diffusion.shrink)


def _opd_prepare(ctx: Context):
  d = ctx.config.diffusion
  teacher_dtype = opd.teacher_dtype(ctx.config.opd.teacher_dtype)  # checked before loading
  teacher_config, teacher_params = checkpoint.load_model(ctx.config.opd.teacher)
  return functools.partial(
    opd.prepare, config=ctx.model_config, teacher_params=teacher_params,
    teacher_config=teacher_config, group_size=ctx.config.opd.group_size, threshold=d.tau,
    max_steps_per_block=d.max_steps_per_block, max_new_tokens=ctx.response_len,
    temperature=d.temperature, num_rounds=_num_rounds(ctx), shrink=d.shrink,
    teacher_dtype=teacher_dtype, **_chunks(ctx))


def _rl_loss(ctx: Context):
  rl = ctx.config.rl
  d = ctx.config.diffusion
  return functools.partial(trace_rl.trace_rl_loss, config=ctx.model_config,
                           temperature=d.temperature, shrink=d.shrink, eps_low=rl.eps_low,
                           eps_high=rl.eps_high)


def _rl_prepare(ctx: Context):
  d, rl = ctx.config.diffusion, ctx.config.rl

  def reward_fn(tokens, lengths, rows):
    labels = [ctx.train.labels[int(i)] for i in rows["example_index"]]
    reward, _, _ = rewards.rollout_rewards(ctx.tokenizer, tokens, lengths, labels,
                                           np.asarray(rows["target_position"]),
                                           ctx.model_config.eos_token_ids, alpha=rl.alpha)
    return reward

  return functools.partial(
    trace_rl.prepare, config=ctx.model_config, reward_fn=reward_fn, group_size=rl.group_size,
    threshold=d.tau, max_steps_per_block=d.max_steps_per_block, max_new_tokens=ctx.response_len,
    temperature=d.temperature, num_rounds=_num_rounds(ctx), shrink=d.shrink, **_chunks(ctx))


STAGES = {
  "sft": Stage("sft", _sft_loss),
  "ar_rl": Stage("ar_rl", _ar_rl_loss, _ar_rl_prepare),
  "cft": Stage("cft", _cft_loss),
  "opd": Stage("opd", _opd_loss, _opd_prepare),
  "rl": Stage("rl", _rl_loss, _rl_prepare),
}
