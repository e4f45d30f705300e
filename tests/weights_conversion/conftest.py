"""Shared helpers: tiny random HF Qwen3 models saved offline; the absl mains run in-process."""

import os

import pytest
import torch
import transformers
from absl import flags

# A tiny base config; tests override fields (tied/untied, GQA ratio, head_dim, rope).
BASE = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=False,
            max_position_embeddings=256)


def save_hf(directory: str, seed: int = 0, dtype=torch.float32, **overrides):
  """Saves a seeded random Qwen3ForCausalLM to `directory`; returns the (eval-mode) model."""
  torch.manual_seed(seed)
  config = transformers.Qwen3Config(**{**BASE, **overrides})
  model = transformers.Qwen3ForCausalLM(config).eval()
  with torch.no_grad():  # HF inits norms to ones; perturb them so a norm mix-up shows in tests.
    for name, p in model.named_parameters():
      if name.endswith("norm.weight"):
        p.add_(0.1 * torch.randn_like(p))
  model = model.to(dtype)
  model.save_pretrained(directory)
  return model


def word_tokenizer(directory, added=(), base: int = 90) -> str:
  """Saves a word-level tokenizer.json with base tokens t0..t<base-1> (+ `added` tokens from id
  `base` on) in directory; returns it."""
  import tokenizers

  os.makedirs(directory, exist_ok=True)
  tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(
    {f"t{i}": i for i in range(base)}, unk_token="t0"))
  tokenizer.add_tokens(list(added))
  tokenizer.save(os.path.join(directory, "tokenizer.json"))
  return str(directory)


def run_main(module, **flag_values) -> None:
  """Runs `module.main` as `python module.py --k=v ...` would, in this process."""
  argv = [module.__name__] + [f"--{k}={v}" for k, v in flag_values.items()]
  flags.FLAGS.unparse_flags()
  flags.FLAGS(argv)
  try:
    module.main(argv[:1])
  finally:
    flags.FLAGS.unparse_flags()


def leftovers(out_dir: str) -> list[str]:
  """Everything at or next to out_dir that a conversion might have left (temp dirs included)."""
  parent, name = os.path.split(os.path.abspath(out_dir))
  return [f for f in os.listdir(parent) if f == name or f.startswith(f".{name}.")]


@pytest.fixture(scope="module")
def hf_untied(tmp_path_factory):
  """(model, dir) of a tiny untied fp32 model."""
  d = str(tmp_path_factory.mktemp("hf_untied"))
  return save_hf(d, seed=1), d
