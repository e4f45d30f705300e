"""Block-diffusion decoding with an exact KV cache, all on device (one jit, one lax.while_loop).

Conventions (WORKSPACE.md "Masks and block alignment"):
  - The prompt is prefilled causally into a static KV cache (exactly the AR prefill).
  - Response blocks are aligned to the response start: block k holds response tokens
    [k * B, (k + 1) * B). Every forward of a block attends to the cache (the prompt and the
    committed earlier blocks) and bidirectionally within the block (`masks.decode_mask`).
  - AR token shift: the logit at block index i - 1 predicts block token i. A block therefore
    starts as one *seed* token -- the proposal of the previous forward's last logit (the prefill
    for block 0, the previous block's commit forward afterwards) -- plus B - 1 mask tokens.
    With B = 1 every block is a seed and decoding is exactly AR decoding.
  - A denoising step proposes a token for every still-masked position and commits per the
    decode's CommitSchedule (the decoder's: `Threshold`, commit.select's threshold rule). When
    a block has no masks left, one *commit forward* of the clean block writes its K/V into the
    cache and its last logit seeds the next block.

One forward per loop iteration serves every row: rows still denoising run a denoising step,
rows whose block just completed run their commit forward, so rows never wait for each other.
The forward is always called with update_cache=True, but only committing rows advance
`cache.lengths`; a denoising row's K/V land in slots >= its `cache.lengths`, which no query can
see (`decode_mask`) and which its own commit forward overwrites. The valid part of the cache is
therefore untouched by denoising steps (tests/diffusion/test_decode.py checks it).

Stop: a row is done once a stop token is committed with no mask before it in its block, or once
its last block (covering max_new_tokens) is complete. Done rows are frozen (static shapes).
Per-block step cap: the step with index max_steps_per_block - 1 commits all remaining masks.

Trace (for RL replay, gr2jax/diffusion/replay.py): `commit_step[b, j]` is the 0-based denoising
step *within j's block* at which response token j was committed; SEED_STEP (-1) for a block's
seed token; NEVER_STEP for a position still masked when its row stopped (only after a stop
token). `commit_logprob` is the token's log-prob at that moment (commit.token_log_probs).

Cheap CPU levers: the cache holds exactly prompt + ceil(max_new / B) * B slots (or
`cache_size`); the LM head runs only at query indices that predict a still-masked token (plus
the last one for committing rows), gathered into the smallest of `head_buckets` static widths
(`lax.switch`, one compiled forward per bucket). Computing only a sub-block of the canvas is not
exact under the block-bidirectional mask (every token's K/V depends on the whole block) and is
not done. Proposals take their arg-max with `commit.first_argmax`: XLA:CPU's jnp.argmax over the
vocab was ~30% of a B = 32 loop iteration (tiny preset, batch 1). What remains outside
forward + proposal (query plan, row writes, commit selection, prefill amortised) is <10% of an
iteration; removing each piece in turn measured within noise.
"""

import abc
import dataclasses
import functools
from typing import NamedTuple

import flax.struct
import jax
import jax.numpy as jnp
from jax import lax

from gr2jax import settings
from gr2jax.diffusion import commit, constrain
from gr2jax.model import attention, decode_core, masks, qwen3, validate
from gr2jax.model import params as params_lib
from gr2jax.model.cache import KVCache
from gr2jax.model.config import ModelConfig

SEED_STEP = -1
NEVER_STEP = 2**30


class DiffusionOutput(NamedTuple):
  """What block_diffusion_generate returns.

  Attributes:
    tokens: [B, max_new] int32 generated tokens, pad_token_id after `lengths`.
    lengths: [B] int32 generated tokens per row (the stop token included).
    nfe: [B] int32 forwards that worked on the row (prefill + denoising steps + commit forwards):
      the cost in forward passes.
    commit_step: [B, max_new] int32 per-block denoising step of each token (see module doc).
    commit_logprob: [B, max_new] f32 log-prob of each token when committed (0 where never).
    trace_tokens: [B, max_new] int32 every committed token, also those committed after a stop
      token in the final block (mask token where never committed); what replay re-scores.
    num_forwards: [] int32 batched forward calls (prefill included), the wall-clock driver.
    denoise_steps: [B] int32 denoising steps of the row: NFE as the paper counts it (forwards
      that commit masked tokens; the prefill and the commit forwards, which only write the
      cache and propose the next block's seed, are not counted). `nfe` counts them all.
  """

  tokens: jax.Array
  lengths: jax.Array
  nfe: jax.Array
  commit_step: jax.Array
  commit_logprob: jax.Array
  trace_tokens: jax.Array
  num_forwards: jax.Array
  denoise_steps: jax.Array


class LoopState(NamedTuple):
  """The while_loop carry; T = block size, R = blocks * T response slots.

  The fields from `cache` on are the current block's, written by `_enter` alone (None only in
  the state the first `_enter` completes).
  """

  done: jax.Array  # [B]
  lengths: jax.Array  # [B] final length, valid once done
  out_tokens: jax.Array  # [B, R]
  out_step: jax.Array  # [B, R]
  out_logp: jax.Array  # [B, R]
  nfe: jax.Array  # [B]
  denoise_steps: jax.Array  # [B]
  num_forwards: jax.Array  # []
  key: jax.Array
  cache: KVCache | None = None
  canvas: jax.Array | None = None  # [B, T] current block
  masked: jax.Array | None = None  # [B, T] still open
  step_rec: jax.Array | None = None  # [B, T] commit step of each block position
  logp_rec: jax.Array | None = None  # [B, T]
  start: jax.Array | None = None  # [B] response index of the block's first token
  step: jax.Array | None = None  # [B] denoising steps done in this block


class CommitSchedule(abc.ABC):
  """Which open positions a denoising step commits: the strategy `loop_step` runs.

  A pytree carried in Inputs beside the other traced inputs: its class is part of the compiled
  loop, its arrays are inputs. The decoder's is `Threshold` (check_inputs builds it); a replay
  of a recorded run brings its own (experiments/emulate.py).
  """

  @abc.abstractmethod
  def select(self, proposed: tuple[jax.Array, jax.Array], open_: jax.Array, s: LoopState,
             max_steps_per_block: jax.Array, order: commit.CommitOrder) -> commit.CommitResult:
    """The commits of a denoising step.

    Args:
      proposed: (tokens [B, T] int32, their log-probs [B, T] f32) shifted onto the block
        (position i's proposal).
      open_: [B, T] bool the positions that may commit (still masked, in denoising rows).
      s: the state before the step (s.canvas; s.step, the steps done in the block;
        s.denoise_steps, the row's steps across its blocks).
      max_steps_per_block: [] int32 the step cap (the step with index cap - 1 commits every
        open position).
      order: the decode's commit.CommitOrder.

    Returns:
      commit.CommitResult of the block.
    """


@flax.struct.dataclass
class Threshold(CommitSchedule):
  """The decoder's schedule: commit.select's threshold rule at tau (commit.py), every open
  position at the capped step (commit.capped_threshold).

  Attributes:
    tau: [] f32 the decoding's threshold.
  """

  tau: jax.Array

  def select(self, proposed, open_, s, max_steps_per_block, order):
    """CommitSchedule.select: the threshold rule."""
    _, tau = commit.capped_threshold(s.step, max_steps_per_block, self.tau)
    return commit.select(*proposed, s.canvas, open_, tau, order=order)


def block_forward(
  params: dict,
  config: ModelConfig,
  cache: KVCache,
  canvas: jax.Array,
  prompt_lengths: jax.Array,
  logits_at: jax.Array | None = None,
) -> tuple[jax.Array, KVCache]:
  """One forward of a block [B, T] after the cache, block-bidirectional (the decoder's step).

  Args:
    params: the param pytree.
    config: the model.
    cache: holds the prompt and the committed blocks; the block sits at slots cache.lengths + i.
    canvas: [B, T] block tokens (mask token where open).
    prompt_lengths: [B] response start of each row (block alignment).
    logits_at: optional [B, Kq] query indices for the LM head.

  Returns:
    (logits f32 [B, T or Kq, V] unshifted, the cache with the block written and lengths + T).
  """
  t = canvas.shape[1]
  positions = cache.lengths[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]  # [B, T]
  mask = masks.decode_mask(cache.lengths, cache.max_len, positions, prompt_lengths, t)
  return qwen3.forward(
    params, config, canvas, positions, qwen3.Mask(mask, attention.block_pattern(t, cache.max_len)),
    cache, update_cache=True, logits_at=logits_at,
  )


def _new_block(seed, seed_logp, start, block_size, max_new, mask_id):
  """Canvas of a fresh block: seed + masks; positions >= max_new stay mask but are not open."""
  b = seed.shape[0]
  idx = jnp.arange(block_size, dtype=jnp.int32)[None, :]  # [1, T]
  canvas = jnp.where(idx == 0, seed[:, None], jnp.full((b, block_size), mask_id, jnp.int32))
  masked = (idx >= 1) & (start[:, None] + idx < max_new)
  step_rec = jnp.where(idx == 0, SEED_STEP, NEVER_STEP) * jnp.ones((b, 1), jnp.int32)
  logp_rec = jnp.where(idx == 0, seed_logp[:, None], 0.0)
  return canvas, masked, step_rec, logp_rec


def _with_prefix(block, start, prefix):
  """A fresh block with the given response prefix written in (committed, never re-predicted).

  Args:
    block: (canvas, masked, step_rec, logp_rec) of _new_block.
    start: [B] response index of the block's first token.
    prefix: None, or (tokens [B, R] int32, lengths [B] int32): response token j < lengths[b] of
      row b is given; it is recorded like a seed (SEED_STEP, log-prob 0).
  """
  if prefix is None:
    return block
  canvas, masked, step_rec, logp_rec = block
  tokens, lengths = prefix
  j = start[:, None] + jnp.arange(canvas.shape[1], dtype=jnp.int32)[None, :]  # [B, T]
  given = j < lengths[:, None]
  written = jnp.take_along_axis(tokens, jnp.minimum(j, tokens.shape[1] - 1), axis=1)
  return (jnp.where(given, written, canvas), masked & ~given,
          jnp.where(given, SEED_STEP, step_rec), jnp.where(given, 0.0, logp_rec))


def _finished(canvas, masked, start, stop_ids, max_new):
  """(done [B], lengths [B]) of rows whose current block ends the response."""
  t = canvas.shape[1]
  idx = jnp.arange(t, dtype=jnp.int32)[None, :]
  first_stop = decode_core.first_stop(canvas, ~masked, stop_ids)  # [B]
  open_before = jnp.any(masked & (idx < first_stop[:, None]), axis=-1)
  stopped = (first_stop < t) & ~open_before
  complete = ~jnp.any(masked, axis=-1) & (start + t >= max_new)
  lengths = jnp.where(stopped, start + first_stop + 1, jnp.minimum(start + t, max_new))
  return stopped | complete, lengths


def _enter(s: LoopState, cache, block, start, step, stop_ids, max_new) -> LoopState:
  """The state after a forward: `block` (canvas, masked, step_rec, logp_rec [B, T]) at `start`
  [B] with `step` [B] steps done is the current block, copied into the output records; rows it
  finishes are done, with their lengths (a done row keeps its length)."""
  canvas, masked, step_rec, logp_rec = block
  finished, lengths = _finished(canvas, masked, start, stop_ids, max_new)
  return s._replace(
    cache=cache, canvas=canvas, masked=masked, step_rec=step_rec, logp_rec=logp_rec,
    start=start, step=step, done=s.done | finished,
    lengths=jnp.where(s.done, s.lengths, lengths),
    out_tokens=decode_core.write_rows(s.out_tokens, canvas, start),
    out_step=decode_core.write_rows(s.out_step, step_rec, start),
    out_logp=decode_core.write_rows(s.out_logp, logp_rec, start),
  )


def _query_plan(masked, committing, bucket_sizes):
  """Which query indices need logits, ordered needed-first, and the bucket that covers them.

  Query i - 1 predicts block token i; committing rows need the last query (the next seed).

  Returns:
    (order [B, T] int32, bucket index [] int32).
  """
  b, t = masked.shape
  needed = jnp.concatenate([masked[:, 1:], committing[:, None]], axis=1)  # [B, T] by query
  order = jnp.argsort(~needed, axis=-1, stable=True).astype(jnp.int32)
  count = jnp.max(jnp.sum(needed, axis=-1))
  bucket = jnp.sum(jnp.asarray(bucket_sizes)[None, :] < count, axis=-1)
  return order, jnp.minimum(bucket, len(bucket_sizes) - 1).reshape(())


def _propose_at_queries(
  params, config, cache, canvas, prompt_lengths, order, bucket, bucket_sizes, propose_fn
):
  """Runs the block forward with the LM head at the first `bucket_sizes[bucket]` ordered queries.

  Returns:
    (query tokens [B, T], query log-probs [B, T], the written cache); entries at queries that
    got no logits are arbitrary.
  """
  b, t = canvas.shape

  def branch(size):
    def run(_):
      idx = order[:, :size]  # [B, Kq]
      logits, new_cache = block_forward(params, config, cache, canvas, prompt_lengths, idx)
      tok, logp = propose_fn(logits, idx)  # [B, Kq]
      rows = jnp.arange(b)[:, None]
      q_tok = jnp.zeros((b, t), jnp.int32).at[rows, idx].set(tok)
      q_logp = jnp.zeros((b, t), jnp.float32).at[rows, idx].set(logp)
      return q_tok, q_logp, new_cache

    return run

  if len(bucket_sizes) == 1:
    return branch(bucket_sizes[0])(None)
  return lax.switch(bucket, [branch(s) for s in bucket_sizes], None)


def _bucket_sizes(block_size: int, head_buckets: int) -> tuple[int, ...]:
  """Ascending LM-head widths: block_size, /2, /4, ... (head_buckets of them, each >= 1)."""
  sizes = {max(1, block_size >> i) for i in range(head_buckets)}
  return tuple(sorted(sizes))


class _Static(NamedTuple):
  """The static settings of `_generate` (hashable: one compile per value)."""

  max_new_tokens: int
  temperature: float
  cache_size: int
  head_buckets: int
  commit_order: commit.CommitOrder


class _Traced(NamedTuple):
  """The traced inputs of `_generate` besides the prompts (None = not given)."""

  max_steps_per_block: jax.Array  # [] int32
  stop_ids: jax.Array  # [S] int32
  key: jax.Array
  constraint: constrain.AnswerConstraint | None
  prefix: tuple[jax.Array, jax.Array] | None


class Inputs(NamedTuple):
  """The checked traced inputs of a decode (`check_inputs`; its `_Static` goes beside them).

  Attributes:
    prompt_tokens: [B, P] int32.
    prompt_lengths: [B] int32.
    traced: the decoding's traced settings.
    schedule: the commit schedule of the denoising steps (check_inputs: Threshold at the
      decoding's threshold; a replay replaces it, e.g. `inputs._replace(schedule=...)`).
  """

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  traced: _Traced
  schedule: CommitSchedule


def prefill(params, config: ModelConfig, inputs: Inputs,
            static: _Static) -> tuple[jax.Array, KVCache]:
  """The decode's prompt prefill (traceable): (logits [B, V] f32, a cache of
  static.cache_size slots holding the prompts); params in the decoders' layout."""
  return decode_core.prefill(params, config, inputs.prompt_tokens, inputs.prompt_lengths,
                             static.cache_size)


@functools.partial(jax.jit, static_argnames=("config", "static"))
def _generate(params, config, inputs: Inputs, *, static: _Static) -> DiffusionOutput:
  return decode_loop(params, config, inputs, static, *prefill(params, config, inputs, static))


def decode_loop(params, config: ModelConfig, inputs: Inputs, static: _Static, logits: jax.Array,
                cache: KVCache) -> DiffusionOutput:
  """The decode after the prefill (traceable; module docstring): one while_loop of `loop_step`
  from `loop_start`, read out by `loop_output`.

  Args:
    params: the decoders' layout (params.layer_list).
    config: the model.
    inputs, static: check_inputs(...).
    logits: [B, V] f32 the prefill's last logits (the first seed's).
    cache: the prefilled cache (static.cache_size slots).

  Returns:
    DiffusionOutput.
  """
  s = loop_start(config, inputs, static, logits, cache)
  s = lax.while_loop(lambda s: ~jnp.all(s.done),
                     lambda s: loop_step(params, config, inputs, static, s), s)
  return loop_output(config, static, s)


def _proposer(config: ModelConfig, inputs: Inputs, static: _Static):
  """propose(logits, query_idx, out_tokens, start, key): proposals [B, Kq] for the queries;
  query i predicts response index start + i + 1. Under the answer constraint the token is the
  constrained choice, its log-prob the model's own (constrain.py: a forbidden preference defers
  the position)."""
  constraint, mask_id = inputs.traced.constraint, config.mask_token_id
  temperature = static.temperature

  def propose(logits, query_idx, state_out, start, key):
    if constraint is None:
      return commit.propose(logits, mask_id, temperature, key)
    return constrain.propose(constraint, logits, start[:, None] + query_idx + 1, state_out,
                             mask_id, temperature, key)

  return propose


def loop_start(config: ModelConfig, inputs: Inputs, static: _Static, logits: jax.Array,
               cache: KVCache) -> LoopState:
  """The loop's first state (traceable): block 0 seeded from the prefill's `logits` [B, V],
  `cache` the prefilled cache; arguments as decode_loop's."""
  prompt_lengths = inputs.prompt_lengths
  stop_ids, key, prefix = inputs.traced.stop_ids, inputs.traced.key, inputs.traced.prefix
  max_new_tokens = static.max_new_tokens
  b = prompt_lengths.shape[0]
  t = config.block_size
  r = decode_core.padded_width(max_new_tokens, t)
  mask_id = config.mask_token_id
  key, prefill_key = jax.random.split(key)
  start = jnp.zeros((b,), jnp.int32)
  empty_out = jnp.full((b, r), mask_id, jnp.int32)
  seed, seed_logp = _proposer(config, inputs, static)(
    logits[:, None], jnp.full((b, 1), -1, jnp.int32), empty_out, start, prefill_key
  )
  block = _with_prefix(_new_block(
    seed[:, 0], seed_logp[:, 0], start, t, max_new_tokens, mask_id
  ), start, prefix)
  blank = LoopState(
    done=jnp.zeros((b,), bool),
    lengths=jnp.zeros((b,), jnp.int32),
    out_tokens=empty_out,
    out_step=jnp.full((b, r), NEVER_STEP, jnp.int32),
    out_logp=jnp.zeros((b, r), jnp.float32),
    nfe=jnp.ones((b,), jnp.int32),
    denoise_steps=jnp.zeros((b,), jnp.int32),
    num_forwards=jnp.ones((), jnp.int32),
    key=key,
  )
  return _enter(blank, cache, block, start, start, stop_ids, max_new_tokens)


def loop_step(params, config: ModelConfig, inputs: Inputs, static: _Static,
              s: LoopState) -> LoopState:
  """One iteration of the loop (traceable): one forward serving every row (module docstring);
  the denoising rows commit per inputs.schedule.

  Args:
    params, config, inputs, static: as decode_loop's.
    s: the state (loop_start's, or a loop_step's).

  Returns:
    The next LoopState.
  """
  prompt_lengths = inputs.prompt_lengths
  max_steps_per_block, stop_ids, _, _, prefix = inputs.traced
  max_new_tokens = static.max_new_tokens
  t = config.block_size
  mask_id = config.mask_token_id
  bucket_sizes = _bucket_sizes(t, static.head_buckets)
  propose_fn = _proposer(config, inputs, static)
  key, step_key = jax.random.split(s.key)
  active = ~s.done
  committing = active & ~jnp.any(s.masked, axis=-1)  # [B]
  denoising = active & ~committing
  open_ = s.masked & denoising[:, None]
  order, bucket = _query_plan(open_, committing, bucket_sizes)
  q_tok, q_logp, written = _propose_at_queries(
    params,
    config,
    s.cache,
    s.canvas,
    prompt_lengths,
    order,
    bucket,
    bucket_sizes,
    lambda lg, idx: propose_fn(lg, idx, s.out_tokens, s.start, step_key),
  )
  # Denoising rows: shifted proposals (query i - 1 -> token i), then the commit schedule.
  shift_tok = jnp.concatenate([s.canvas[:, :1], q_tok[:, :-1]], axis=1)
  shift_logp = jnp.concatenate([s.logp_rec[:, :1], q_logp[:, :-1]], axis=1)
  res = inputs.schedule.select((shift_tok, shift_logp), open_, s, max_steps_per_block,
                               static.commit_order)
  d_step_rec = jnp.where(res.committed, s.step[:, None], s.step_rec)
  d_logp_rec = jnp.where(res.committed, res.logprob, s.logp_rec)
  # Committing rows: the K/V are written, the last query seeds the next block.
  new_start = s.start + t
  n_canvas, n_masked, n_step_rec, n_logp_rec = _with_prefix(_new_block(
    q_tok[:, -1], q_logp[:, -1], new_start, t, max_new_tokens, mask_id
  ), new_start, prefix)
  c = committing[:, None]
  block = (jnp.where(c, n_canvas, res.canvas), jnp.where(c, n_masked, res.masked),
           jnp.where(c, n_step_rec, d_step_rec), jnp.where(c, n_logp_rec, d_logp_rec))
  counted = s._replace(nfe=s.nfe + active, denoise_steps=s.denoise_steps + denoising,
                       num_forwards=s.num_forwards + 1, key=key)
  return _enter(counted, written.replace(lengths=s.cache.lengths + t * committing), block,
                jnp.where(committing, new_start, s.start),
                jnp.where(committing, 0, s.step + denoising), stop_ids, max_new_tokens)


def loop_output(config: ModelConfig, static: _Static, s: LoopState) -> DiffusionOutput:
  """The DiffusionOutput of the loop's last state (traceable)."""
  max_new_tokens = static.max_new_tokens
  keep = jnp.arange(max_new_tokens)[None, :] < s.lengths[:, None]
  trace_tokens = s.out_tokens[:, :max_new_tokens]
  return DiffusionOutput(
    tokens=jnp.where(keep, trace_tokens, config.pad_token_id),
    lengths=s.lengths,
    nfe=s.nfe,
    commit_step=s.out_step[:, :max_new_tokens],
    commit_logprob=s.out_logp[:, :max_new_tokens],
    trace_tokens=trace_tokens,
    num_forwards=s.num_forwards,
    denoise_steps=s.denoise_steps,
  )


@dataclasses.dataclass(frozen=True, kw_only=True)
class BlockDecoding(decode_core.Decoding):
  """How one block-diffusion decode runs (decode_core.Decoding's fields, then these; built from
  a DecodeSpec by gr2jax/decoding/policy.py). Its fields are checked when it is built.

  The commit rule at threshold tau: every masked position whose confidence is strictly above
  tau commits, plus the most confident one. commit_order is looked up once, here: the field
  then holds the commit.CommitOrder. Stop ids (decode_core.Decoding.stop_token_ids) are never
  the mask token.
  """

  WHERE = "BlockDecoding"

  threshold: float = settings.real(
    doc="tau of the commit rule (1.0 = one token per step)", low=0, high=1, low_open=True,
    note=" (tau <= 0 would commit whole blocks at once; 1.0 = one token per step)")
  max_steps_per_block: int = settings.integer(doc="denoising-step cap per block (the last "
                                              "allowed step commits the rest)", minimum=1)
  commit_order: "str | commit.CommitOrder" = commit.order_field(
    doc="a commit.CommitOrder or its name ('confidence', the paper's rule, 'left_to_right' or "
    "'distinct')")
  head_buckets: int = settings.integer(1, doc="LM-head widths (B, B/2, ...) to choose from per "
                                       "step; 1 = LM head at all B queries every step",
                                       minimum=1)
  cache_size: int | None = decode_core.optional_int(
    doc="KV slots per row; None = P + ceil(max_new_tokens / B) * B (the minimum)", minimum=1)

  def check(self, where: str) -> None:
    """Keeps tau a float and the commit order its object."""
    super().check(where)
    decode_core.keep(self, threshold=float(self.threshold),
                     commit_order=commit.lookup(where, "commit_order", self.commit_order))


@dataclasses.dataclass(frozen=True)
class Steering:
  """Optional per-row inputs that steer a decode (the default steers nothing).

  Attributes:
    constraint: a constrain.AnswerConstraint (the constrained-answers ablation).
    response_prefix: (tokens [B, F] int, lengths [B] int in 0..F): the first lengths[b]
      response tokens of row b are given (teacher forcing, e.g. the reasoning): written into
      their blocks as committed tokens (commit_step SEED_STEP), never proposed; the decoder
      writes the rest. Tokens and lengths include them.
  """

  constraint: constrain.AnswerConstraint | None = None
  response_prefix: tuple[jax.Array, jax.Array] | None = None

  @property
  def empty(self) -> bool:
    """True when nothing is given (every field None)."""
    return all(getattr(self, f.name) is None for f in dataclasses.fields(self))


NO_STEERING = Steering()


def block_diffusion_generate(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
                             prompt_lengths: jax.Array | None, decoding: BlockDecoding, *,
                             key: jax.Array | None = None,
                             steering: Steering = NO_STEERING) -> DiffusionOutput:
  """Block-diffusion generation (see the module docstring for the algorithm and the trace).

  Every argument is checked before anything is traced (docs/bad_input.md).

  Args:
    params: the param pytree.
    config: the model; `config.mask_token_id` must be set; `config.block_size` is B (1 = AR
      decoding).
    prompt_tokens: [B, P] int right-padded prompts, ids in [0, V).
    prompt_lengths: [B] int real prompt lengths, each in 1..P (None: P for every row).
    decoding: the decode's settings (BlockDecoding).
    key: PRNG key (required when decoding.temperature > 0).
    steering: optional per-row inputs (Steering).

  Returns:
    DiffusionOutput.

  Raises:
    TypeError / ValueError naming the argument (check_inputs).
  """
  inputs, static = check_inputs("block_diffusion_generate", config, prompt_tokens,
                                prompt_lengths, decoding, key, steering)
  return _generate(params_lib.layer_list(params), config, inputs, static=static)


def check_inputs(where: str, config: ModelConfig, prompt_tokens, prompt_lengths,
                 decoding: BlockDecoding, key, steering: Steering) -> tuple[Inputs, _Static]:
  """The arguments of block_diffusion_generate, checked before anything is traced.

  Returns:
    (Inputs: the prompts as int32 arrays, the traced settings and the decoder's commit schedule
    (Threshold at decoding.threshold), the static settings).

  Raises:
    TypeError / ValueError starting with `where`, naming the argument: prompts or lengths
      (validate.prompts), decoding that is not a BlockDecoding (its fields are checked when it
      is built), a missing or out-of-vocab mask token, a stop id that is the mask token or
      outside the vocab, a cache_size below P + blocks * B, P + blocks * B (or cache_size) past
      config.max_position_embeddings (decode_core.check_positions), no key when sampling or a
      key that is not a PRNG key, malformed steering inputs.
  """
  prompt_tokens, prompt_lengths = validate.prompts(where, config, prompt_tokens, prompt_lengths)
  stop, key = decode_core.check_call(where, decoding, BlockDecoding, config, key)
  if not isinstance(steering, Steering):
    raise TypeError(f"{where}: steering must be a Steering, got {type(steering).__name__}")
  if config.mask_token_id is None:
    raise ValueError(
      f"{where}: config.mask_token_id is None (convert the checkpoint with "
      "weights_conversion/ar_to_diffusion.py)"
    )
  if not 0 <= config.mask_token_id < config.vocab_size:
    raise ValueError(f"{where}: config.mask_token_id={config.mask_token_id} is outside the vocab "
                     f"[0, {config.vocab_size - 1}]")
  if config.mask_token_id in stop:
    raise ValueError(f"{where}: the mask token {config.mask_token_id} is a stop token "
                     "(stop_token_ids / config.eos_token_ids): it is never proposed, so no row "
                     "could stop")
  block_size = config.block_size
  max_new_tokens = decoding.max_new_tokens
  b = prompt_tokens.shape[0]
  constraint = steering.constraint
  if constraint is not None and not isinstance(constraint, constrain.AnswerConstraint):
    raise TypeError(f"{where}: constraint must be a constrain.AnswerConstraint, got "
                    f"{type(constraint).__name__}")
  p = prompt_tokens.shape[1]
  r = decode_core.padded_width(max_new_tokens, block_size)
  needed = p + r
  response_prefix = steering.response_prefix
  if response_prefix is not None:
    given, given_lengths = (jnp.asarray(x) for x in response_prefix)
    f = given.shape[-1] if given.ndim == 2 else -1
    if (given.ndim != 2 or given.shape[0] != b or given_lengths.shape != (b,)
        or not jnp.issubdtype(given.dtype, jnp.integer)):
      raise ValueError(f"{where}: response_prefix must be (tokens [{b}, F] int, lengths [{b}]), "
                       f"got {given.shape} and {given_lengths.shape}")
    if int(jnp.min(given_lengths)) < 0 or int(jnp.max(given_lengths)) > min(f, max_new_tokens):
      raise ValueError(f"{where}: response_prefix lengths must be in [0, min(F={f}, "
                       f"max_new_tokens={max_new_tokens})]")
    response_prefix = (jnp.pad(given.astype(jnp.int32)[:, :r], ((0, 0), (0, max(r - f, 0)))),
                       given_lengths.astype(jnp.int32))
  cache_size = decode_core.check_positions(where, config, p, max_new_tokens, decoding.cache_size)
  if cache_size < needed:
    raise ValueError(f"{where}: cache_size={cache_size} < P + blocks*B={needed}")
  traced = _Traced(
    max_steps_per_block=jnp.asarray(decoding.max_steps_per_block, jnp.int32),
    stop_ids=decode_core.stop_id_array(stop),
    key=key,
    constraint=constraint, prefix=response_prefix)
  static = _Static(max_new_tokens=max_new_tokens, temperature=decoding.temperature,
                   cache_size=cache_size, head_buckets=decoding.head_buckets,
                   commit_order=decoding.commit_order)
  return (Inputs(prompt_tokens, prompt_lengths, traced,
                 Threshold(jnp.asarray(decoding.threshold, jnp.float32))), static)

