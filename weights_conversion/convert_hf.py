r"""Converts a local HF Qwen3 directory into a gr2jax (orbax) checkpoint.

  python weights_conversion/convert_hf.py --hf_dir=DIR --out_dir=OUT \
      [--param_dtype=float32|bfloat16] [--add_tokens=FILE] [--add_tokens_seed=0]

Reads DIR/config.json (`ModelConfig.from_hf_dict`: unsupported fields are an error naming them)
and the weights: `model.safetensors.index.json` + shards, a single `model.safetensors`, or
`pytorch_model*.bin` (torch.load with weights_only=True). All names and shapes are checked
against the table in hf_table.py first (every HF tensor used exactly once, every param filled
once with the right shape); then each stacked param leaf is filled tensor by tensor from the
memory-mapped shards, written to orbax and dropped before the next, so peak memory is about 3x
the largest leaf, well under the checkpoint size for real models. Writes OUT/gr2jax_config.json,
OUT/params/ (orbax, see gr2jax/checkpoint.py) and copies the tokenizer files it finds. Everything
is written to a temp directory next to OUT and renamed at the end: on any error nothing is left
at OUT.

--add_tokens=FILE (one token per line) sets embedding (and untied LM head) rows for new tokens.
Their ids come from --tokenizer_dir's tokenizer.json (default --hf_dir) when it has one (e.g. the
output of gr2jax.data.tokenizer.extend_tokenizer; Qwen3's tokenizer ids 151669.. reuse its unused
padding rows up to 151935 and grow the table beyond), else they are V, V+1, ... Init: mean of the
other original rows + N(0, (1e-3 * per-dimension std)^2) noise from --add_tokens_seed, so new
tokens start as an "average" token and are distinguishable. The vocab grows to max(V, max id + 1)
in the config; OUT/added_token_ids.json maps each new token to its id; the tokenizer files of
--tokenizer_dir are copied.
"""

import contextlib
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


def _torch_to_numpy(t) -> np.ndarray:
  """A CPU torch tensor -> an owned numpy array (bf16 via ml_dtypes)."""
  import torch

  if t.dtype == torch.bfloat16:
    return t.contiguous().view(torch.int16).numpy().view(ml_dtypes.bfloat16).copy()
  return t.numpy().copy()


class HFWeights:
  """All tensors of an HF directory behind one random-access index (a context manager).

  Safetensors files are memory-mapped (`safetensors_io.Reader`); `pytorch_model*.bin` files are
  torch.load-ed with weights_only=True and mmap=True. Only headers are read on entry.

  Attributes:
    shapes: {tensor name: shape} over all files.
  """

  def __init__(self, hf_dir: str):
    self.files = weight_files(hf_dir)

  def __enter__(self) -> "HFWeights":
    self.shapes, self._where = {}, {}
    self._stack = contextlib.ExitStack()
    with self._stack as stack:
      for file in self.files:
        if file.endswith(".safetensors"):
          reader = stack.enter_context(safetensors_io.Reader(file))
          names = {n: e["shape"] for n, e in reader.entries.items()}
          read = reader.read
        else:
          import torch

          state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
          names = {n: tuple(t.shape) for n, t in state.items()}
          read = lambda n, state=state: _torch_to_numpy(state[n])
        for name, shape in names.items():
          if name in self.shapes:
            raise hf_table.ConversionError(
              f"tensor {name!r} appears more than once in the checkpoint ({self._where[name][0]} "
              f"and {file})")
          self.shapes[name] = shape
          self._where[name] = (file, read)
      self._stack = stack.pop_all()  # keep the files open until __exit__
    return self

  def __exit__(self, *exc) -> None:
    self._stack.close()
    self._where = {}

  def read(self, name: str) -> np.ndarray:
    """The tensor `name` as numpy, in its stored dtype."""
    return self._where[name][1](name)


def _checkpoint_dtype(hf_dir: str) -> str:
  """'bfloat16' if config.json declares bf16 weights, else 'float32'."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    d = json.load(f)
  return "bfloat16" if (d.get("dtype") or d.get("torch_dtype")) == "bfloat16" else "float32"


def read_config(hf_dir: str, param_dtype: str | None = None) -> ModelConfig:
  """The ModelConfig of an HF directory; param_dtype default: the checkpoint's (see load_hf)."""
  return ModelConfig.from_hf_dir(hf_dir, param_dtype=param_dtype or _checkpoint_dtype(hf_dir))


def iter_leaves(config: ModelConfig, weights: HFWeights
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """The param leaves of `config` built from `weights`, one at a time (hf_table.load_leaves)."""
  return hf_table.load_leaves(weights.shapes, weights.read, params_lib.abstract_params(config),
                              np.dtype(config.param_dtype))


def load_hf(hf_dir: str, param_dtype: str | None = None) -> tuple[ModelConfig, dict]:
  """Reads an HF Qwen3 directory into (config, numpy param pytree), all in memory.

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
  config = read_config(hf_dir, param_dtype)
  with HFWeights(hf_dir) as weights:
    return config, checkpoint.unflatten(iter_leaves(config, weights))


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


def new_token_ids(tokens: list[str], vocab_size: int, tokenizer_dir: str | None) -> dict[str, int]:
  """The id of each new token: the tokenizer's, if `tokenizer_dir` has a tokenizer.json, else
  vocab_size + i (in file order).

  Args:
    tokens: the new tokens.
    vocab_size: V, embedding rows of the HF checkpoint.
    tokenizer_dir: a directory whose tokenizer.json already contains the tokens (e.g. the output
      of gr2jax.data.tokenizer.extend_tokenizer), or None.

  Returns:
    {token: id}.

  Raises:
    ValueError: the tokenizer lacks a token, or maps one to an id an original token uses.
  """
  file = os.path.join(tokenizer_dir, "tokenizer.json") if tokenizer_dir else None
  if file is None or not os.path.isfile(file):
    return {t: vocab_size + i for i, t in enumerate(tokens)}
  import tokenizers

  tokenizer = tokenizers.Tokenizer.from_file(file)
  ids = {t: tokenizer.token_to_id(t) for t in tokens}
  for token, i in ids.items():
    if i is None:
      raise ValueError(f"{file}: new token {token!r} is not in the tokenizer (add it first, e.g. "
                       "with gr2jax.data.tokenizer.extend_tokenizer)")
  return ids


def grow_vocab(table: np.ndarray, axis: int, ids: dict[str, int], rng: np.random.Generator
               ) -> np.ndarray:
  """Sets the rows of the new token ids, growing the vocab axis to max(V, max id + 1).

  New rows (and any unused gap rows past V) = mean of the other original rows; the new tokens'
  rows add 1e-3 * per-dimension-std Gaussian noise so they are distinguishable.

  Args:
    table: the embedding [V, D] (axis 0) or the LM head [D, V] (axis 1).
    axis: the vocab axis.
    ids: {token: id}; ids < V overwrite those rows (e.g. Qwen3's unused padding rows).
    rng: the noise generator (seeded by --add_tokens_seed).

  Returns:
    A new C-contiguous table with max(V, max id + 1) entries on `axis`, same dtype.
  """
  v = table.shape[axis]
  new_ids = np.array(sorted(ids.values()), np.int64)
  rows = np.moveaxis(table, axis, 0)  # [V, D] view
  keep = np.ones(v, bool)
  keep[new_ids[new_ids < v]] = False
  total, total_sq = np.zeros(rows.shape[1], np.float64), np.zeros(rows.shape[1], np.float64)
  for start in range(0, v, 4096):  # chunked: no float copy of the whole table
    block = rows[start : start + 4096][keep[start : start + 4096]].astype(np.float64)
    total += block.sum(0)
    total_sq += (block * block).sum(0)
  count = int(keep.sum())
  mean = total / count
  std = np.sqrt(np.maximum(total_sq / count - mean * mean, 0.0))
  shape = list(table.shape)
  shape[axis] = max(v, int(new_ids.max()) + 1)
  out = np.empty(shape, table.dtype)
  out_rows = np.moveaxis(out, axis, 0)  # [V', D] view
  out_rows[:v] = rows
  out_rows[v:] = mean.astype(table.dtype)
  noise = rng.standard_normal((len(new_ids), rows.shape[1]))
  out_rows[new_ids] = (mean + _NOISE_SCALE * std * noise).astype(table.dtype)
  return out


def _with_added_tokens(leaves, ids: dict[str, int], seed: int):
  """Applies `grow_vocab` to the 'embed' and 'lm_head' leaves of a leaf stream."""
  rng = np.random.default_rng(seed)
  for path, leaf in leaves:
    if path == ("embed",):
      leaf = grow_vocab(leaf, 0, ids, rng)
    elif path == ("lm_head",):
      leaf = grow_vocab(leaf, 1, ids, rng)
    yield path, leaf
    del leaf


def convert(hf_dir: str, out_dir: str, param_dtype: str | None = None,
            add_tokens_file: str | None = None, add_tokens_seed: int = 0,
            tokenizer_dir: str | None = None) -> ModelConfig:
  """HF directory -> gr2jax checkpoint directory (atomic: nothing at out_dir on failure).

  Args:
    hf_dir: the HF Qwen3 directory.
    out_dir: the checkpoint directory to create (must not exist).
    param_dtype: see `load_hf`.
    add_tokens_file: optional file of new tokens, one per line.
    add_tokens_seed: seed of the new rows' init noise.
    tokenizer_dir: where the new tokens' ids (tokenizer.json) and the tokenizer files to copy
      come from; default hf_dir.

  Returns:
    The written config.
  """
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf_dir={hf_dir} is not a directory")
  written = {}

  def write(tmp: str) -> None:
    tokens = read_token_file(add_tokens_file) if add_tokens_file else []
    config = read_config(hf_dir, param_dtype)
    with HFWeights(hf_dir) as weights:
      leaves = iter_leaves(config, weights)
      if tokens:
        ids = new_token_ids(tokens, config.vocab_size, tokenizer_dir)
        leaves = _with_added_tokens(leaves, ids, add_tokens_seed)
        config = dataclasses.replace(config, vocab_size=max(config.vocab_size,
                                                            max(ids.values()) + 1))
        with open(os.path.join(tmp, ADDED_IDS_FILE), "w") as f:
          json.dump(ids, f, indent=2, ensure_ascii=False)
      checkpoint.write_checkpoint(tmp, config, leaves)
    for name in TOKENIZER_FILES:
      source = tokenizer_dir or hf_dir
      if os.path.isfile(os.path.join(source, name)):
        shutil.copy2(os.path.join(source, name), tmp)
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
flags.DEFINE_string("tokenizer_dir", None, "Tokenizer to copy into the checkpoint and to take the "
                    "--add_tokens ids from (its tokenizer.json); default --hf_dir.")


def main(argv):
  del argv
  if not FLAGS.hf_dir or not FLAGS.out_dir:
    raise app.UsageError("--hf_dir and --out_dir are required")
  config = convert(FLAGS.hf_dir, FLAGS.out_dir, FLAGS.param_dtype, FLAGS.add_tokens,
                   FLAGS.add_tokens_seed, FLAGS.tokenizer_dir)
  print(f"wrote {FLAGS.out_dir}: {params_lib.param_count(config):,} params, "
        f"{config.param_dtype}, vocab {config.vocab_size}")


if __name__ == "__main__":
  app.run(main)
