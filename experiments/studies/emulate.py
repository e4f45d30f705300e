"""Emulated decodes for the speed benchmarks: a recorded run replayed on other weights.

A benchmark times a bigger model than the one trained by running the trained model's recorded
commit schedule on the bigger model's (random) weights, from a prefill done beforehand so that a
timing covers the decode alone (experiments/studies/bench_speedup.py). These emulations run the
decoders' own steps (decode.loop_step with a recorded commit count, in a loop of their own;
speculative.decode_loop with replaying Rules), so they cost what a decode costs, but their tokens
are not a model's output. The production decoders' jitted loops carry none of it.
`first_divergence` is the benchmarks' (and tests') check of where two decodes that should agree
part.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.diffusion import commit, decode, speculative
from gr2jax.model import params as params_lib
from gr2jax.model import qwen3, validate
from gr2jax.model.cache import KVCache
from gr2jax.model.config import ModelConfig

# ---- block diffusion -----------------------------------------------------------------------


def _schedule_count(schedule: jax.Array, inputs: decode.Inputs, s: decode.LoopState,
                    block_size: int) -> jax.Array:
  """[B] int32 commits of each row's denoising step in state `s`: row b's denoising step i
  commits schedule[b, i] tokens; past the schedule's end, and at the capped step, every open
  position."""
  capped, _ = commit.capped_threshold(s.step, inputs.traced.max_steps_per_block,
                                      inputs.traced.threshold)
  at = jnp.minimum(s.denoise_steps, schedule.shape[1] - 1)[:, None]
  n = jnp.take_along_axis(schedule, at, axis=1)[:, 0]
  return jnp.where(capped | (s.denoise_steps >= schedule.shape[1]), block_size, n)


@functools.partial(jax.jit, static_argnames=("config", "static"))
def _replay(params, config, inputs, schedule, prefilled, *, static):
  """decode.decode_loop with each step's commits taken from `schedule`."""
  if prefilled is None:
    logits, cache = decode.prefill(params, config, inputs, static)
  else:
    cache, logits = prefilled

  def body(s):
    count = _schedule_count(schedule, inputs, s, config.block_size)
    return decode.loop_step(params, config, inputs, static, s, count)

  s = decode.loop_start(config, inputs, static, logits, cache)
  s = jax.lax.while_loop(lambda s: ~jnp.all(s.done), body, s)
  return decode.loop_output(config, static, s)


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


# ---- draft-and-verify ----------------------------------------------------------------------


class _Replayed(speculative.Rules):
  """speculative.Rules replaying a recorded schedule [B, S, 2] int32: (denoising steps,
  accepted drafts) of each verify step, -1 past the row's last."""

  def __init__(self, schedule: jax.Array, spec: speculative.DraftDecoding, mask_token_id):
    super().__init__(spec, mask_token_id)
    self.schedule = schedule

  def _recorded(self, step, field):
    at = jnp.minimum(step, self.schedule.shape[1] - 1)[:, None]
    return jnp.take_along_axis(self.schedule[:, :, field], at, axis=1)[:, 0]

  def draft_steps(self, step):
    """The draft's recorded denoising steps (past the schedule: one)."""
    return jnp.maximum(jnp.where(step < self.schedule.shape[1], self._recorded(step, 0), 1), 1)

  def draft_count(self, capped):
    """One token per denoising step; the capped (last) step the rest."""
    return jnp.where(capped, self.spec.k, 1)

  def accept(self, step, logits, drafts, q_logp, k_eff, key):
    """The recorded acceptances (at most K_eff), then the verifier's greedy token."""
    a = jnp.minimum(self._recorded(step, 1), k_eff)
    greedy = speculative.verifier_greedy(logits, self.mask_token_id)
    return a, jnp.take_along_axis(greedy, a[:, None], axis=1)[:, 0]

  def ended(self, steps):
    """After the row's recorded verify steps."""
    return steps >= jnp.sum(self.schedule[:, :, 0] >= 0, axis=1)


_STATIC = ("config_d", "config_v", "caches")
_prefills = jax.jit(speculative.prefills, static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=(*_STATIC, "spec"))
def _speculative_replay(params_d, params_v, prompt_tokens, prompt_lengths, stop_ids, key,
                        schedule, prefilled, *, config_d, config_v, spec, caches):
  if prefilled is None:
    prefilled = speculative.prefills(params_d, params_v, prompt_tokens, prompt_lengths,
                                     config_d=config_d, config_v=config_v, caches=caches)
  return speculative.decode_loop(
    params_d, params_v, prompt_lengths, stop_ids, key, prefilled,
    _Replayed(schedule, spec, config_v.mask_token_id),
    speculative.Settings(config_d, config_v, spec))[0]


def speculative_prefill(drafter: speculative.Model, verifier: speculative.Model, prompt_tokens,
                        prompt_lengths, spec: speculative.DraftDecoding):
  """Both prefills, as speculative_generate runs them: (verifier cache, verifier logits [B, V],
  drafter cache), for `speculative_replay(prefilled=)` (a timing of the decode alone).
  Arguments as speculative_generate's, checked as there."""
  c = speculative.check_inputs("emulate.speculative_prefill", drafter, verifier,
                               (prompt_tokens, prompt_lengths), spec)
  return _prefills(params_lib.layer_list(c.drafter.params),
                   params_lib.layer_list(c.verifier.params), c.prompt_tokens, c.prompt_lengths,
                   config_d=c.drafter.config, config_v=c.verifier.config, caches=c.slots)


def speculative_replay(drafter: speculative.Model, verifier: speculative.Model,
                       prompt_tokens: jax.Array, prompt_lengths: jax.Array,
                       spec: speculative.DraftDecoding, schedule: jax.Array, *,
                       prefilled: tuple | None = None) -> speculative.SpecOutput:
  """Runs a recorded draft-and-verify schedule on any weights (a speed emulation, not a decode).

  Verify step s of row b drafts as the decoder does (K_eff from the row's position) but with
  exactly `schedule[b, s, 0]` denoising steps (one token per step, the last one the rest), and
  accepts exactly min(schedule[b, s, 1], K_eff) drafts, whatever they are, plus the verifier's
  token; the row ends after its recorded steps. With the recording's spec.max_new_tokens (so K_eff
  follows the same positions) and no stop ids, replaying `schedule_from_output` of a decode runs
  exactly its drafter and verify forwards.

  Args:
    drafter, verifier, prompt_tokens, prompt_lengths: as speculative_generate.
    spec: its DraftDecoding (greedy; max_new_tokens N, the recording's).
    schedule: [B, S, 2] int: (denoising steps, accepted drafts) of each verify step, >= 0, then
      -1 past the row's last step.
    prefilled: optional `speculative_prefill(...)` of these prompts (the loop starts from it).

  Returns:
    SpecOutput (its tokens are not a model's output).
  """
  where = "speculative_replay"
  c = speculative.check_inputs(where, drafter, verifier, (prompt_tokens, prompt_lengths), spec)
  b = c.prompt_tokens.shape[0]
  schedule = validate.integer_array(where, "schedule", schedule, shape=(b, None, 2))
  validate.check_range(where, "schedule", schedule, -1, 2**30)
  if prefilled is not None:
    v_cache, v_logits, d_cache = prefilled
    for name, cache, size in (("prefilled[0]", v_cache, c.slots[0]),
                              ("prefilled[2]", d_cache, c.slots[1])):
      if not isinstance(cache, KVCache) or cache.lengths.shape != (b,) or cache.max_len != size:
        raise ValueError(f"{where}: {name} must be a KVCache of {b} rows and {size} slots "
                         "(speculative_prefill)")
    validate.check_shape(where, "prefilled[1]", v_logits, shape=(b, c.verifier.config.vocab_size))
  return _speculative_replay(
    params_lib.layer_list(c.drafter.params), params_lib.layer_list(c.verifier.params),
    c.prompt_tokens, c.prompt_lengths, c.stop_ids, c.key, jnp.asarray(schedule, jnp.int32),
    prefilled, config_d=c.drafter.config, config_v=c.verifier.config, spec=spec,
    caches=c.slots)


def schedule_from_output(out: speculative.SpecOutput,
                         block_size: int) -> list[list[tuple[int, int]]]:
  """Per row, (denoising steps, accepted drafts) of each verify step: what speculative_replay
  replays. The commit forwards are re-derived from the block alignment (a step opens with one
  when the accepted tokens completed the drafter's block and it drafts).

  Args:
    out: a SpecOutput (host arrays or device arrays).
    block_size: the drafter's B.

  Returns:
    B lists of (denoise, accepted) pairs.
  """
  rows = []
  for b in range(len(out.lengths)):
    n, start, row = 1, 0, []
    for s in range(int(out.verify_forwards[b])):
      drafted, accepted = int(out.step_drafted[b, s]), int(out.step_accepted[b, s])
      commits = int(n >= start + block_size and drafted > 0)
      start += block_size * commits
      row.append((int(out.step_draft_forwards[b, s]) - commits, accepted))
      n += accepted + 1
    rows.append(row)
  return rows




def first_divergence(verifier: speculative.Model, prompt_tokens, prompt_lengths, tokens,
                     reference) -> list:
  """Where two decodes of the same prompts first differ, and how close the verifier was to a tie.

  Args:
    verifier: the Model both decodes should follow.
    prompt_tokens: [B, P] right-padded prompts; prompt_lengths: [B].
    tokens: [B, N] one decode's tokens (e.g. speculative_generate's).
    reference: [B, N] the other's (e.g. generate's greedy tokens).

  Returns:
    One dict per differing row: row, index j, both tokens, and margin = |logit difference| of
    the two tokens at j under one cache-free causal forward of [prompt | reference[:j]] (a
    third rounding of the same numbers: a margin near 1e-6 is a float near-tie).
  """
  tokens, reference = np.asarray(tokens), np.asarray(reference)
  found = []
  for row in np.flatnonzero((tokens != reference).any(axis=1)):
    j = int(np.argmax(tokens[row] != reference[row]))
    n = int(prompt_lengths[row])
    seq = np.concatenate([np.asarray(prompt_tokens[row, :n]), reference[row, :j]])[None]
    logits = np.asarray(qwen3.forward(verifier.params, verifier.config, jnp.asarray(seq))[0])
    last = logits[0, -1]
    a, b = int(reference[row, j]), int(tokens[row, j])
    found.append({"row": int(row), "index": j, "reference": a, "token": b,
                  "margin": float(abs(last[a] - last[b]))})
  return found
