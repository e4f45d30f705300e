"""Tokenizers in HF format: a small byte-level BPE for the tiny model, or an extended Qwen3 one.

Both carry the same added tokens (prompts.added_tokens: one token per SID level/code, per slot
label and per evidence bucket) and the chat tokens (prompts.CHAT_TOKENS, `<|mask|>` included), so
every SID code in a prompt is a single token. Chat tokens are *special* (`skip_special_tokens`
drops them); SID, slot and evidence tokens are ordinary added tokens and survive decoding.
eos = `<|im_end|>` (end of the assistant turn), pad = `<|endoftext|>`, as in Qwen3.

`load_tokenizer` reads a saved directory as transformers' PreTrainedTokenizerFast over its
tokenizer.json (with tokenizer_config.json's special tokens), never through AutoTokenizer, whose
model registry imports torch: an export loads its tokenizer without it (a serving replica never
imports torch). transformers itself is imported only when a tokenizer is loaded, trained or
extended, so importing this module (and the server) does not import it.
"""

import os
import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from gr2jax.data import prompts

if TYPE_CHECKING:
  import transformers

ADDED_TOKENS_FILE = "added_tokens.txt"
# What load_tokenizer reads of a tokenizer directory: without tokenizer.json transformers asks for
# sentencepiece, without tokenizer_config.json it loads with no eos / pad token.
FILES = ("tokenizer.json", "tokenizer_config.json")
_TOKEN_PATTERN = re.compile(r"<\|?[A-Za-z/]+(?:_\d+)?\|?>")


def _added_token(content: str, special: bool) -> tokenizers.AddedToken:
  return tokenizers.AddedToken(content, single_word=False, lstrip=False, rstrip=False,
                               normalized=False, special=special)


def _corpus(texts: Iterable[str]) -> Iterable[str]:
  """The text between added/chat tokens, one piece per training string.

  Encoding splits text at added tokens too, so merges are learned on exactly the pieces that get
  encoded (e.g. `","` between two slot labels) and never on the tokens' own characters.
  """
  for text in texts:
    yield from (piece for piece in _TOKEN_PATTERN.split(text) if piece)


def _wrap(tokenizer: tokenizers.Tokenizer) -> "transformers.PreTrainedTokenizerFast":
  import transformers

  return transformers.PreTrainedTokenizerFast(
    tokenizer_object=tokenizer, eos_token=prompts.IM_END, pad_token=prompts.END_OF_TEXT,
    clean_up_tokenization_spaces=False)


def train_tokenizer(texts: Iterable[str], out_dir: str, *, vocab_size: int,
                    codes_per_level: tuple[int, ...], num_slots: int,
                    evidence_levels: int) -> "transformers.PreTrainedTokenizerFast":
  """Trains a byte-level BPE on `texts`, adds the prompt tokens and saves it in HF format.

  Args:
    texts: training texts (item text and rendered prompts/responses); added tokens in them are
      ignored for the merges.
    out_dir: where `load_tokenizer(out_dir)` (or transformers' AutoTokenizer) will find it.
    vocab_size: total vocabulary size, chat + added tokens included (an upper bound: a small
      corpus can run out of merges first).
    codes_per_level: SID codes per level, e.g. (256, 256, 256, max_collision + 1).
    num_slots: number of slot labels (N).
    evidence_levels: evidence buckets per kind.

  Returns:
    The saved tokenizer.
  """
  added = prompts.added_tokens(codes_per_level, num_slots, evidence_levels)
  bpe_size = vocab_size - len(added)
  min_size = len(prompts.CHAT_TOKENS) + 256 + 64
  if bpe_size < min_size:
    raise ValueError(f"vocab_size={vocab_size} leaves {bpe_size} BPE tokens after {len(added)} "
                     f"added tokens; need at least {min_size}")
  tokenizer = tokenizers.Tokenizer(models.BPE())
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=bpe_size, show_progress=False,
    special_tokens=[_added_token(t, special=True) for t in prompts.CHAT_TOKENS],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tokenizer.train_from_iterator(_corpus(texts), trainer=trainer)
  tokenizer.add_tokens([_added_token(t, special=False) for t in added])
  wrapped = _wrap(tokenizer)
  wrapped.save_pretrained(out_dir)
  return wrapped


def extend_tokenizer(base_dir: str, out_dir: str, *, codes_per_level: tuple[int, ...],
                     num_slots: int, evidence_levels: int) -> list[str]:
  """Adds the prompt tokens and `<|mask|>` to a local (Qwen3) tokenizer; the 8B path.

  Writes the extended tokenizer to `out_dir` and the newly added tokens, one per line in id order,
  to `out_dir/added_tokens.txt` for `weights_conversion/convert_hf.py --add_tokens=FILE`.

  Args:
    base_dir: a local HF tokenizer directory (nothing is downloaded).
    out_dir: output directory.
    codes_per_level: SID codes per level.
    num_slots: number of slot labels (N).
    evidence_levels: evidence buckets per kind.

  Returns:
    The tokens that were added (those already in the vocabulary are skipped).
  """
  if not os.path.isdir(base_dir):
    raise FileNotFoundError(f"{base_dir}: not a local tokenizer directory")
  import transformers  # AutoTokenizer: the base model's own class (a conversion step, not serving)

  tokenizer = transformers.AutoTokenizer.from_pretrained(base_dir)
  vocab = tokenizer.get_vocab()
  chat = [t for t in prompts.CHAT_TOKENS if t not in vocab]
  plain = [t for t in prompts.added_tokens(codes_per_level, num_slots, evidence_levels)
           if t not in vocab]
  tokenizer.add_tokens([_added_token(t, special=True) for t in chat], special_tokens=True)
  tokenizer.add_tokens([_added_token(t, special=False) for t in plain])
  tokenizer.save_pretrained(out_dir)
  new = chat + plain
  with open(os.path.join(out_dir, ADDED_TOKENS_FILE), "w") as f:
    f.writelines(t + "\n" for t in new)
  return new


def load_tokenizer(path: str) -> "transformers.PreTrainedTokenizerFast":
  """Loads a saved tokenizer directory (local only) without importing torch.

  The tokenizer is transformers' PreTrainedTokenizerFast over the directory's tokenizer.json,
  with tokenizer_config.json's settings (eos / pad tokens, clean-up): the class
  train_tokenizer saves (AutoTokenizer gives the same), and for an extended Qwen3 tokenizer
  the same ids as AutoTokenizer's Qwen2Tokenizer, whose built-in pipeline (NFC, Qwen's split
  pattern, byte level) is the one Qwen3's tokenizer.json holds (tests/data/test_tokenizer.py
  holds both kinds to AutoTokenizer's encode and decode, added and special tokens included).

  Raises:
    FileNotFoundError: the directory lacks a file of FILES (names the directory and the files).
  """
  missing = [name for name in FILES if not os.path.isfile(os.path.join(path, name))]
  if missing:
    raise FileNotFoundError(f"{path}: no tokenizer file(s) {', '.join(missing)} (a tokenizer "
                            f"directory holds {' and '.join(FILES)})")
  from transformers import PreTrainedTokenizerFast

  return PreTrainedTokenizerFast.from_pretrained(path, local_files_only=True)


def mask_token_id(tokenizer) -> int:
  """The id of the tokenizer's <|mask|> token (the block-diffusion mask).

  Raises:
    ValueError: the tokenizer has no <|mask|> token.
  """
  mask_id = tokenizer.convert_tokens_to_ids(prompts.MASK_TOKEN)
  if mask_id is None or mask_id == tokenizer.unk_token_id:
    raise ValueError(f"the tokenizer has no {prompts.MASK_TOKEN} token to convert to diffusion")
  return int(mask_id)

