"""The training batch type (`Batch`) and tokenized examples.

`Batch` is the one typed batch of every training stage (built by gr2jax/train/inputs.py
`make_batch`, filled by the on-policy prepare of gr2jax/train/rollouts.py). `encode_examples`
tokenizes each rendered piece (prompt, reasoning, answer, candidate labels) separately, so the
training batch, the evaluation prompts and re-ranking requests know where each piece starts.
"""

import dataclasses
from collections.abc import Sequence

import flax.struct
import jax
import numpy as np

from gr2jax.data.prompts import RenderedExample
from gr2jax.model.rounds import Rounds

Array = np.ndarray | jax.Array


@flax.struct.dataclass
class Batch:
  """The training batch of every stage: rows, their response, and what an on-policy stage adds.

  One type for all stages (not one per stage kind): the on-policy prepare (train/rollouts.py)
  turns the rows of `make_batch` into rollouts of the same fields (a sampled response instead of
  the teacher's) and adds its own; the train step, micro-batching and placement treat every
  stage's batch alike. A field nobody filled is None (a pytree without leaves). A loss
  reads named fields and declares them (train/step.py `Loss.fields`): `select` keeps only
  those, and only those are placed on the device.

  B rows (an on-policy stage: Bp prompts x G rollouts), P prompt slots, M response slots (R of
  the run), V the vocabulary.

  Rows (make_batch; an on-policy stage repeats each G times):
    prompt_tokens     [B, P] int32  right-padded with pad_id after prompt_lengths
    prompt_lengths    [B] int32     rows that only pad a short batch repeat the last prompt
    example_mask      [B] bool      False on rows that only pad a short batch
    target_position   [B] int32     the target's slot in D (host side: the reward reads it)
    example_index     [B] int32     the rows' split indices (BatchIterator; host side: the
                                    reward's labels), None from make_batch
  Response (make_batch: the teacher trace; on-policy: the rollout's sample, train/rollout.py):
    response_tokens   [B, M] int32  pad after response_lengths (make_batch) / after the stop
    response_lengths  [B] int32     tokens per row, the stop token included
    response_weights  [B, M] f32    each response token's loss weight: lambda_r / lambda_o on
                                    reasoning / answer (SFT, CFT); RL: 1 on the tokens of kept
                                    groups' rollouts; 0 on padding; OPD: None
  Trace (a DiffusionRollout's sample):
    trace_tokens      [B, M] int32  the decoder's committed canvas (the mask token where never
                                    committed)
    commit_step       [B, M] int32  each token's commit step (replay.py)
    commit_logprob    [B, M] f32    the sampler's log-prob of each committed token (host side)
    replay_rounds     Rounds        the replay's round count S (model/rounds.py): static (jit
                                    specialises on it)
    forwards          [B] int32     the decoder's forwards on each row (host side: the speed
                                    reward reads it)
  RL (rollouts.prepare with a reward):
    rewards           [B] f32       (host side: the stats)
    advantages        [B] f32       group z-scores, 0 in dropped groups
    logp_old          [B, M] f32    pi_old's log-probs of the sampled tokens
  OPD (rollouts.prepare with a teacher):
    teacher_log_probs [B, M, V] f32 or bf16  the AR teacher's distributions
  """

  prompt_tokens: Array | None = None
  prompt_lengths: Array | None = None
  example_mask: Array | None = None
  target_position: np.ndarray | None = None
  example_index: np.ndarray | None = None
  response_tokens: Array | None = None
  response_lengths: Array | None = None
  response_weights: Array | None = None
  trace_tokens: Array | None = None
  commit_step: Array | None = None
  commit_logprob: np.ndarray | None = None
  replay_rounds: Rounds | None = None
  forwards: np.ndarray | None = None
  rewards: np.ndarray | None = None
  advantages: Array | None = None
  logp_old: Array | None = None
  teacher_log_probs: Array | None = None

  @property
  def num_rows(self) -> int:
    """B."""
    return self.prompt_tokens.shape[0]

  def select(self, names) -> "Batch":
    """This batch with only the fields `names` set (every other field None).

    Args:
      names: field names (a loss's `fields`); each must be set in this batch.

    Returns:
      The Batch of those fields.
    """
    known = {f.name for f in dataclasses.fields(self)}
    names = set(names)
    for name in sorted(names):
      if name not in known:
        raise ValueError(f"Batch.select: no field {name!r}; fields: {sorted(known)}")
      if getattr(self, name) is None:
        raise ValueError(f"Batch.select: field {name!r} is not set in this batch (None)")
    return self.replace(**{name: None for name in known - names})



@dataclasses.dataclass(frozen=True)
class EncodedExample:
  """One tokenized example.

  Attributes:
    prompt: [P] int32 prompt tokens.
    reasoning: [R] int32 reasoning tokens (R = 0 without a teacher trace).
    answer: [A] int32 answer tokens, end of turn included (A = 0 without a teacher trace).
    label_tokens: [N, Lc] int32 tokens of each candidate's answer label.
    target_position: the target's slot in D.
  """

  prompt: np.ndarray
  reasoning: np.ndarray
  answer: np.ndarray
  label_tokens: np.ndarray
  target_position: int


def encode_examples(rendered: Sequence[RenderedExample], target_positions: Sequence[int],
                    tokenizer) -> list[EncodedExample]:
  """Tokenizes rendered examples (each piece separately, no extra special tokens).

  Args:
    rendered: the rendered examples.
    target_positions: [len(rendered)] the target's slot of each example.
    tokenizer: an HF tokenizer from gr2jax/data/tokenizer.py.

  Returns:
    The encoded examples, in order.
  """
  if len(rendered) != len(target_positions):
    raise ValueError(f"{len(rendered)} rendered examples but {len(target_positions)} targets")

  def encode(texts):
    ids = tokenizer(list(texts), add_special_tokens=False)["input_ids"] if texts else []
    return [np.asarray(i, np.int32) for i in ids]

  prompts = encode(r.prompt for r in rendered)
  reasonings = encode(r.reasoning for r in rendered)
  answers = encode(r.answer for r in rendered)
  labels = encode(label for r in rendered for label in r.labels)
  encoded, offset = [], 0
  for i, r in enumerate(rendered):
    example_labels = labels[offset:offset + len(r.labels)]
    offset += len(r.labels)
    if len({len(l) for l in example_labels}) != 1:
      raise ValueError(f"example {i}: candidate labels tokenize to different lengths "
                       f"{[len(l) for l in example_labels]}")
    encoded.append(EncodedExample(prompts[i], reasonings[i], answers[i],
                                  np.stack(example_labels), int(target_positions[i])))
  return encoded
