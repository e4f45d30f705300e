"""Optional constrained answer decoding (an ablation tool; off by default in the decoder).

The answer is `{"ranking":[label, ...]}` after the reasoning (gr2jax/data/prompts.py); a label is
one slot token (`answer_format='slot'`) or a candidate's SID, one token per level ('sid').

Answer span: the response positions after the first *committed* `answer_start_id` token (the
`</think>` id). A position whose predecessors hold no committed start token is unconstrained, so
under diffusion a position can enter the span only once that token is committed.

Inside the span label tokens are restricted, and a label is required where the JSON opens one
(other structural JSON tokens stay free):
  - a label token is allowed only if it belongs to a candidate that does not yet appear in full
    in the committed answer span (no out-of-set labels, no duplicates);
  - after a committed *label opener* (a token that opens a string inside the array: `":["`,
    `","`; `label_openers`) only the first label token of an unused candidate is allowed, while
    one is left. Forbidding a used label alone would let the model's runner-up there be any
    other token (a pivot-aligned model's is its newline filler: `"\n\n"`, malformed JSON);
  - SID level by level: when the committed token just before the position is a level-l SID token
    (l < L - 1), only level-(l + 1) tokens of not-yet-used candidates whose level-l code equals it
    are allowed. Deeper prefixes are not checked (a two-token look-back is enough to forbid the
    common failure, a SID that mixes candidates).
RL replay (replay.py) scores the unconstrained policy; constrained decoding is for evaluation.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np


@flax.struct.dataclass
class AnswerConstraint:
  """Per-example candidate labels and the label vocabulary.

  Attributes:
    labels: [B, N, L] int32 token ids of each candidate's label (L = 1 for slot labels, the SID
      depth for SIDs).
    token_level: [V] int32, the label level of every vocabulary token (-1 = not a label token).
    opener: [V] bool, the label openers (module docstring).
    answer_start_id: the token id after which the answer span starts (static).
  """

  labels: jax.Array
  token_level: jax.Array
  opener: jax.Array
  answer_start_id: int = flax.struct.field(pytree_node=False)


def label_openers(vocab: dict[str, int]) -> list[int]:
  """The ids of the tokens that open a JSON string inside an array (`":["`, `","`: the text ends
  with a quote after a `[` or `,`), from a token -> id vocabulary."""
  return sorted(i for t, i in vocab.items()
                if t.endswith('"') and ("[" in t or "," in t))


def make_constraint(
  labels: np.ndarray, level_token_ids: list[list[int]], vocab_size: int, answer_start_id: int,
  opener_ids: list[int] = (),
) -> AnswerConstraint:
  """Builds an AnswerConstraint.

  Args:
    labels: [B, N, L] int label token ids of the candidates of each example.
    level_token_ids: for each label level l, every token id of that level (e.g. all slot tokens
      for L = 1; all `<a_*>` ids, then all `<b_*>` ids, ... for SIDs).
    vocab_size: V.
    answer_start_id: the `</think>` token id.
    opener_ids: the label openers' ids (label_openers); none = no label is required anywhere.

  Returns:
    The constraint.
  """
  labels = np.asarray(labels, np.int32)
  if labels.ndim != 3 or labels.shape[2] != len(level_token_ids):
    raise ValueError(
      f"make_constraint: labels {labels.shape} must be [B, N, L] with L = "
      f"{len(level_token_ids)} label levels"
    )
  token_level = np.full((vocab_size,), -1, np.int32)
  for level, ids in enumerate(level_token_ids):
    ids = np.asarray(ids, np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
      raise ValueError(f"make_constraint: level {level} token ids outside [0, {vocab_size})")
    token_level[ids] = level
  levels = token_level[labels]  # [B, N, L]
  if (levels != np.arange(labels.shape[2])).any():
    raise ValueError("make_constraint: a candidate label token is not a token of its level")
  opener = np.zeros((vocab_size,), bool)
  opener[np.asarray(opener_ids, np.int64)] = True
  if (opener & (token_level >= 0)).any():
    raise ValueError("make_constraint: a label opener is a label token")
  return AnswerConstraint(jnp.asarray(labels), jnp.asarray(token_level), jnp.asarray(opener),
                          int(answer_start_id))


def apply(
  constraint: AnswerConstraint, logits: jax.Array, targets: jax.Array, response: jax.Array
) -> jax.Array:
  """Sets the logits of disallowed label tokens inside the answer span to -inf.

  Args:
    constraint: the AnswerConstraint.
    logits: [B, K, V] logits that predict response indices `targets`.
    targets: [B, K] int32 response index each logit row predicts.
    response: [B, R] int32 the response so far (committed tokens; anything else -- the mask
      token -- is not a label or the start token).

  Returns:
    [B, K, V] logits.
  """
  b, r = response.shape
  n, depth = constraint.labels.shape[1:]
  idx = jnp.arange(r, dtype=jnp.int32)
  first_start = jnp.min(jnp.where(response == constraint.answer_start_id, idx, r), axis=-1)
  in_answer = targets > first_start[:, None]  # [B, K]

  # Candidates whose full label is committed somewhere in the answer span.
  padded = jnp.pad(response, ((0, 0), (0, depth)), constant_values=-1)
  windows = jnp.stack([padded[:, l : l + r] for l in range(depth)], axis=-1)  # [B, R, L]
  hit = jnp.all(windows[:, :, None, :] == constraint.labels[:, None], axis=-1)  # [B, R, N]
  used = jnp.any(hit & (idx > first_start[:, None])[:, :, None], axis=1)  # [B, N]

  # The committed token before each target: a mid-SID token pins the next level.
  prev = jnp.take_along_axis(response, jnp.clip(targets - 1, 0, r - 1), axis=1)  # [B, K]
  prev = jnp.where(targets >= 1, prev, -1)
  prev_level = jnp.where(prev >= 0, constraint.token_level[jnp.maximum(prev, 0)], -1)
  pinned = (prev_level >= 0) & (prev_level < depth - 1)  # [B, K]
  prev_code = jnp.take_along_axis(
    constraint.labels[:, None], jnp.clip(prev_level, 0)[:, :, None, None], axis=3
  )[..., 0]  # [B, K, N]: each candidate's token at prev's level
  level = jnp.arange(depth)[None, None, None, :]
  ok = ~used[:, None, :, None] & jnp.where(
    pinned[:, :, None, None],
    (prev_code == prev[:, :, None])[..., None] & (level == prev_level[:, :, None, None] + 1),
    True,
  )  # [B, K, N, L]
  k = targets.shape[1]
  rows = jnp.arange(b)[:, None, None, None]
  cols = jnp.arange(k)[None, :, None, None]
  tokens = jnp.broadcast_to(constraint.labels[:, None], (b, k, n, depth))
  allowed = jnp.zeros(logits.shape, bool).at[rows, cols, tokens].max(ok)
  is_label = constraint.token_level >= 0  # [V]
  banned = in_answer[:, :, None] & is_label[None, None, :] & ~allowed
  # After a committed opener, while a candidate is unused: only an unused label's first token.
  opened = in_answer & (prev >= 0) & constraint.opener[jnp.maximum(prev, 0)]  # [B, K]
  required = opened & ~jnp.all(used, axis=-1)[:, None]
  first_level = (constraint.token_level == 0)[None, None, :]
  banned |= required[:, :, None] & ~(allowed & first_level)
  return jnp.where(banned, -jnp.inf, logits)
