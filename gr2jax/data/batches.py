"""Static-shape training batches: tokenized prompt + response, loss weights, answer spans.

GR2's decoupled SFT loss (research/papers.md §1.4) weights reasoning tokens by lambda_r and answer
tokens by lambda_o:
  L = -lambda_r sum_i log P(r_i | P, r_<i) - lambda_o sum_j log P(o_j | P, r, o_<j).
`loss_weights[b, t]` is the weight of *predicting token t* (from position t - 1's logits); prompt
and padding tokens weigh 0. Sequences are right-padded to the smallest length bucket that holds
the longest sequence of the batch, so a jitted step sees only a few shapes.

Batch dict (numpy), B = batch size, T = bucket length, N = candidates, Lc = tokens per label:
  tokens          [B, T] int32   prompt + reasoning + answer, then pad_id
  positions       [B, T] int32   0..T-1
  valid           [B, T] bool    True on the `lengths[b]` real tokens
  loss_weights    [B, T] f32     lambda_r on reasoning tokens, lambda_o on answer tokens, else 0
  lengths         [B]    int32   real tokens per row
  prompt_lengths  [B]    int32   prompt tokens (the response starts here)
  answer_start    [B]    int32   first answer token (after `</think>\\n\\n`)
  answer_end      [B]    int32   one past the last answer token (== lengths)
  candidate_tokens [B, N, Lc] int32  each candidate's label tokens (SID: Lc=4, slot: Lc=1)
  target_position [B]    int32   the target's slot in D
  example_mask    [B]    bool    False on rows that only pad a short last batch
"""

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from gr2jax.data.prompts import RenderedExample


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

  @property
  def length(self) -> int:
    return len(self.prompt) + len(self.reasoning) + len(self.answer)


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


def bucket_length(length: int, buckets: Sequence[int]) -> int:
  """The smallest bucket >= length; raises when the longest bucket is too short."""
  fitting = [b for b in sorted(buckets) if b >= length]
  if not fitting:
    raise ValueError(f"sequence of {length} tokens exceeds the longest length bucket "
                     f"{max(buckets)}; raise the buckets or shorten the prompt")
  return fitting[0]


def make_batch(examples: Sequence[EncodedExample], *, batch_size: int, buckets: Sequence[int],
               pad_id: int, lambda_r: float, lambda_o: float) -> dict[str, np.ndarray]:
  """Pads up to `batch_size` examples into one static-shape batch (see the module docstring).

  Args:
    examples: 1..batch_size encoded examples with the same number of candidates and label length.
    batch_size: B; missing rows are padding with example_mask False and zero loss weights.
    buckets: allowed sequence lengths T.
    pad_id: the padding token id.
    lambda_r: loss weight of reasoning tokens.
    lambda_o: loss weight of answer tokens.

  Returns:
    The batch dict.
  """
  if not 0 < len(examples) <= batch_size:
    raise ValueError(f"{len(examples)} examples for a batch of {batch_size}")
  label_shape = examples[0].label_tokens.shape
  for i, ex in enumerate(examples):
    if ex.label_tokens.shape != label_shape:
      raise ValueError(f"batch row {i}: label tokens {ex.label_tokens.shape} != {label_shape}")
  lengths = [ex.length for ex in examples]
  t = bucket_length(max(lengths), buckets)
  tokens = np.full((batch_size, t), pad_id, np.int32)
  weights = np.zeros((batch_size, t), np.float32)
  spans = np.zeros((batch_size, 3), np.int32)  # prompt_length, answer_start, length
  candidate_tokens = np.zeros((batch_size, *label_shape), np.int32)
  target_position = np.zeros((batch_size,), np.int32)
  for b, ex in enumerate(examples):
    p, r = len(ex.prompt), len(ex.reasoning)
    tokens[b, :lengths[b]] = np.concatenate([ex.prompt, ex.reasoning, ex.answer])
    weights[b, p:p + r] = lambda_r
    weights[b, p + r:lengths[b]] = lambda_o
    spans[b] = (p, p + r, lengths[b])
    candidate_tokens[b] = ex.label_tokens
    target_position[b] = ex.target_position
  return {
    "tokens": tokens,
    "positions": np.broadcast_to(np.arange(t, dtype=np.int32), (batch_size, t)).copy(),
    "valid": np.arange(t)[None, :] < spans[:, 2:3],
    "loss_weights": weights,
    "lengths": spans[:, 2].copy(),
    "prompt_lengths": spans[:, 0].copy(),
    "answer_start": spans[:, 1].copy(),
    "answer_end": spans[:, 2].copy(),
    "candidate_tokens": candidate_tokens,
    "target_position": target_position,
    "example_mask": np.arange(batch_size) < len(examples),
  }


def iterate_batches(examples: Sequence[EncodedExample], *, batch_size: int,
                    buckets: Sequence[int], pad_id: int, lambda_r: float, lambda_o: float,
                    seed: int, shuffle: bool = True, drop_remainder: bool = True,
                    num_epochs: int | None = 1) -> Iterator[dict[str, np.ndarray]]:
  """Batches over a split, reshuffled each epoch with a (seed, epoch)-derived permutation.

  Args:
    examples: the split's encoded examples.
    batch_size: B.
    buckets: allowed sequence lengths T.
    pad_id: the padding token id.
    lambda_r: loss weight of reasoning tokens.
    lambda_o: loss weight of answer tokens.
    seed: shuffling seed; the same seed gives the same batches.
    shuffle: False keeps the split's order (evaluation).
    drop_remainder: drop a short last batch instead of padding it (example_mask False).
    num_epochs: passes over the data; None repeats forever.

  Yields:
    Batch dicts (see the module docstring).
  """
  if not examples or (drop_remainder and len(examples) < batch_size):
    raise ValueError(f"iterate_batches got {len(examples)} examples for batches of {batch_size}")
  epoch = 0
  while num_epochs is None or epoch < num_epochs:
    order = (np.random.default_rng([seed, epoch]).permutation(len(examples)) if shuffle
             else np.arange(len(examples)))
    stop = len(order) - len(order) % batch_size if drop_remainder else len(order)
    for start in range(0, stop, batch_size):
      rows = [examples[i] for i in order[start:start + batch_size]]
      yield make_batch(rows, batch_size=batch_size, buckets=buckets, pad_id=pad_id,
                       lambda_r=lambda_r, lambda_o=lambda_o)
    epoch += 1
