"""Pivot-aligned blocks: the answer starts a block of its own.

Diffusion-GR2 (arXiv 2607.01170) names "pivot-aligned adaptive block size" as future work: a block
boundary at the reasoning -> answer pivot (`</think>`), so the whole permutation is denoised in
blocks that hold nothing else. Here the boundary is made by the response itself, which keeps every
static shape and the one block structure of `masks.block_ids`: a pivot-aligned model writes its
reasoning, then filler tokens up to the end of the reasoning's last block, then the answer, so the
answer's first token is a block's first token.

The filler is the newline token, which the answer parser skips as the whitespace between the think
block and the JSON (data/answer.py): a pivot-aligned response parses as the same answer, an AR
model scores and verifies it as plain text, and an AR verifier rejects a drafted filler (so the
lossless mode still writes exactly its AR model's tokens). CFT learns the fillers (they are
reasoning-side targets, weight lambda_r); the decoders need only room for them: up to B - 1 more
response tokens (decoding/policy.response_width). The model's config records the filler
(ModelConfig.pivot_filler_id, set when CFT converts an AR model with `cft.pivot_align`), so every
later stage, decoder and server of its exports allows for them.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np


def aligned_response(reasoning: np.ndarray, answer: np.ndarray, block_size: int,
                     filler_id: int) -> tuple[np.ndarray, int]:
  """A training response with its answer at a block boundary.

  Args:
    reasoning: [r] int token ids of the think block (possibly empty).
    answer: [a] int token ids of the answer (end of turn included).
    block_size: B.
    filler_id: the filler token id.

  Returns:
    ([r + f + a] tokens = reasoning, f = (-r) mod B fillers, answer; r + f): the answer starts at
    response index r + f, a multiple of B.
  """
  fillers = np.full(((-len(reasoning)) % block_size,), filler_id, np.int32)
  head = np.concatenate([np.asarray(reasoning, np.int32), fillers])
  return np.concatenate([head, np.asarray(answer, np.int32)]), len(head)


@dataclasses.dataclass(frozen=True)
class Fillers:
  """Where a pivot-aligned response's fillers are: after `</think>` and the blank line that ends
  every reasoning block (data/prompts.think_block), a run of the filler up to that block's end.

  Attributes:
    block_size: B.
    filler_id: the filler token (ModelConfig.pivot_filler_id).
    think_end_id: the `</think>` token.
    tail_len: tokens of the blank line after `</think>` (data/tokenizer.think_end).
  """
  block_size: int
  filler_id: int
  think_end_id: int
  tail_len: int

  def mask(self, tokens: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """[B, M] bool: True at each row's fillers (none in a row without `</think>`).

    Args:
      tokens: [B, M] int responses.
      lengths: [B] int response lengths (tokens past them are not fillers).
    """
    tokens = np.asarray(tokens)
    out = np.zeros(tokens.shape, bool)
    for b, n in enumerate(np.asarray(lengths)):
      ends = np.flatnonzero(tokens[b, :n] == self.think_end_id)
      if not ends.size:
        continue
      start = ends[0] + 1 + self.tail_len
      stop = min(-(-start // self.block_size) * self.block_size, n)
      run = tokens[b, start:stop] == self.filler_id
      out[b, start:start + (len(run) if run.all() else int(np.argmin(run)))] = True
    return out


def without_fillers(tokens: np.ndarray, lengths: np.ndarray, fillers: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The responses as an AR model reads them: the fillers taken out.

  Args:
    tokens: [B, M] int responses.
    lengths: [B] int.
    fillers: [B, M] bool (`Fillers.mask`).

  Returns:
    (compact [B, M] int: each row's other tokens moved left in order, its fillers after
     them, past compact_lengths; compact_lengths [B]; source [B, M] int32: the compact index of
     each position, -1 at a filler).
  """
  tokens, fillers = np.asarray(tokens), np.asarray(fillers, bool)
  keep = ~fillers
  source = np.where(keep, np.cumsum(keep, axis=1) - 1, -1).astype(np.int32)
  order = np.argsort(fillers, axis=1, kind="stable")  # kept positions first, in order
  compact = np.take_along_axis(tokens, order, axis=1)
  return compact, (np.asarray(lengths) - fillers.sum(axis=1)).astype(np.int32), source


# The log-prob of every token but the filler at a filler position: finite, so that the forward
# KL's 0 * (log p_T - log p_S) terms stay 0 (train/opd.forward_kl).
IMPOSSIBLE = -1e30


def with_fillers(logp: jax.Array, source: jax.Array, filler_id: int) -> jax.Array:
  """An AR model's distributions over the responses without fillers, put back at the aligned
  positions: [B, M, V] from the compact rows' [B, M, V] and `without_fillers`' source [B, M];
  at a filler the distribution is the filler with probability 1 (the fillers are fixed by the
  reasoning's length, so a model that knows the alignment writes them for sure)."""
  gathered = jnp.take_along_axis(logp, jnp.maximum(source, 0)[..., None], axis=1)
  certain = jnp.where(jnp.arange(logp.shape[-1]) == filler_id, 0.0, IMPOSSIBLE)
  return jnp.where((source < 0)[..., None], certain.astype(logp.dtype), gathered)
