"""The held-out probe: a stage's own objective on validation prompts, across its steps.

What an on-policy stage is for is measured by its own objective on users it does not train on,
so each stage shows its own effect (or that it moved nothing):

  - OPD: the forward KL to its teacher on the student's own rollouts at the stage's rollout
    threshold (its loss on held-out prompts); with the 'self' objective, CFT's loss (with its
    certainty term) on its own valid slow-decode answers;
  - AR RL / RL: the mean reward, validity, tokens per forward and kept groups of its rollouts
    (its prepare's stats), and its loss;
  - SFT / CFT: the loss on the held-out prompts' teacher traces;
  - every diffusion stage with a rollout threshold (OPD, RL) also: the validity and forwards per
    token of its greedy decode at that threshold, the one it trains the fast decode for
    (`deployed_valid_rate`, `deployed_forwards_per_token`).

`make_probe` builds, once, the stage's own prepare and loss over the first
`train.probe_prompts` validation prompts (`load`; a fixed set and fixed rollout keys, so two
probes differ only by the params). The loop calls it at step 0, every `train.probe_every`
steps and at the end, and writes `probe/<name>` metrics (train/writer.py: TensorBoard +
metrics.jsonl). The prompts go through in batches of `train.batch_size` (the rollouts' compiled
shapes are the training step's) and the loss in the step's micro-batches, without gradients.
"""

import dataclasses
from collections.abc import Callable

import jax
import numpy as np

from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import prompt_io
from gr2jax.model import sharding as model_sharding
from gr2jax.train import inputs, self_distill
from gr2jax.train import mesh as mesh_lib
from gr2jax.train import step as step_lib

# The split the probe reads: never trained on, never the test users.
SPLIT = "validation"
# The probe's rollout keys: fixed, apart from the training steps' (fold_in(key, step)).
KEY_SEED = 1 << 30


def probe_batches(split: prompt_io.SplitData, *, batch_size: int, **batch_kwargs) -> list:
  """The probe's batches: the split's examples in order, in batches of batch_size (the last one
  padded with example_mask False rows, which no loss or group counts), each with its
  example_index.

  Args:
    split: the probe prompts (SplitData).
    batch_size: rows per batch (train.batch_size).
    **batch_kwargs: inputs.make_batch's prompt_len, response_len, pad_id, lambda_r, lambda_o.
  """
  out = []
  for start in range(0, len(split), batch_size):
    rows = np.arange(start, min(start + batch_size, len(split)))
    batch = inputs.make_batch([split.encoded[i] for i in rows], batch_size=batch_size,
                              **batch_kwargs)
    index = np.concatenate([rows, np.full(batch_size - len(rows), rows[-1])]).astype(np.int32)
    out.append(batch.replace(example_index=index))
  return out


def _mean(values: list[dict]) -> dict:
  return {k: float(np.mean([v[k] for v in values])) for k in values[0]}


def load(ctx, prompts: int) -> prompt_io.SplitData:
  """The probe prompts: the first `prompts` users of the data build's validation split.

  Raises:
    ValueError: a Context without its data build summary (a hand-made one).
  """
  if ctx.summary is None:
    raise ValueError("probe: train.probe_prompts needs the data build (a Context from "
                     "loop.load_context)")
  return prompt_io.load_split(ctx.summary["paths"]["tfds"], SPLIT, ctx.tokenizer, limit=prompts)


def deployed_decode(ctx, stage, split: prompt_io.SplitData):
  """A diffusion stage's greedy decode at its rollout threshold, as stats (self_distill.targets'
  under the name 'deployed'), or None for a stage without one (AR, CFT, SFT)."""
  own = ctx.config.settings
  tau = own.rollout().get("tau") if stage.diffusion and own is not None else None
  if tau is None:
    return None
  spec = dataclasses.replace(ctx.config.decode, eval_tau=tau)
  policy = policy_lib.make_policy(ctx.model_config, spec, ctx.response_len)
  return self_distill.targets(policy, ctx.tokenizer, split.labels,
                              pad_id=ctx.model_config.pad_token_id, name="deployed")


def make_probe(ctx, stage, loss, split: prompt_io.SplitData) -> Callable[[dict], dict]:
  """The stage's held-out probe (module docstring): params -> {metric: float}.

  Args:
    ctx: the run's loop.Context (the model config is the trained one).
    stage: the loop.Stage (its make_prepare, if any, is built again over the probe prompts).
    loss: the stage's step.Loss.
    split: the probe prompts (`load`).
  """
  tcfg = ctx.config.train
  batches = probe_batches(split, batch_size=tcfg.batch_size, prompt_len=ctx.prompt_len,
                          response_len=ctx.response_len, pad_id=ctx.model_config.pad_token_id,
                          lambda_r=ctx.config.data.lambda_r, lambda_o=ctx.config.data.lambda_o)
  prepare = (stage.make_prepare(dataclasses.replace(ctx, train=split))
             if stage.make_prepare else None)
  deployed = deployed_decode(ctx, stage, split)
  sharding = mesh_lib.batch_sharding(ctx.mesh)
  key = jax.random.key(KEY_SEED)

  @jax.jit
  def loss_sums(params, batch, key):
    return step_lib.accumulate(loss.fn, params, batch, key, tcfg.micro_batches, grads=False)

  def probe(params: dict) -> dict:
    stats, totals = [], np.zeros(2)
    for i, batch in enumerate(batches):
      k = jax.random.fold_in(key, i)
      batch_stats = {} if deployed is None else deployed(params, batch, k)[1]
      if prepare is not None:
        batch, stats_of_prepare = prepare(params, batch, k)
        batch_stats |= stats_of_prepare
      placed = model_sharding.global_arrays(batch.select(loss.fields), sharding)
      with jax.set_mesh(ctx.mesh):
        total, weight, _ = jax.device_get(loss_sums(params, placed, k))
      totals += (float(total), float(weight))
      stats.append(batch_stats)
    out = _mean(stats) if stats[0] else {}
    if totals[1] > 0:
      out["loss"] = float(totals[0] / totals[1])
    return out

  return probe
