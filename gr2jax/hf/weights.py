"""Reading a local HF Qwen3 directory: its weight files, one index over all shards, its config,
and the param leaves built from it one at a time (through gr2jax/hf/table.py).

Nothing is cast in silence: a tensor stored in a non-float dtype, with a shape other than the
config's, or holding a NaN / inf, is refused naming the tensor and its file (`iter_leaves`),
and a tokenizer.json that does not fit the weights -- an id past config.json's vocab_size (but
for tokens a conversion adds on purpose), or an eos / pad id it does not define -- is refused
naming both files (`check_tokenizer`).

Formats: `model.safetensors.index.json` + shards, a single `model.safetensors`, `*.safetensors`,
or `pytorch_model*.bin` (torch.load with weights_only=True and mmap=True; torch is imported only
then). Used by `gr2jax.load.load_model` (in-memory conversion) and by
weights_conversion/convert_hf.py (streaming conversion to an orbax checkpoint).
"""

import contextlib
import glob
import json
import os
from collections.abc import Iterator

import ml_dtypes
import numpy as np

from gr2jax.hf import safetensors_io, table
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig

FLOAT_DTYPES = tuple(np.dtype(d) for d in (np.float16, ml_dtypes.bfloat16, np.float32, np.float64))


def weight_files(hf_dir: str) -> list[str]:
  """The weight files of an HF directory, in load order.

  Args:
    hf_dir: the HF model directory.

  Returns:
    Paths of safetensors shards (from the index, else `model.safetensors`, else `*.safetensors`)
    or of `pytorch_model*.bin` files.

  Raises:
    FileNotFoundError: no weights, or the index names a missing shard.
    ValueError: an index file that is not `{"weight_map": {name: file}}` JSON.
  """
  for index_name in ("model.safetensors.index.json", "pytorch_model.bin.index.json"):
    index = os.path.join(hf_dir, index_name)
    if os.path.isfile(index):
      try:
        with open(index) as f:
          weight_map = json.load(f)["weight_map"]
        shards = list(dict.fromkeys(weight_map.values()))
      except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{index}: not a weight index ({type(e).__name__}: {e})") from None
      files = [os.path.join(hf_dir, s) for s in shards]
      for file in files:
        if not os.path.isfile(file):
          raise FileNotFoundError(f"{index}: shard {os.path.basename(file)} does not exist")
      return files
  files = (sorted(glob.glob(os.path.join(hf_dir, "*.safetensors")))
           or sorted(glob.glob(os.path.join(hf_dir, "pytorch_model*.bin"))))
  if not files:
    raise FileNotFoundError(f"{hf_dir}: no *.safetensors or pytorch_model*.bin weights")
  return files


def _numpy_dtype(torch_dtype) -> np.dtype:
  """The numpy dtype of a torch dtype (bf16 via ml_dtypes)."""
  import torch

  if torch_dtype == torch.bfloat16:
    return np.dtype(ml_dtypes.bfloat16)
  return np.dtype(torch.empty(0, dtype=torch_dtype).numpy().dtype)


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
    dtypes: {tensor name: stored numpy dtype}.
  """

  def __init__(self, hf_dir: str):
    self.files = weight_files(hf_dir)

  def __enter__(self) -> "HFWeights":
    self.shapes, self.dtypes, self._where = {}, {}, {}
    self._stack = contextlib.ExitStack()
    with self._stack as stack:
      for file in self.files:
        if file.endswith(".safetensors"):
          reader = stack.enter_context(safetensors_io.Reader(file))
          names = {n: (e["shape"], e["dtype"]) for n, e in reader.entries.items()}
          read = reader.read
        else:
          import torch

          state = torch.load(file, map_location="cpu", weights_only=True, mmap=True)
          names = {n: (tuple(t.shape), _numpy_dtype(t.dtype)) for n, t in state.items()}
          read = lambda n, state=state: _torch_to_numpy(state[n])
        for name, (shape, dtype) in names.items():
          if name in self.shapes:
            raise table.ConversionError(
              f"tensor {name!r} appears more than once in the checkpoint ({self._where[name][0]} "
              f"and {file})", name)
          self.shapes[name], self.dtypes[name] = shape, dtype
          self._where[name] = (file, read)
      self._stack = stack.pop_all()  # keep the files open until __exit__
    return self

  def __exit__(self, *exc) -> None:
    self._stack.close()
    self._where = {}

  def read(self, name: str) -> np.ndarray:
    """The tensor `name` as numpy, in its stored dtype."""
    return self._where[name][1](name)

  def file_of(self, name: str) -> str:
    """The weight file holding tensor `name`."""
    return self._where[name][0]


def _checkpoint_dtype(hf_dir: str) -> str:
  """'bfloat16' if config.json declares bf16 weights, else 'float32'."""
  file = os.path.join(hf_dir, "config.json")
  try:
    with open(file) as f:
      d = json.load(f)
  except json.JSONDecodeError as e:
    raise ValueError(f"{file}:{e.lineno}: invalid JSON ({e.msg})") from None
  if not isinstance(d, dict):
    raise ValueError(f"{file}: not a JSON object")
  return "bfloat16" if (d.get("dtype") or d.get("torch_dtype")) == "bfloat16" else "float32"


def read_config(hf_dir: str, param_dtype: str | None = None) -> ModelConfig:
  """The ModelConfig of an HF directory; param_dtype default: the checkpoint's dtype.

  Args:
    hf_dir: the HF model directory.
    param_dtype: 'float32' or 'bfloat16'; default: bfloat16 if config.json says the weights are
      bf16, else float32 (fp16 checkpoints become fp32).
  """
  return ModelConfig.from_hf_dir(hf_dir, param_dtype=param_dtype or _checkpoint_dtype(hf_dir))


def iter_leaves(config: ModelConfig, weights: HFWeights
                ) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """The param leaves of `config` built from `weights`, one at a time (table.load_leaves).

  Every tensor is checked first (before a leaf is built): a non-float dtype (an integer or bool
  tensor would be cast to values of another scale) or a name / shape the config does not give
  is a ConversionError naming the tensor and its file; so is a NaN or inf value, found as each
  tensor is read (`read_finite`).
  """
  for name, dtype in weights.dtypes.items():
    if dtype not in FLOAT_DTYPES:
      raise table.ConversionError(
        f"{weights.file_of(name)}: tensor {name!r} is stored as {dtype}, not a float type; "
        f"refusing to cast it to {config.param_dtype} (a wrong or damaged weight file?)", name)
  abstract = params_lib.abstract_params(config)
  try:
    table.check_tensors(weights.shapes, abstract)
  except table.ConversionError as e:
    if e.tensor is None or e.tensor not in weights.shapes:
      raise
    raise table.ConversionError(f"{weights.file_of(e.tensor)}: {e}", e.tensor) from None
  return table.load_leaves(weights.shapes, lambda name: read_finite(weights, name), abstract,
                           np.dtype(config.param_dtype))


def read_finite(weights: HFWeights, name: str) -> np.ndarray:
  """The tensor `name` (weights.read), refused when it holds a NaN or inf.

  Raises:
    table.ConversionError: naming the tensor, its file, how many values and the first index.
  """
  tensor = weights.read(name)
  bad = ~np.isfinite(tensor)
  if bad.any():
    first = tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))
    raise table.ConversionError(
      f"{weights.file_of(name)}: tensor {name!r} holds {int(bad.sum())} NaN / inf values (first "
      f"at index {list(first)}); refusing to convert a damaged weight", name)
  return tensor


TOKENIZER_JSON = "tokenizer.json"


def load_tokenizer_json(directory: str | None):
  """The `tokenizers.Tokenizer` of directory/tokenizer.json, or None if there is none."""
  file = os.path.join(directory, TOKENIZER_JSON) if directory else None
  if file is None or not os.path.isfile(file):
    return None
  import tokenizers

  try:
    return tokenizers.Tokenizer.from_file(file)
  except Exception as e:  # tokenizers raises a bare Exception on a malformed file
    raise ValueError(f"{file}: cannot read the tokenizer: {e}") from None


def check_tokenizer(tokenizer_dir: str, config: ModelConfig, added=(), config_file: str = ""
                    ) -> None:
  """Refuses a tokenizer.json that does not fit the model's config (no tokenizer.json: nothing
  to check).

  Args:
    tokenizer_dir: the directory of the tokenizer.json.
    config: the model's config (before any rows are added).
    added: tokens a conversion adds rows for on purpose (convert.py --add_tokens): their ids may
      be >= config.vocab_size.
    config_file: the config's file, for the message (default tokenizer_dir/config.json).

  Raises:
    table.ConversionError: an id >= vocab_size of a token not in `added` (its embedding row
      does not exist: it would get a placeholder row), or an eos / pad id that is no token of
      the tokenizer.
  """
  tokenizer = load_tokenizer_json(tokenizer_dir)
  if tokenizer is None:
    return
  file = os.path.join(tokenizer_dir, TOKENIZER_JSON)
  config_file = config_file or os.path.join(tokenizer_dir, "config.json")
  vocab = tokenizer.get_vocab(with_added_tokens=True)
  added = set(added)
  outside = sorted((i, t) for t, i in vocab.items() if i >= config.vocab_size and t not in added)
  if outside:
    (i, t), n = outside[0], len(outside)
    raise table.ConversionError(
      f"{file}: {n} token id(s) >= vocab_size {config.vocab_size} of {config_file}, from "
      f"{t!r} = {i}: the weights have no rows for them; this tokenizer does not belong to "
      "these weights (or vocab_size is wrong)")
  ids = set(vocab.values())
  roles = [("eos_token_id", i) for i in config.eos_token_ids] + [("pad_token_id",
                                                                 config.pad_token_id)]
  for role, i in roles:
    if i not in ids:
      raise table.ConversionError(f"{config_file}: {role} {i} is no token of {file}")
