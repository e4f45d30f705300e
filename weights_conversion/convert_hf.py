r"""Converts a local HF Qwen3 directory into a gr2jax (orbax) checkpoint.

  python weights_conversion/convert_hf.py --hf_dir=DIR --out_dir=OUT \
      [--param_dtype=float32|bfloat16] [--add_tokens=FILE] [--add_tokens_seed=0]

Reads DIR/config.json (`ModelConfig.from_hf_dict`: unsupported fields are an error naming them)
and the weights: `model.safetensors.index.json` + shards, a single `model.safetensors`, or
`pytorch_model*.bin` (torch.load with weights_only=True). Tensors are streamed shard by shard, one
at a time, into preallocated numpy buffers through the table in hf_table.py (every HF tensor used
exactly once, every param filled once with the right shape), so peak memory stays close to the
size of the converted params. Writes OUT/gr2jax_config.json, OUT/params/ (orbax) and copies the
tokenizer files it finds. Everything is written to a temp directory next to OUT and renamed at the
end: on any error nothing is left at OUT.

--add_tokens=FILE (one token per line) appends rows to the embedding (and the untied LM head):
row init = mean of the existing rows + N(0, (1e-3 * per-dimension std)^2) noise from
--add_tokens_seed, so new tokens start as an "average" token and are distinguishable. The grown
vocab size goes into the config and OUT/added_token_ids.json maps each new token to its id
(ids start at the old vocab_size; the tokenizer files are copied unchanged).
"""

import dataclasses
import glob
import json
import os
import shutil
import sys
from collections.abc import Iterator

import ml_dtypes
import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import checkpoint  # noqa: E402
from gr2jax.model import params as params_lib  # noqa: E402
from gr2jax.model.config import ModelConfig  # noqa: E402
from weights_conversion import hf_table, safetensors_io  # noqa: E402

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")
ADDED_IDS_FILE = "added_token_ids.json"
_NOISE_SCALE = 1e-3


def weight_files(hf_dir: str) -> list[str]:
  """The weight files of an HF directory, in load order.

  Args:
    hf_dir: the HF model directory.

  Returns:
    Paths of safetensors shards (from the index, else `model.safetensors`, else `*.safetensors`)
    or of `pytorch_model*.bin` files.

  Raises:
    FileNotFoundError: no weights, or the index names a missing shard.
  """
  for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
    index = os.path.join(hf_dir, index_name)
    if os.path.isfile(index):
      with open(index) as f:
        weight_map = json.load(f)["weight_map"]
      files = [os.path.join(hf_dir, s) for s in dict.fromkeys(weight_map.values())]
      for file in files:
        if not os.path.isfile(file):
          raise FileNotFoundError(f"{index}: shard {os.path.basename(file)} does not exist")
      return files
  files = (sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
           or sorted(glob.glob(os.path.join(hf_dir, "pytorch_model*.bin"))))
  if not files:
    raise FileNotFoundError(f"{hf_dir}: no *.safetensors or pytorch_model*.bin weights")
  return files


def _iter_torch_bin(path: str) -> Iterator[tuple[str, np.ndarray]]:
  """(name, numpy array) from a torch pickle, loaded with weights_only=True and mmap."""
  import torch

  state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
  for name in list(state):
    t = state.pop(name)
    if t.dtype == torch.bfloat16:
      yield name, t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
    else:
      yield name, t.numpy().copy()
    del t


def iter_hf_tensors(hf_dir: str) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (name, array) for every tensor of every weight file, one tensor at a time."""
  for file in weight_files(hf_dir):
    if file.endswith(".safetensors"):
      yield from safetensors_io.iter_tensors(file)
    else:
      yield from _iter_torch_bin(file)


def _checkpoint_dtype(hf_dir: str) -> str:
  """'bfloat16' if config.json declares bf16 weights, else 'float32'."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    d = json.load(f)
  return "bfloat16" if (d.get("dtype") or d.get("torch_dtype")) == "bfloat16" else "float32"


def load_hf(hf_dir: str, param_dtype: str | None = None) -> tuple[ModelConfig, dict]:
  """Reads an HF Qwen3 directory into (config, numpy param pytree).

  Args:
    hf_dir: the HF model directory.
    param_dtype: 'float32' or 'bfloat16'; default: bfloat16 if config.json says the weights are
      bf16, else float32 (fp16 checkpoints become fp32).

  Returns:
    (config, params) with params numpy arrays of `config.param_dtype`.

  Raises:
    ValueError (hf_table.ConversionError, safetensors_io.SafetensorsError): the message names the
      tensor, file or config field.
  """
  config = ModelConfig.from_hf_dir(hf_dir, param_dtype=param_dtype or _checkpoint_dtype(hf_dir))
  abstract = params_lib.abstract_params(config)
  filler = hf_table.ParamFiller(abstract, np.dtype(config.param_dtype))
  for name, array in iter_hf_tensors(hf_dir):
    filler.put(name, array)
    del array
  return config, filler.finish()


def read_token_file(path: str) -> list[str]:
  """One token per line (trailing newline stripped); blank or duplicate lines are an error."""
  with open(path, encoding="utf-8") as f:
    tokens = [line.rstrip("\r\n") for line in f]
  for lineno, token in enumerate(tokens, 1):
    if not token.strip():
      raise ValueError(f"{path}:{lineno}: blank token")
    if tokens.index(token) != lineno - 1:
      raise ValueError(f"{path}:{lineno}: duplicate token {token!r}")
  return tokens


def add_tokens(config: ModelConfig, params: dict, tokens: list[str], seed: int
               ) -> tuple[ModelConfig, dict, dict[str, int]]:
  """Grows the embedding (and untied LM head) by one row per new token (see the module doc).

  Args:
    config: the model config (vocab V).
    params: numpy param pytree.
    tokens: the new tokens, in id order.
    seed: seed of the init noise.

  Returns:
    (config with vocab V + len(tokens), params, {token: new id}).
  """
  rng = np.random.default_rng(seed)
  v = config.vocab_size

  def grow(table: np.ndarray, axis: int) -> np.ndarray:  # vocab axis `axis` grows V -> V + n
    rows = np.moveaxis(table, axis, 0)  # [V, D] view
    mean = rows.mean(axis=0, dtype=np.float32)
    std = rows.std(axis=0, dtype=np.float32)
    noise = rng.standard_normal((len(tokens), rows.shape[1])).astype(np.float32)
    new = np.moveaxis((mean + _NOISE_SCALE * std * noise).astype(table.dtype), 0, axis)
    return np.concatenate([table, new], axis=axis)

  params = dict(params)
  params["embed"] = grow(params["embed"], 0)  # [V + n, D]
  if "lm_head" in params:
    params["lm_head"] = grow(params["lm_head"], 1)  # [D, V + n]
  config = dataclasses.replace(config, vocab_size=v + len(tokens))
  return config, params, {t: v + i for i, t in enumerate(tokens)}


def convert(hf_dir: str, out_dir: str, param_dtype: str | None = None,
            add_tokens_file: str | None = None, add_tokens_seed: int = 0) -> ModelConfig:
  """HF directory -> gr2jax checkpoint directory (atomic: nothing at out_dir on failure).

  Args:
    hf_dir: the HF Qwen3 directory.
    out_dir: the checkpoint directory to create (must not exist).
    param_dtype: see `load_hf`.
    add_tokens_file: optional file of new tokens, one per line.
    add_tokens_seed: seed of the new rows' init noise.

  Returns:
    The written config.
  """
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf_dir={hf_dir} is not a directory")
  written = {}

  def write(tmp: str) -> None:
    tokens = read_token_file(add_tokens_file) if add_tokens_file else []
    config, params = load_hf(hf_dir, param_dtype)
    if tokens:
      config, params, ids = add_tokens(config, params, tokens, add_tokens_seed)
      with open(os.path.join(tmp, ADDED_IDS_FILE), "w") as f:
        json.dump(ids, f, indent=2, ensure_ascii=False)
    checkpoint.write_checkpoint(tmp, config, params)
    for name in TOKENIZER_FILES:
      if os.path.isfile(os.path.join(hf_dir, name)):
        shutil.copy2(os.path.join(hf_dir, name), tmp)
    written["config"] = config

  checkpoint.atomic_directory(out_dir, write, overwrite=False)
  return written["config"]


FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "Local HF Qwen3 directory (config.json + weights).")
flags.DEFINE_string("out_dir", None, "Output directory to create; must not exist. Written "
                    "atomically: on any error nothing is left there. (Shared with export_hf.py.)")
flags.DEFINE_enum("param_dtype", None, ["float32", "bfloat16"],
                  "Param storage dtype (default: bfloat16 if the HF config says bf16, else fp32).")
flags.DEFINE_string("add_tokens", None, "File of new tokens, one per line: grows embed/lm_head "
                    "(init: mean row + 1e-3*std noise); ids written to added_token_ids.json.")
flags.DEFINE_integer("add_tokens_seed", 0, "Seed of the --add_tokens init noise.")


def main(argv):
  del argv
  if not FLAGS.hf_dir or not FLAGS.out_dir:
    raise app.UsageError("--hf_dir and --out_dir are required")
  config = convert(FLAGS.hf_dir, FLAGS.out_dir, FLAGS.param_dtype, FLAGS.add_tokens,
                   FLAGS.add_tokens_seed)
  print(f"wrote {FLAGS.out_dir}: {params_lib.param_count(config):,} params, "
        f"{config.param_dtype}, vocab {config.vocab_size}")


if __name__ == "__main__":
  app.run(main)
