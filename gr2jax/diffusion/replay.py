"""Differentiable replay of a block-diffusion trace (TraceRL; Diffusion-GR2, arXiv 2607.01170, RL;
TraceRL, Gen-Verse dLLM-RL).

The decoder (gr2jax/diffusion/decode.py) records, per response token j, the denoising step
*within j's block* at which it was committed (`commit_step`; SEED_STEP for a block's seed,
NEVER_STEP where nothing was committed). Replay round s rebuilds, in every block at once, the
canvas the decoder saw at step s of that block: the tokens with step >= s are the mask token,
the seeds and the tokens committed at earlier steps are clean (TraceRL `one_round_vectorized`).
The tokens committed at step s are scored in round s at the query before them (AR shift); the
seeds are scored from the clean stream (the previous block's commit forward, or the prefill).

All rounds are packed into ONE sequence of the shared layout (gr2jax/diffusion/layout.py):

  [prompt | clean response | round 0 | round 1 | ... | round S-1]

so the prompt and the clean response are computed once and each round costs R more tokens (not
P + 2R as a forward per round would); round streams never see each other. The LM head runs only
at the M scored queries, one per response token. The round count S is static (shapes do not
depend on the trace), so the replay is jit-able and differentiable; `rounds_needed` gives the S
that covers every trace of a decode setting, `check_rounds` verifies a trace against it, and
`round_bucket` the S a batch of traces needs; a train batch carries it as `Rounds` (a static
value: jit compiles one step per count; defined in gr2jax/model/rounds.py, below data/).

Step shrinkage (TraceRL `collapse_k_unique`, an approximation, off by default): with shrink k,
steps sk .. sk + k - 1 of a block are replayed as one round (round s masks every token with
step >= sk and scores steps sk .. sk + k - 1 together), so S shrinks k-fold but a token committed
at step sk + i is scored without the i earlier steps' tokens in view: its log-prob is no longer
the one the decoder sampled from. The decoder commits >= 1 token per step, so a block's steps are
0 .. n - 1 with no gap and merging k consecutive distinct steps is `step // k`.

Cost: one forward of N = P + (1 + S) R tokens (tiny, B = 32, S = 31: P ~ 290, R = 64 -> N ~ 2.4k;
a forward per round would cost S (P + 2R) ~ 13k tokens). Its attention runs per noisy block on
the reference path (attention.two_stream): the prompt and clean queries over the P + R prompt and
clean keys, each round's block of B queries over those keys and its own block, so a round adds
R (P + R + B) scores per head, not the dense mask's ~2 N R (docs/results/benchmarks/
replay_attention.md). S = rounds_needed(...) is an upper bound; rounds no block reached cost
their R tokens anyway.

The rollouts themselves are sampled by gr2jax/train/rollout.py's `DiffusionRollout`, which checks
them against the replay.
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.diffusion import layout
from gr2jax.diffusion.decode import NEVER_STEP, SEED_STEP
from gr2jax.model.config import ModelConfig
from gr2jax.model.rounds import Rounds as Rounds  # replay.Rounds: the batch's round count


class ReplayOutput(NamedTuple):
  """What `replay` returns.

  Attributes:
    logp: [B, M] f32 log-prob of each committed trace token in its replayed context (0 where
      never committed).
    log_probs: [B, M, V] f32 the full distribution at each token's scoring query (the student's
      policy in its own decoding context, for OPD), or None.
  """

  logp: jax.Array
  log_probs: jax.Array | None


class Trace(NamedTuple):
  """A block-diffusion decode of some prompts, as `replay` re-scores it.

  Attributes:
    prompt_tokens: [B, P] right-padded prompts given to the decoder.
    prompt_lengths: [B].
    trace_tokens: [B, M] DiffusionOutput.trace_tokens.
    commit_step: [B, M] DiffusionOutput.commit_step.
    lengths: [B] DiffusionOutput.lengths.
  """

  prompt_tokens: jax.Array
  prompt_lengths: jax.Array
  trace_tokens: jax.Array
  commit_step: jax.Array
  lengths: jax.Array


def replay_rounds(commit_step: jax.Array, shrink: int = 1) -> jax.Array:
  """The replay round of each response token.

  Args:
    commit_step: [B, M] int DiffusionOutput.commit_step.
    shrink: merge every `shrink` consecutive steps of a block into one round (1 = exact).

  Returns:
    [B, M] int32: SEED_STEP for seeds, NEVER_STEP where never committed, else step // shrink.
  """
  if shrink < 1:
    raise ValueError(f"replay_rounds: shrink={shrink} must be >= 1")
  steps = jnp.asarray(commit_step, jnp.int32)
  denoised = (steps != SEED_STEP) & (steps != NEVER_STEP)
  return jnp.where(denoised, steps // shrink, steps)


def rounds_needed(block_size: int, max_steps_per_block: int, shrink: int = 1) -> int:
  """The static round count S covering every trace of a decode setting.

  A block has block_size - 1 masked positions and every step commits at least one, so a step is
  at most min(max_steps_per_block, block_size - 1) - 1.

  Args:
    block_size: B.
    max_steps_per_block: the decoder's per-block step cap.
    shrink: steps merged per round.

  Returns:
    S >= 0 (0 for B = 1: every token is a seed).
  """
  steps = min(max_steps_per_block, block_size - 1)
  return -(-steps // shrink)


def round_bucket(commit_step, num_rounds: int, shrink: int = 1) -> int:
  """The replay rounds a batch of traces needs, rounded up to a power of two (<= num_rounds).

  A trained model commits most of a block in a few steps, so replaying all rounds_needed(...)
  rounds (31 at B = 32) would spend most of the packed sequence on empty rounds (about 1 GB of
  activations per tiny-model row at 31 rounds, 0.2 GB at 8). Powers of two keep the number of
  distinct compiled shapes at log2(num_rounds) + 1.
  """
  rounds = np.asarray(replay_rounds(commit_step, shrink))
  used = rounds[(rounds != SEED_STEP) & (rounds != NEVER_STEP)]
  need = int(used.max()) + 1 if used.size else 1
  return min(num_rounds, 1 << max(need - 1, 0).bit_length()) if num_rounds else 0


def check_rounds(commit_step, num_rounds: int, shrink: int = 1) -> None:
  """Raises if a committed token's round is >= num_rounds (host-side, concrete values only)."""
  rounds = np.asarray(replay_rounds(commit_step, shrink))
  used = rounds[(rounds != SEED_STEP) & (rounds != NEVER_STEP)]
  if used.size and int(used.max()) >= num_rounds:
    raise ValueError(
      f"replay: a token was committed in round {int(used.max())} (shrink {shrink}) but the "
      f"replay has num_rounds={num_rounds}; use replay.rounds_needed(...)"
    )


def replay_inputs(
  config: ModelConfig,
  prompt_tokens: jax.Array,
  prompt_lengths: jax.Array,
  trace_tokens: jax.Array,
  commit_step: jax.Array,
  lengths: jax.Array,
  *,
  rounds,
  shrink: int = 1,
) -> layout.Layout:
  """The layout of the given replay rounds: noisy stream i masks the tokens of round >= rounds[i].

  Args:
    config: the model (block size, mask token).
    prompt_tokens: [B, P] right-padded prompts given to the decoder.
    prompt_lengths: [B].
    trace_tokens: [B, M] DiffusionOutput.trace_tokens.
    commit_step: [B, M] DiffusionOutput.commit_step.
    lengths: [B] DiffusionOutput.lengths.
    rounds: a sequence of round indices (static), one noisy stream each.
    shrink: see replay_rounds.

  Returns:
    layout.Layout of `[prompt | clean | round rounds[0] | ...]`.
  """
  r = replay_rounds(commit_step, shrink)  # [B, M]
  noisy = r[:, None, :] >= jnp.asarray(tuple(rounds), jnp.int32).reshape(1, -1, 1)
  return layout.two_stream_inputs(
    config, prompt_tokens, prompt_lengths, trace_tokens, lengths, noisy
  )


def replay(
  params: dict,
  config: ModelConfig,
  trace: Trace,
  *,
  num_rounds: int,
  temperature: float = 0.0,
  shrink: int = 1,
  return_log_probs: bool = False,
) -> ReplayOutput:
  """Re-scores every committed token of a trace in its decoding context (differentiable).

  Exact (shrink = 1): equals the decoder's recorded `commit_logprob` up to float error; traced
  arrays only, so it runs inside a jitted train step and under jax.grad. The trace must satisfy
  `check_rounds(commit_step, num_rounds, shrink)` (a later round is scored in round S - 1).

  Args:
    params: the param pytree.
    config: the model; config.block_size must be the decode block size.
    trace: the decode to re-score (Trace).
    num_rounds: S, static (rounds_needed).
    temperature: the decode temperature (commit.token_log_probs; 0 = greedy, scored at 1).
    shrink: steps merged per round (replay_rounds).
    return_log_probs: also return the [B, M, V] distributions.

  Returns:
    ReplayOutput.
  """
  prompt_tokens, prompt_lengths, trace_tokens, commit_step, lengths = trace
  p = prompt_tokens.shape[1]
  m = trace_tokens.shape[1]
  rounds = replay_rounds(commit_step, shrink)  # [B, M]
  inputs = replay_inputs(
    config, prompt_tokens, prompt_lengths, trace_tokens, commit_step, lengths,
    rounds=range(num_rounds), shrink=shrink,
  )
  committed = rounds != NEVER_STEP
  denoised = committed & (rounds != SEED_STEP)
  stream = jnp.where(denoised, jnp.minimum(rounds, num_rounds - 1), layout.CLEAN_STREAM)
  queries = layout.prediction_queries(
    stream, prompt_lengths, p, layout.padded_width(m, config.block_size)
  )
  logp, log_probs = layout.score(
    params, config, inputs, queries, trace_tokens,
    temperature=temperature, return_log_probs=return_log_probs,
  )
  return ReplayOutput(logp=jnp.where(committed, logp, 0.0), log_probs=log_probs)
