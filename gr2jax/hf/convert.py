"""A local HF Qwen3 directory -> a gr2jax (orbax) checkpoint (weights_conversion/convert_hf.py
is its command line; the HF recipes' `convert` step, gr2jax/chain.py, calls `convert`).

Reads DIR/config.json (`ModelConfig.from_hf_dict`: unsupported fields are an error naming them)
and the weights: `model.safetensors.index.json` + shards, a single `model.safetensors`, or
`pytorch_model*.bin` (torch.load with weights_only=True), through the library's reader
(gr2jax/hf/weights.py). All names and shapes are checked against the table in gr2jax/hf/table.py
first (every HF tensor used exactly once, every param filled once with the right shape); then each
stacked param leaf is filled tensor by tensor from the memory-mapped shards, written to orbax and
dropped before the next, so peak memory is about 3x the largest leaf, well under the checkpoint
size for real models. Writes OUT/gr2jax_config.json, OUT/params/ (orbax, see gr2jax/exports.py)
and copies the tokenizer files it finds. Everything is written to a temp directory next to OUT and
renamed at the end (`exports.atomic_directory`: OUT locked while writing, temp directories of an
interrupted earlier run removed, SIGTERM / SIGINT clean up): on any error nothing is left at OUT.

--add_tokens=FILE (one token per line) sets embedding (and untied LM head) rows for new tokens.
Ids come from the tokenizer of --tokenizer_dir (default --hf_dir), its tokenizer.json:
  - a token that tokenizer already has as an added token keeps its id (e.g. the output of
    gr2jax.data.tokenizer.extend_tokenizer; Qwen3's ids 151669.. reuse its unused padding rows up
    to 151935 and grow the table beyond);
  - a token it lacks is appended to it (the next free id, as `tokenizers` assigns it; a plain,
    non-special added token) and the copied tokenizer.json holds it, so the checkpoint's tokenizer
    always agrees with OUT/added_token_ids.json;
  - a token the model already has -- in --hf_dir's own tokenizer, or in the tokenizer's base
    vocabulary -- is an error naming it: its trained embedding row would be overwritten;
    so is an id that --hf_dir's tokenizer gives to another token.
The tokenizer must fit the weights (gr2jax/hf/weights.check_tokenizer): an id >= config.json's
vocab_size of a token not in the --add_tokens file, or an eos / pad id it does not define, is an
error naming both files (those tokens would get placeholder rows, the eos would never be written).
Without a tokenizer.json (and no slow-tokenizer vocabulary either) the ids are V, V+1, ... A
--tokenizer_dir that does not exist is an error. Init: mean of the other original rows +
N(0, (1e-3 * per-dimension std)^2) noise from --add_tokens_seed, so new tokens start as an
"average" token and are distinguishable. The vocab grows to max(V, max id + 1) in the config;
OUT/added_token_ids.json maps each new token to its id.
"""

import dataclasses
import json
import os
import shutil

import numpy as np

from gr2jax import exports
from gr2jax.hf import weights as hf_weights
from gr2jax.model.config import ModelConfig

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt",
                   "special_tokens_map.json", "added_tokens.json", "tokenizer.model",
                   "chat_template.jinja", "generation_config.json")
TOKENIZER_JSON = hf_weights.TOKENIZER_JSON
_VOCAB_FILES = ("vocab.json", "tokenizer.model", "added_tokens.json")  # slow-tokenizer vocabularies
ADDED_IDS_FILE = "added_token_ids.json"
_NOISE_SCALE = 1e-3


def load_hf(hf_dir: str, param_dtype: str | None = None) -> tuple[ModelConfig, dict]:
  """Reads an HF Qwen3 directory into (config, numpy param pytree), all in memory.

  Args:
    hf_dir: the HF model directory.
    param_dtype: 'float32' or 'bfloat16'; default: bfloat16 if config.json says the weights are
      bf16, else float32 (fp16 checkpoints become fp32).

  Returns:
    (config, params) with params numpy arrays of `config.param_dtype`.

  Raises:
    ValueError (gr2jax.hf.table.ConversionError, gr2jax.hf.safetensors_io.SafetensorsError): the
      message names the tensor, file or config field.
  """
  config = hf_weights.read_config(hf_dir, param_dtype)
  with hf_weights.HFWeights(hf_dir) as weights:
    return config, exports.unflatten(hf_weights.iter_leaves(config, weights))


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


def new_token_ids(tokens: list[str], vocab_size: int, hf_dir: str, tokenizer_dir: str | None
                  ) -> tuple[dict[str, int], object | None]:
  """The id of each new token, and the tokenizer to write into the checkpoint (module doc).

  Args:
    tokens: the new tokens (from --add_tokens).
    vocab_size: V, embedding rows of the HF checkpoint.
    hf_dir: the HF directory (its tokenizer.json, if any, lists the tokens the model was trained
      with).
    tokenizer_dir: where ids come from (its tokenizer.json); None = hf_dir.

  Returns:
    ({token: id}, the tokenizers.Tokenizer holding every new token -- with the missing ones
    appended -- or None when there is no tokenizer.json: ids are then V, V+1, ...).

  Raises:
    ValueError naming the token: a token the model already has, an id another original token
      uses, or tokenizer files without a tokenizer.json (the ids could not be recorded).
  """
  source_dir = tokenizer_dir or hf_dir
  flag = "--tokenizer_dir" if tokenizer_dir else "--hf_dir"
  source = hf_weights.load_tokenizer_json(source_dir)
  if source is None:
    others = [n for n in _VOCAB_FILES if os.path.isfile(os.path.join(source_dir, n))]
    if tokenizer_dir or others:
      raise ValueError(f"{flag}={source_dir} has no {TOKENIZER_JSON} (found {others}): the "
                       "--add_tokens ids could not be recorded in the copied tokenizer")
    return {t: vocab_size + i for i, t in enumerate(tokens)}, None
  base = hf_weights.load_tokenizer_json(hf_dir) if tokenizer_dir else source
  trained: dict[str, int] = {}  # tokens the model already has, with their ids
  if base is not None:
    trained |= base.get_vocab(with_added_tokens=True)
  if tokenizer_dir:  # the extended tokenizer's base vocabulary is original too
    trained |= source.get_vocab(with_added_tokens=False)
  existing = [t for t in tokens if t in trained]
  if existing:
    raise ValueError(
      f"--add_tokens: {existing[0]!r} (id {trained[existing[0]]})"
      + (f" and {len(existing) - 1} more {existing[1:4]}" if len(existing) > 1 else "")
      + " already in the model's tokenizer: adding it would overwrite its trained embedding "
      "row and LM-head column; remove it from the --add_tokens file")
  missing = [t for t in tokens if source.token_to_id(t) is None]
  if missing:
    import tokenizers

    source.add_tokens([tokenizers.AddedToken(t, normalized=False, special=False)
                       for t in missing])
  ids = {t: source.token_to_id(t) for t in tokens}
  owner = {i: t for t, i in trained.items()}
  for token, i in ids.items():
    if i in owner:
      raise ValueError(f"{flag}={source_dir}: new token {token!r} has id {i}, which the model's "
                       f"tokenizer gives to {owner[i]!r}")
  return ids, source


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

  Raises:
    FileNotFoundError: hf_dir or tokenizer_dir is not a directory.
    ValueError: see `new_token_ids`, `gr2jax.hf.weights` (a non-float or wrongly shaped tensor,
      a tokenizer that does not fit the config), naming the tensor or token and the file.
  """
  if not os.path.isdir(hf_dir):
    raise FileNotFoundError(f"--hf_dir={hf_dir} is not a directory")
  if tokenizer_dir is not None and not os.path.isdir(tokenizer_dir):
    raise FileNotFoundError(f"--tokenizer_dir={tokenizer_dir} is not a directory")
  written = {}

  def write(tmp: str) -> None:
    tokens = read_token_file(add_tokens_file) if add_tokens_file else []
    config = hf_weights.read_config(hf_dir, param_dtype)
    hf_weights.check_tokenizer(tokenizer_dir or hf_dir, config, added=tokens,
                               config_file=os.path.join(hf_dir, "config.json"))
    tokenizer = None
    with hf_weights.HFWeights(hf_dir) as weights:
      leaves = hf_weights.iter_leaves(config, weights)
      if tokens:
        ids, tokenizer = new_token_ids(tokens, config.vocab_size, hf_dir, tokenizer_dir)
        leaves = _with_added_tokens(leaves, ids, add_tokens_seed)
        config = dataclasses.replace(config, vocab_size=max(config.vocab_size,
                                                            max(ids.values()) + 1))
        with open(os.path.join(tmp, ADDED_IDS_FILE), "w") as f:
          json.dump(ids, f, indent=2, ensure_ascii=False)
      exports.write_checkpoint(tmp, config, leaves)
    source = tokenizer_dir or hf_dir
    for name in TOKENIZER_FILES:
      if name == TOKENIZER_JSON and tokenizer is not None:
        tokenizer.save(os.path.join(tmp, name))  # with the appended tokens
      elif os.path.isfile(os.path.join(source, name)):
        shutil.copy2(os.path.join(source, name), tmp)
    written["config"] = config

  exports.atomic_directory(out_dir, write, overwrite=False)
  return written["config"]
