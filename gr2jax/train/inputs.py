"""From the TFDS dataset to static-shape training and evaluation batches.

`load_split` reads one split of `amazon_beauty_gr2` (grain-free random access, no TensorFlow),
re-tokenizes its rendered text with the run's tokenizer and keeps the fields evaluation needs.
Training batches are gr2jax/data/batches.py's concatenated layout plus the prompt and the
response as separate right-padded arrays, since every later stage decodes from prompts:

  prompt_tokens    [B, P] int32  pad_id after prompt_lengths[b]
  response_tokens  [B, R] int32  reasoning + answer (+ end of turn), pad_id after response_lengths
  response_lengths [B]    int32
  response_weights [B, R] f32    lambda_r / lambda_o per response token, 0 on padding

P and R are static per run (`prompt_len`, `response_len`; a longer example is an error naming
them). `BatchIterator` is a seeded, epoch-reshuffled iterator whose position (epoch, index) is
saved with each run checkpoint, so a resumed run sees the same next batch.
"""

import dataclasses
import os

import numpy as np

from gr2jax.data import batches, tfds_builder
from gr2jax.data.prompts import RenderedExample


@dataclasses.dataclass(frozen=True)
class SplitData:
  """One split, tokenized.

  Attributes:
    encoded: the encoded examples (prompt / reasoning / answer tokens, label tokens, target).
    users: [E] user ids.
    labels: [E] tuples of the N candidate label strings (D's order), for the answer parser.
    teacher_top1: [E] the rule teacher's top-1 slot, -1 without a teacher ranking.
    source: what was read: the data build's TFDS directory name (it holds the build's key),
      the split and the number of records (an evaluation cache key; '' for hand-made data).
  """

  encoded: list
  users: np.ndarray
  labels: list
  teacher_top1: np.ndarray
  source: str = ""

  def __len__(self) -> int:
    return len(self.encoded)

  @property
  def target_position(self) -> np.ndarray:
    return np.asarray([e.target_position for e in self.encoded], np.int32)


def load_split(tfds_dir: str, split: str, tokenizer, *, limit: int = 0) -> SplitData:
  """Reads and tokenizes one split (the first `limit` records when limit > 0).

  Args:
    tfds_dir: the TFDS data directory of the data build (summary['paths']['tfds']).
    split: 'train', 'validation', 'test' or 'test_1615'.
    tokenizer: the build's tokenizer (gr2jax.data.tokenizer.load_tokenizer).
    limit: read at most this many records (0 = all).

  Returns:
    The split's SplitData, in record order.
  """
  source = tfds_builder.data_source(tfds_dir, split)
  n = len(source) if limit <= 0 else min(limit, len(source))
  records = [tfds_builder.decode_record(source[i]) for i in range(n)]
  if not records:
    raise ValueError(f"split {split!r} of {tfds_dir} has no records")
  rendered = [RenderedExample(r["prompt"], r["reasoning"], r["answer"], r["labels"])
              for r in records]
  encoded = batches.encode_examples(rendered, [int(r["target_position"]) for r in records],
                                    tokenizer)
  teacher = [int(r["teacher_ranking"][0]) if len(r["teacher_ranking"]) == len(r["labels"])
             else -1 for r in records]
  return SplitData(encoded=encoded, users=np.asarray([int(r["user"]) for r in records]),
                   labels=[tuple(r["labels"]) for r in records],
                   teacher_top1=np.asarray(teacher, np.int32),
                   source=f"{os.path.basename(os.path.normpath(tfds_dir))}/{split}[:{n}]")


def prompt_arrays(examples: list, batch_size: int, prompt_len: int, pad_id: int):
  """Right-padded prompts: (prompt_tokens [B, P] int32, prompt_lengths [B] int32); rows past
  len(examples) repeat the last prompt (their results are dropped by example_mask)."""
  tokens = np.full((batch_size, prompt_len), pad_id, np.int32)
  lengths = np.zeros((batch_size,), np.int32)
  for b in range(batch_size):
    prompt = examples[min(b, len(examples) - 1)].prompt
    if len(prompt) > prompt_len:
      raise ValueError(f"prompt of {len(prompt)} tokens exceeds prompt_len={prompt_len}")
    tokens[b, :len(prompt)] = prompt
    lengths[b] = len(prompt)
  return tokens, lengths


def make_train_batch(examples: list, *, batch_size: int, prompt_len: int, response_len: int,
                     pad_id: int, lambda_r: float, lambda_o: float) -> dict:
  """batches.make_batch (bucket = P + R) plus the prompt / response arrays (module docstring)."""
  for ex in examples:
    if len(ex.prompt) > prompt_len:
      raise ValueError(f"prompt of {len(ex.prompt)} tokens exceeds prompt_len={prompt_len}")
    if len(ex.reasoning) + len(ex.answer) > response_len:
      raise ValueError(f"response of {len(ex.reasoning) + len(ex.answer)} tokens exceeds "
                       f"response_len={response_len}")
  batch = batches.make_batch(examples, batch_size=batch_size,
                             buckets=(prompt_len + response_len,), pad_id=pad_id,
                             lambda_r=lambda_r, lambda_o=lambda_o)
  prompt_tokens, prompt_lengths = prompt_arrays(examples, batch_size, prompt_len, pad_id)
  response = np.full((batch_size, response_len), pad_id, np.int32)
  weights = np.zeros((batch_size, response_len), np.float32)
  response_lengths = np.zeros((batch_size,), np.int32)
  for b, ex in enumerate(examples):
    tokens = np.concatenate([ex.reasoning, ex.answer])
    response[b, :len(tokens)] = tokens
    response_lengths[b] = len(tokens)
    p = len(ex.prompt)
    weights[b, :len(tokens)] = batch["loss_weights"][b, p:p + len(tokens)]
  # Rows that only pad a short batch keep zero weights; their prompts must stay real for decoding.
  prompt_lengths[len(examples):] = prompt_lengths[len(examples) - 1]
  return {**batch, "prompt_tokens": prompt_tokens, "prompt_lengths": prompt_lengths,
          "response_tokens": response, "response_lengths": response_lengths,
          "response_weights": weights}


class BatchIterator:
  """Seeded batches over a split, reshuffled per epoch; its position is checkpointable.

  Batch i of epoch e holds the examples permutation(seed, e)[i * B:(i + 1) * B] (a short last
  batch is dropped), so `(epoch, index)` fully determines what comes next.
  """

  def __init__(self, data: SplitData, *, batch_size: int, seed: int, **batch_kwargs):
    if len(data) < batch_size:
      raise ValueError(f"split of {len(data)} examples is smaller than one batch of {batch_size}")
    self.data, self.batch_size, self.seed = data, batch_size, seed
    self.batch_kwargs = batch_kwargs
    self.epoch, self.index = 0, 0

  @property
  def batches_per_epoch(self) -> int:
    return len(self.data) // self.batch_size

  def rows(self) -> np.ndarray:
    """[B] example indices of the next batch (without advancing)."""
    order = np.random.default_rng([self.seed, self.epoch]).permutation(len(self.data))
    return order[self.index * self.batch_size:(self.index + 1) * self.batch_size]

  def __iter__(self):
    return self

  def __next__(self) -> dict:
    rows = self.rows()
    batch = make_train_batch([self.data.encoded[i] for i in rows], batch_size=self.batch_size,
                             **self.batch_kwargs)
    batch["example_index"] = rows.astype(np.int32)
    self.index += 1
    if self.index == self.batches_per_epoch:
      self.epoch, self.index = self.epoch + 1, 0
    return batch

  def get_state(self) -> dict:
    return {"epoch": self.epoch, "index": self.index, "seed": self.seed,
            "size": len(self.data), "batch_size": self.batch_size}

  def set_state(self, state: dict) -> None:
    """Restores a position from `get_state`; a different split or batch size is an error."""
    mine = self.get_state()
    for k in ("seed", "size", "batch_size"):
      if int(state[k]) != mine[k]:
        raise ValueError(f"iterator state has {k}={state[k]}, this run has {mine[k]}: the data "
                         "or the batch size changed since the checkpoint was written")
    self.epoch, self.index = int(state["epoch"]), int(state["index"])
