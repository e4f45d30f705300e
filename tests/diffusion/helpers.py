"""The diffusion tests' shorthands: block_diffusion_generate with its settings as keywords, the
replay of a decoder output, the self-speculative verifier."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.diffusion import decode, replay, speculative
from gr2jax.model.config import ModelConfig

_DECODING = {f.name for f in dataclasses.fields(decode.BlockDecoding)}
_STEERING = {f.name for f in dataclasses.fields(decode.Steering)}


def generate(params, config, prompt_tokens, prompt_lengths, *, key=None, **kw):
  """decode.block_diffusion_generate with BlockDecoding / Steering fields as keywords."""
  unknown = set(kw) - _DECODING - _STEERING
  if unknown:
    raise TypeError(f"unknown keywords {sorted(unknown)}")
  decoding = decode.BlockDecoding(**{k: v for k, v in kw.items() if k in _DECODING})
  steering = decode.Steering(**{k: v for k, v in kw.items() if k in _STEERING})
  return decode.block_diffusion_generate(params, config, prompt_tokens, prompt_lengths, decoding,
                                         key=key, steering=steering)


def trace(prompt_tokens, prompt_lengths, output: decode.DiffusionOutput) -> replay.Trace:
  """The replay.Trace of a decoder output of these prompts."""
  return replay.Trace(prompt_tokens, prompt_lengths, output.trace_tokens, output.commit_step,
                      output.lengths)


@functools.partial(jax.jit, static_argnames=("config", "num_rounds", "temperature", "shrink"))
def _replay_logp(params, config, trace, *, num_rounds, temperature, shrink):
  return replay.replay(params, config, trace, num_rounds=num_rounds, temperature=temperature,
                       shrink=shrink).logp


def replay_log_probs(params: dict, config: ModelConfig, prompt_tokens, prompt_lengths,
                     output: decode.DiffusionOutput, *, block_size: int | None = None,
                     temperature: float = 0.0, shrink: int = 1,
                     num_rounds: int | None = None) -> jax.Array:
  """replay.replay of a decoder output with the fewest rounds it needs (jitted).

  block_size, when given, must equal config.block_size; num_rounds defaults to the trace's
  largest round + 1. Returns the [B, M] f32 log-probs of `output.trace_tokens`, 0 where never
  committed (with shrink = 1 equal to `output.commit_logprob` up to float error).
  """
  if block_size is not None and block_size != config.block_size:
    raise ValueError(
      f"replay_log_probs: block_size={block_size} conflicts with config.block_size="
      f"{config.block_size} (the block size comes from the model config)"
    )
  if num_rounds is None:
    rounds = np.asarray(replay.replay_rounds(output.commit_step, shrink))
    used = rounds[(rounds != decode.SEED_STEP) & (rounds != decode.NEVER_STEP)]
    num_rounds = int(used.max()) + 1 if used.size else 0
  replay.check_rounds(output.commit_step, num_rounds, shrink)
  prompts = replay.Trace(jnp.asarray(prompt_tokens, jnp.int32),
                         jnp.asarray(prompt_lengths, jnp.int32), output.trace_tokens,
                         output.commit_step, output.lengths)
  return _replay_logp(params, config, prompts, num_rounds=num_rounds,
                      temperature=float(temperature), shrink=shrink)


def self_verifier(drafter: speculative.Model) -> speculative.Model:
  """The self-speculative verifier: the drafter's weights at block size 1 (its left-to-right
  mode, decode.py at B = 1); lossless w.r.t. that mode, not w.r.t. another AR model."""
  return speculative.Model(drafter.params, dataclasses.replace(drafter.config, block_size=1))
