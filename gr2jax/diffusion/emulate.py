"""Emulated decodes for the speed benchmarks: a recorded run replayed on other weights.

A benchmark times a bigger model than the one trained by running the trained model's recorded
commit schedule on the bigger model's (random) weights, from a prefill done beforehand so that a
timing covers the decode alone (experiments/bench_speedup.py). These emulations run the
decoders' own steps (decode.decode_loop with a commit-count hook; speculative's loop with
`Replayed` rules), so they cost what a decode costs, but their tokens are not a model's output.
The production decoders' jitted loops carry none of it.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.diffusion import decode
from gr2jax.model import params as params_lib
from gr2jax.model.cache import KVCache
from gr2jax.model.config import ModelConfig

# ---- block diffusion -----------------------------------------------------------------------


def _schedule_commits(schedule: jax.Array, block_size: int):
  """decode_loop's `commits` hook: row b's denoising step s commits schedule[b, s] tokens;
  past the schedule's end, and at the capped step, every open position."""
  def commits(denoise_steps, capped):
    at = jnp.minimum(denoise_steps, schedule.shape[1] - 1)[:, None]
    n = jnp.take_along_axis(schedule, at, axis=1)[:, 0]
    return jnp.where(capped | (denoise_steps >= schedule.shape[1]), block_size, n)

  return commits


@functools.partial(jax.jit, static_argnames=("config", "static"))
def _replay(params, config, inputs, schedule, prefilled, *, static):
  if prefilled is None:
    logits, cache = decode.prefill(params, config, inputs, static)
  else:
    cache, logits = prefilled
  return decode.decode_loop(params, config, inputs, static, logits, cache,
                            commits=_schedule_commits(schedule, config.block_size))


def replay(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
           prompt_lengths: jax.Array | None, decoding: decode.BlockDecoding, schedule, *,
           prefilled: tuple[KVCache, jax.Array] | None = None) -> decode.DiffusionOutput:
  """block_diffusion_generate with a recorded commit schedule in place of the threshold rule.

  Args:
    params, config, prompt_tokens, prompt_lengths, decoding: as block_diffusion_generate
      (decoding.threshold is not read but checked).
    schedule: [B, S] int >= 0, the commits of each of a row's denoising steps (indexed by the
      row's denoising steps so far, across blocks; steps past S and the capped step commit every
      open position), e.g. `schedule_from_trace` of a trained model's decode.
    prefilled: (cache, logits [B, V] f32) of an earlier prefill of these prompts
      (`qwen3.ragged_prefill` into a cache of decoding.cache_size slots): the prefill is
      skipped, so a timing covers the decode alone (the loop starts from a copy of the cache).

  Returns:
    DiffusionOutput (its tokens are not a model's output).

  Raises:
    TypeError / ValueError naming the argument: as block_diffusion_generate, a schedule that is
      not [B, S >= 1] int >= 0, prefilled of other rows, vocab or cache size.
  """
  where = "emulate.replay"
  if prefilled is not None and isinstance(decoding, decode.BlockDecoding):
    cache = prefilled[0]
    if not isinstance(cache, KVCache):
      raise TypeError(f"{where}: prefilled[0] must be a KVCache, got {type(cache).__name__}")
    if decoding.cache_size not in (None, cache.max_len):
      raise ValueError(f"{where}: cache_size={decoding.cache_size} != the prefilled cache's "
                       f"{cache.max_len} slots")
    decoding = dataclasses.replace(decoding, cache_size=cache.max_len)
  inputs, static = decode.check_inputs(where, config, prompt_tokens, prompt_lengths, decoding,
                                       None, decode.NO_STEERING)
  b = inputs.prompt_tokens.shape[0]
  schedule = jnp.asarray(schedule)
  if (not jnp.issubdtype(schedule.dtype, jnp.integer) or schedule.ndim != 2
      or schedule.shape[0] != b or schedule.shape[1] < 1):
    raise ValueError(f"{where}: schedule must be an int array [{b}, S >= 1], got "
                     f"{schedule.dtype} {schedule.shape}")
  if int(jnp.min(schedule)) < 0:
    raise ValueError(f"{where}: schedule has a negative commit count {int(jnp.min(schedule))}")
  if prefilled is not None:
    cache, logits = prefilled
    if cache.lengths.shape != (b,):
      raise TypeError(f"{where}: prefilled[0] must be a KVCache of {b} rows")
    if getattr(logits, "shape", None) != (b, config.vocab_size):
      raise ValueError(f"{where}: prefilled[1] must be logits [{b}, {config.vocab_size}], got "
                       f"{getattr(logits, 'shape', None)}")
  return _replay(params_lib.layer_list(params), config, inputs, schedule.astype(jnp.int32),
                 prefilled, static=static)


def schedule_from_trace(commit_step, lengths, block_size: int) -> list[list[int]]:
  """Per row, the commits of each denoising step of a decode (the `schedule` `replay` replays).

  A row's steps are counted across its blocks in order; a step of the last block that committed
  only tokens past the row's length (after its stop token) counts 0, so a replay with
  max_new_tokens = length and no stop tokens runs exactly the recorded forwards.

  Args:
    commit_step: [B, N] DiffusionOutput.commit_step.
    lengths: [B] DiffusionOutput.lengths.
    block_size: B of the decode.

  Returns:
    B lists of per-step commit counts (each sums to the row's non-seed tokens).
  """
  out = []
  for steps, n in zip(np.asarray(commit_step), np.asarray(lengths), strict=True):
    row = []
    for first in range(0, int(n), block_size):
      block = steps[first:min(first + block_size, int(n))]
      block = block[block != decode.SEED_STEP]
      if block.size:
        row += np.bincount(block, minlength=int(block.max()) + 1).tolist()
    out.append(row)
  return out
