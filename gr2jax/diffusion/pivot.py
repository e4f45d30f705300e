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
response tokens (`response_width`). The model's config records the filler
(ModelConfig.pivot_filler_id, set when CFT converts an AR model with `cft.pivot_align`), so every
later stage, decoder and server of its exports allows for them.
"""

import numpy as np

from gr2jax.data import lengths as lengths_lib
from gr2jax.model.config import ModelConfig


def response_width(response_len: int, config: ModelConfig) -> int:
  """The static response width R of `config`'s decoders and training rows: `response_len` for a
  model without fillers; room for B - 1 more tokens (rounded up as every static width) for a
  pivot-aligned one."""
  if config.pivot_filler_id is None:
    return response_len
  return lengths_lib.round_up(response_len + config.block_size - 1)


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
