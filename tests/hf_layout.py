"""A random-weight Qwen3 checkpoint in the real HF layout, built offline at tiny size.

The GPU-box path reads a local HF directory (`config.json`, sharded `model-*-of-*.safetensors`
with `model.safetensors.index.json`, `tokenizer.json` + `tokenizer_config.json` with a chat
template, `generation_config.json`). `save_qwen3_dir` writes exactly that layout with
`transformers`' own `save_pretrained`, so CI runs the paper-scale code path at tiny size:

  from tests.hf_layout import save_qwen3_dir
  hf_dir = save_qwen3_dir(tmp_path / "Qwen3-tiny")

The tokenizer is a byte-level BPE trained on the shipped Beauty titles with Qwen3's special tokens
(`<|endoftext|>` pad, `<|im_start|>`, `<|im_end|>` eos) and `<think>` / `</think>` as plain added
tokens, as in Qwen3; its chat template follows Qwen3's (`enable_thinking=False` opens the answer
with an empty think block). The embedding table is padded past the tokenizer as Qwen3's is.
"""

import gzip
import itertools
import json
import os

import tokenizers
import torch
import transformers
from tokenizers import decoders, models, pre_tokenizers, trainers

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ITEMS = os.path.join(REPO_ROOT, "data", "amazon_beauty", "items.jsonl.gz")
SPECIAL = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
PLAIN = ("<think>", "</think>")

# Qwen3's template, reduced to what a chat of system / user / assistant turns needs.
CHAT_TEMPLATE = (
  "{%- for message in messages %}"
  "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
  "{%- endfor %}"
  "{%- if add_generation_prompt %}"
  "{{- '<|im_start|>assistant\\n' }}"
  "{%- if enable_thinking is defined and enable_thinking is false %}"
  "{{- '<think>\\n\\n</think>\\n\\n' }}"
  "{%- endif %}"
  "{%- endif %}")


def _titles(limit: int) -> list[str]:
  with gzip.open(ITEMS, "rt") as f:
    rows = (json.loads(line) for line in f)
    return [r.get("title") or "" for r in itertools.islice(rows, limit)]


def save_tokenizer(directory: str, *, vocab_size: int = 600,
                   corpus_items: int = 3000) -> transformers.PreTrainedTokenizerFast:
  """Trains and saves a Qwen3-like tokenizer (tokenizer.json + tokenizer_config.json)."""
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(
    vocab_size=vocab_size - len(SPECIAL) - len(PLAIN), show_progress=False,
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(_titles(corpus_items), trainer=trainer)
  tok.add_special_tokens([tokenizers.AddedToken(t, normalized=False, special=True)
                          for t in SPECIAL])
  tok.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False) for t in PLAIN])
  wrapped = transformers.PreTrainedTokenizerFast(
    tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
    clean_up_tokenization_spaces=False)
  wrapped.chat_template = CHAT_TEMPLATE
  wrapped.save_pretrained(directory)
  return wrapped


def save_qwen3_dir(directory, *, seed: int = 0, hidden_size: int = 32,
                   intermediate_size: int = 64, num_hidden_layers: int = 2,
                   num_attention_heads: int = 4, num_key_value_heads: int = 2,
                   head_dim: int = 16, padded_rows: int = 64, tie_word_embeddings: bool = False,
                   max_shard_size: str = "100KB", dtype=torch.float32) -> str:
  """Writes a seeded random Qwen3ForCausalLM + tokenizer in the HF layout; returns the dir.

  Args:
    directory: output directory (created).
    seed: torch seed of the random weights.
    hidden_size, intermediate_size, num_hidden_layers, num_attention_heads,
      num_key_value_heads, head_dim, tie_word_embeddings: the Qwen3Config dimensions.
    padded_rows: embedding rows past the tokenizer's length (Qwen3: 151,936 rows for 151,669
      tokens), which convert_hf.py --add_tokens reuses for added tokens.
    max_shard_size: shard size for save_pretrained (small: several shards + the index).
    dtype: torch dtype of the saved weights.

  Returns:
    The directory as a string.
  """
  directory = os.fspath(directory)
  tok = save_tokenizer(directory)
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(
    vocab_size=len(tok) + padded_rows, hidden_size=hidden_size,
    intermediate_size=intermediate_size, num_hidden_layers=num_hidden_layers,
    num_attention_heads=num_attention_heads, num_key_value_heads=num_key_value_heads,
    head_dim=head_dim, tie_word_embeddings=tie_word_embeddings, max_position_embeddings=4096,
    bos_token_id=tok.convert_tokens_to_ids("<|endoftext|>"),
    eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"),
    pad_token_id=tok.convert_tokens_to_ids("<|endoftext|>"))
  model = transformers.Qwen3ForCausalLM(config).eval().to(dtype)
  model.generation_config = transformers.GenerationConfig(
    eos_token_id=[config.eos_token_id, config.pad_token_id], pad_token_id=config.pad_token_id)
  model.save_pretrained(directory, max_shard_size=max_shard_size)
  return directory
