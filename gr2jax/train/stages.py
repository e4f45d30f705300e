"""The recipe's training stages as Stage values for the one loop (gr2jax/train/loop.py).

  sft    GR2 SFT: decoupled lambda_r / lambda_o cross-entropy (train/sft.py)
  ar_rl  GR2 GRPO on AR rollouts (train/ar_rl.py), from the SFT export
"""

import functools

from gr2jax.train import ar_rl, sft
from gr2jax.train.loop import Context, Stage


def _sft_loss(ctx: Context):
  return functools.partial(sft.sft_loss, config=ctx.model_config)


def _ar_rl_loss(ctx: Context):
  rl = ctx.config.rl
  return functools.partial(ar_rl.ar_rl_loss, config=ctx.model_config,
                           temperature=rl.temperature, eps_low=rl.eps_low, eps_high=rl.eps_high)


def _ar_rl_prepare(ctx: Context):
  rl = ctx.config.rl
  return functools.partial(ar_rl.prepare, config=ctx.model_config, tokenizer=ctx.tokenizer,
                           labels_of=lambda i: ctx.train.labels[i], group_size=rl.group_size,
                           temperature=rl.temperature, max_new_tokens=ctx.response_len,
                           alpha=rl.alpha)


STAGES = {
  "sft": Stage("sft", _sft_loss),
  "ar_rl": Stage("ar_rl", _ar_rl_loss, _ar_rl_prepare),
}
