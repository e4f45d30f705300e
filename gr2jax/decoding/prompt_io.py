"""Prompt I/O of every decode: a tokenized split, right-padded prompt arrays, what steers a
decode, and the detokenised responses.

`load_split` reads one split of `amazon_beauty_gr2` (random access, no TensorFlow), re-tokenizes
its rendered text with the run's tokenizer and keeps the fields evaluation needs (training builds
its batches from the same SplitData, gr2jax/train/inputs.py). `prompt_arrays` pads prompts into
the static [B, P] shape every decoder takes (the evaluation, the reranker, the server);
`steering` builds a batch's decoder options (the answer constraint of its candidates,
diffusion/constrain.py, when the decode spec is constrained; a given reasoning prefix);
`response_texts` turns decoded tokens back into the text the answer parser reads.
"""

import dataclasses
import os
import re

import numpy as np

from gr2jax.data import batches, prompts
from gr2jax.decoding import policy as policy_lib
from gr2jax.diffusion import constrain
from gr2jax.diffusion import decode as diffusion_decode
from gr2jax.model.config import ModelConfig


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
  # TFDS loads here, not with the module: the server's path (prompt arrays, steering, response
  # texts) reads no split and must not import tensorflow_datasets.
  from gr2jax.data import tfds_builder

  source = tfds_builder.data_source(tfds_dir, split)
  n = len(source) if limit <= 0 else min(limit, len(source))
  records = [tfds_builder.decode_record(source[i]) for i in range(n)]
  if not records:
    raise ValueError(f"split {split!r} of {tfds_dir} has no records")
  rendered = [prompts.RenderedExample(r["prompt"], r["reasoning"], r["answer"], r["labels"])
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


def label_levels(tokenizer, depth: int) -> list[list[int]]:
  """Token ids of each answer-label level: slot tokens (depth 1) or the SID levels a, b, c, d."""
  vocab = tokenizer.get_vocab()
  patterns = [r"<slot_\d+>"] if depth == 1 else [rf"<{c}_\d+>" for c in "abcdefgh"[:depth]]
  return [sorted(i for t, i in vocab.items() if re.fullmatch(p, t)) for p in patterns]


def answer_constraint(tokenizer, config: ModelConfig, label_tokens: np.ndarray):
  """The decoding-time answer constraint (diffusion/constrain.py) of a batch's candidates.

  Args:
    tokenizer: the data build's tokenizer.
    config: the model (its vocabulary size).
    label_tokens: [B, N, Lc] int32 each candidate's label tokens.
  """
  return constrain.make_constraint(label_tokens, label_levels(tokenizer, label_tokens.shape[2]),
                                   config.vocab_size,
                                   tokenizer.convert_tokens_to_ids(prompts.THINK_END),
                                   constrain.label_openers(tokenizer.get_vocab()),
                                   tokenizer.convert_tokens_to_ids(prompts.IM_END))


def response_texts(tokenizer, tokens: np.ndarray, lengths: np.ndarray) -> list[str]:
  """Detokenized responses (special tokens kept, so the parser sees the end of turn)."""
  return [tokenizer.decode(row[:n].tolist(), skip_special_tokens=False)
          for row, n in zip(tokens, lengths, strict=True)]


def _given_reasoning(chunk: list, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(tokens [B, F], lengths [B]) of each example's own reasoning (rows past the chunk repeat
  its last example)."""
  if not all(len(e.reasoning) for e in chunk):
    raise ValueError("evaluate: given_reasoning needs a split whose examples carry reasoning "
                     "(validation / test have none; use 'train')")
  width = max(len(e.reasoning) for e in chunk)
  given = np.zeros((batch_size, width), np.int32)
  given_lengths = np.zeros((batch_size,), np.int32)
  for i in range(batch_size):
    reasoning = chunk[min(i, len(chunk) - 1)].reasoning
    given[i, :len(reasoning)] = reasoning
    given_lengths[i] = len(reasoning)
  return given, given_lengths


def steering(policy: policy_lib.Policy, tokenizer, chunk: list, batch_size: int,
             given_reasoning: bool = False) -> diffusion_decode.Steering:
  """What steers the decode of one batch: the answer constraint when policy.spec.constrained,
  each example's own reasoning when given_reasoning (both block-diffusion options)."""
  constraint = prefix = None
  if policy.spec.constrained:
    labels = np.stack([e.label_tokens for e in chunk])
    labels = np.concatenate([labels, np.repeat(labels[-1:], batch_size - len(chunk), 0)])
    constraint = answer_constraint(tokenizer, policy.config, labels)
  if given_reasoning:
    prefix = _given_reasoning(chunk, batch_size)
  return diffusion_decode.Steering(constraint=constraint, response_prefix=prefix)
