"""From a tokenized split (decoding/prompt_io.SplitData) to the one typed training batch.

`make_batch` is the one builder of training rows (gr2jax/data/batches.py `Batch`): the prompt
(decoding/prompt_io.prompt_arrays, as every decode pads it) and the response (reasoning + answer,
end of turn included) as separate right-padded arrays, since SFT and CFT score the response
given the prompt and every later stage decodes from the prompts. P and R are static per run
(`prompt_len`, `response_len`; a longer example is an error naming them). `BatchIterator` is a
seeded, epoch-reshuffled iterator whose position (epoch, index) is saved with each run
checkpoint, so a resumed run sees the same next batch.

GR2's decoupled SFT loss (GR2, arXiv 2602.07774: L = -lambda_r sum_i log P(r_i | P, r_<i) -
lambda_o sum_j log P(o_j | P, r, o_<j)) weights reasoning tokens by lambda_r and answer tokens
by lambda_o: `response_weights[b, j]` is the weight of predicting response token j (0 on padding).
"""

import numpy as np

from gr2jax.data.batches import Batch
from gr2jax.decoding.prompt_io import SplitData, prompt_arrays


def make_batch(examples: list, *, batch_size: int, prompt_len: int, response_len: int,
               pad_id: int, lambda_r: float, lambda_o: float) -> Batch:
  """The one training-batch builder: up to `batch_size` encoded examples as a Batch's rows.

  Args:
    examples: 1..batch_size EncodedExamples (gr2jax/data/batches.py).
    batch_size: B; rows past len(examples) repeat the last prompt with an empty response, zero
      weights and example_mask False.
    prompt_len: P, the prompt slots (a longer prompt is an error naming it).
    response_len: R, the response slots (a longer reasoning + answer is an error naming it).
    pad_id: the padding token id.
    lambda_r: loss weight of reasoning tokens.
    lambda_o: loss weight of answer tokens.

  Returns:
    A Batch with the row and response fields set (example_index None; the on-policy fields
    None).
  """
  if not 0 < len(examples) <= batch_size:
    raise ValueError(f"{len(examples)} examples for a batch of {batch_size}")
  prompt_tokens, prompt_lengths = prompt_arrays(examples, batch_size, prompt_len, pad_id)
  response = np.full((batch_size, response_len), pad_id, np.int32)
  weights = np.zeros((batch_size, response_len), np.float32)
  response_lengths = np.zeros((batch_size,), np.int32)
  target_position = np.zeros((batch_size,), np.int32)
  for b, ex in enumerate(examples):
    r, n = len(ex.reasoning), len(ex.reasoning) + len(ex.answer)
    if n > response_len:
      raise ValueError(f"response of {n} tokens exceeds response_len={response_len}")
    response[b, :n] = np.concatenate([ex.reasoning, ex.answer])
    weights[b, :r] = lambda_r
    weights[b, r:n] = lambda_o
    response_lengths[b] = n
    target_position[b] = ex.target_position
  return Batch(prompt_tokens=prompt_tokens, prompt_lengths=prompt_lengths,
               example_mask=np.arange(batch_size) < len(examples),
               target_position=target_position, response_tokens=response,
               response_lengths=response_lengths, response_weights=weights)


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

  def __next__(self) -> Batch:
    rows = self.rows()
    batch = make_batch([self.data.encoded[i] for i in rows], batch_size=self.batch_size,
                       **self.batch_kwargs).replace(example_index=rows.astype(np.int32))
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
