"""Optional constrained answer decoding (an ablation tool; off by default in the decoder).

The answer is `{"ranking":[label, ...]}` after the reasoning (gr2jax/data/prompts.py); a label is
one slot token (`answer_format='slot'`) or a candidate's SID, one token per level ('sid').

Answer span: the response positions after the first *committed* `answer_start_id` token (the
`</think>` id) and before the first committed `answer_end_id` token after it (the end of turn).
A position whose predecessors hold no committed start token is unconstrained, so under diffusion
a position can enter the span only once that token is committed; the tokens a block diffusion
decoder commits after the end of turn (its last block is filled to the end) are outside it and
use no candidate.

Inside the span label tokens are restricted, and a label is required where the JSON opens one
(other structural JSON tokens stay free):
  - a label token is allowed only if it belongs to a candidate that does not yet appear in full
    in the committed answer span (no out-of-set labels, no duplicates);
  - a label is required (only labels of unused candidates allowed; the first level after an
    opener) where the JSON opens one, after a committed *label opener* (a token that opens a
    string inside the array: `":["`, `","`; `label_openers`), and where the model's own top
    token is a label token, while an unused candidate is left. Forbidding a used label alone
    lets the runner-up be any other token (a newline: `"\n\n"`, malformed JSON, or an evidence
    token: out of set).

The decoder (decode.py) chooses the token from the constrained logits but commits by the
model's own confidence in it (its unconstrained probability, `propose`): a position
whose preferred token is forbidden waits for more context instead of committing its runner-up
with the confidence that the forbidden mass gives it after renormalisation.
RL replay (replay.py) scores the unconstrained policy; constrained decoding is for evaluation.
"""

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.diffusion import commit


@flax.struct.dataclass
class AnswerConstraint:
  """Per-example candidate labels and the label vocabulary.

  Attributes:
    labels: [B, N, L] int32 token ids of each candidate's label (L = 1 for slot labels, the SID
      depth for SIDs).
    token_level: [V] int32, the label level of every vocabulary token (-1 = not a label token).
    opener: [V] bool, the label openers (module docstring).
    answer_start_id: the token id after which the answer span starts (static).
    answer_end_id: the token id that ends the answer span (static; -1 = none).
  """

  labels: jax.Array
  token_level: jax.Array
  opener: jax.Array
  answer_start_id: int = flax.struct.field(pytree_node=False)
  answer_end_id: int = flax.struct.field(pytree_node=False, default=-1)


def label_openers(vocab: dict[str, int]) -> list[int]:
  """The ids of the tokens that open a JSON string inside an array (`":["`, `","`: the text ends
  with a quote after a `[` or `,`), from a token -> id vocabulary."""
  return sorted(i for t, i in vocab.items()
                if t.endswith('"') and ("[" in t or "," in t))


def make_constraint(
  labels: np.ndarray, level_token_ids: list[list[int]], vocab_size: int, answer_start_id: int,
  opener_ids: list[int] = (), answer_end_id: int = -1,
) -> AnswerConstraint:
  """Builds an AnswerConstraint.

  Args:
    labels: [B, N, L] int label token ids of the candidates of each example.
    level_token_ids: for each label level l, every token id of that level (e.g. all slot tokens
      for L = 1; all `<a_*>` ids, then all `<b_*>` ids, ... for SIDs).
    vocab_size: V.
    answer_start_id: the `</think>` token id.
    opener_ids: the label openers' ids (label_openers); none = no label is required anywhere.
    answer_end_id: the end-of-turn token id (-1 = the span runs to the end of the response).

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
                          int(answer_start_id), int(answer_end_id))


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
  ends = (response == constraint.answer_end_id) & (idx > first_start[:, None])
  first_end = jnp.min(jnp.where(ends, idx, r), axis=-1)
  span = (idx > first_start[:, None]) & (idx < first_end[:, None])  # [B, R]
  in_answer = (targets > first_start[:, None]) & (targets < first_end[:, None])  # [B, K]

  # Candidates whose full label is committed somewhere in the answer span.
  padded = jnp.pad(response, ((0, 0), (0, depth)), constant_values=-1)
  windows = jnp.stack([padded[:, l : l + r] for l in range(depth)], axis=-1)  # [B, R, L]
  hit = jnp.all(windows[:, :, None, :] == constraint.labels[:, None], axis=-1)  # [B, R, N]
  used = jnp.any(hit & span[:, :, None], axis=1)  # [B, N]

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
  # A label is required after a committed opener (its first level) and where the model's top
  # token is a label token, while an allowed label is left.
  opened = in_answer & (prev >= 0) & constraint.opener[jnp.maximum(prev, 0)]  # [B, K]
  wants_label = in_answer & (constraint.token_level[jnp.argmax(logits, axis=-1)] >= 0)
  need = jnp.where(opened[:, :, None], allowed & (constraint.token_level == 0)[None, None], allowed)
  required = (opened | wants_label) & jnp.any(need, axis=-1)
  banned |= required[:, :, None] & ~need
  return jnp.where(banned, -jnp.inf, logits)


def propose(constraint: AnswerConstraint, logits: jax.Array, targets: jax.Array,
            response: jax.Array, mask_token_id: int, temperature: float,
            key: jax.Array | None) -> tuple[jax.Array, jax.Array]:
  """commit.propose under the constraint: the token from the constrained logits, its log-prob
  the model's own (unconstrained; module docstring).

  Args:
    constraint, logits [B, K, V], targets [B, K], response [B, R]: as `apply`.
    mask_token_id, temperature, key: as commit.propose.

  Returns:
    tokens [B, K] int32 and their unconstrained log-probs [B, K] f32.
  """
  tokens, _ = commit.propose(apply(constraint, logits, targets, response), mask_token_id,
                             temperature, key)
  logp = commit.token_log_probs(logits, mask_token_id, temperature)
  return tokens, jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]
