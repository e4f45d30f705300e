r"""Turns an AR gr2jax checkpoint into a block-diffusion one: a config change, no training.

  python weights_conversion/ar_to_diffusion.py --ar=CKPT --out=CKPT --block_size=32 \
      [--mask_token='<|mask|>'] [--tokenizer_dir=DIR]

Every file of the AR checkpoint (the orbax params/ tree, tokenizer files, added_token_ids.json)
is copied byte for byte; only gr2jax_config.json changes: `block_size` (the attention pattern is
block-causal for block_size > 1, masks.make_attention_mask) and `mask_token_id`, and the
metadata (gr2jax_metadata.json, its data build and recipe kept) says "kind": "diffusion". The
mask token is looked up in the checkpoint's added_token_ids.json (written by convert_hf.py
--add_tokens), then in the tokenizer it was trained with: --tokenizer_dir, its own
tokenizer.json (a stage export carries its data build's), or, for an export without tokenizer
files, W's data build tokenizer, as the training stages convert (gr2jax/load.find_tokenizer,
the vocabulary checked against the export's record); it must be an id < vocab_size and must
not be one of the model's eos (stop) ids or its pad id (a mask token that is also a stop token
could never end a row). Written atomically (a temp directory renamed into place): on any error
nothing is left at OUT.
"""

import json
import os
import shutil
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import cli, exports, load  # noqa: E402
from gr2jax.diffusion import convert as diffusion_convert  # noqa: E402
from gr2jax.model.config import ModelConfig  # noqa: E402
from weights_conversion import convert_hf  # noqa: E402

MASK_TOKEN = "<|mask|>"


def find_token_id(ckpt: str, token: str, vocab_size: int, tokenizer_dir: str | None = None) -> int:
  """The id of `token` in a checkpoint's added_token_ids.json, else in the tokenizer it was
  trained with (load.find_tokenizer: `tokenizer_dir`, the checkpoint's own tokenizer.json, or a
  stage export's data build, where the training stages take their mask token).

  Args:
    ckpt: the checkpoint directory.
    token: the token string.
    vocab_size: ids must be below it.
    tokenizer_dir: a tokenizer directory to read instead (its vocabulary must be the one the
      checkpoint records).

  Returns:
    The token id.

  Raises:
    ValueError: the token is in none of them, or its id does not fit the vocabulary; a
      tokenizer_dir of another vocabulary.
    FileNotFoundError: tokenizer_dir has no tokenizer.json.
  """
  found, source = None, None
  added = os.path.join(ckpt, convert_hf.ADDED_IDS_FILE)
  if os.path.isfile(added):
    with open(added) as f:
      found, source = json.load(f).get(token), added
  if found is None:
    try:
      source = os.path.join(load.find_tokenizer(ckpt, tokenizer_dir), "tokenizer.json")
    except FileNotFoundError:
      if tokenizer_dir is not None:
        raise
    else:
      from tokenizers import Tokenizer  # lazy: only this lookup needs it

      found = Tokenizer.from_file(source).token_to_id(token)
  if found is None:
    raise ValueError(
      f"{ckpt}: token {token!r} is in neither {convert_hf.ADDED_IDS_FILE} nor the tokenizer it "
      "was trained with (its tokenizer.json, or its workdir's data build); pass "
      "--tokenizer_dir=<a tokenizer directory with it, W/tokenizer-<key>/>, or add it when "
      f"converting: weights_conversion/convert_hf.py --add_tokens=FILE (a file with the line "
      f"{token})"
    )
  if not 0 <= found < vocab_size:
    raise ValueError(
      f"{source}: {token!r} has id {found}, outside the model's vocab_size {vocab_size}"
    )
  return int(found)


def convert(ar: str, out: str, block_size: int, mask_token: str = MASK_TOKEN,
            tokenizer_dir: str | None = None) -> ModelConfig:
  """AR checkpoint -> diffusion checkpoint (tensors copied byte for byte; config changed).

  Args:
    ar: the AR gr2jax checkpoint directory.
    out: the directory to create (must not exist).
    block_size: the diffusion block size B (>= 1).
    mask_token: the mask token string.
    tokenizer_dir: where to look the mask token up (default: find_token_id's order).

  Returns:
    The written config.
  """
  if block_size < 1:
    raise ValueError(f"--block_size={block_size} must be >= 1")
  config = exports.load_config(ar)
  if not os.path.isdir(os.path.join(ar, exports.PARAMS_DIR)):
    raise exports.CheckpointError(f"{ar}: no {exports.PARAMS_DIR}/ (incomplete checkpoint)")
  mask_id = find_token_id(ar, mask_token, config.vocab_size, tokenizer_dir)
  metadata = exports.load_metadata(ar) | {"kind": "diffusion"}
  try:
    config = diffusion_convert.to_diffusion(config, block_size, mask_id)
  except ValueError as e:
    raise ValueError(f"{ar}: mask token {mask_token!r}: {e}; pass --mask_token=<a token of its "
                     "own> (add it with convert_hf.py --add_tokens)") from None

  def write(tmp: str) -> None:
    for name in sorted(os.listdir(ar)):
      src, dst = os.path.join(ar, name), os.path.join(tmp, name)
      if name in (exports.CONFIG_FILE, exports.METADATA_FILE):
        continue
      if os.path.isdir(src):
        shutil.copytree(src, dst)
      else:
        shutil.copy2(src, dst)
    with open(os.path.join(tmp, exports.CONFIG_FILE), "w") as f:
      json.dump(exports.config_to_dict(config), f, indent=2)
    with open(os.path.join(tmp, exports.METADATA_FILE), "w") as f:
      json.dump(metadata, f, indent=1)

  exports.atomic_directory(out, write, overwrite=False)
  return config


FLAGS = flags.FLAGS
flags.DEFINE_string("ar", None, "The AR gr2jax checkpoint directory.")
flags.DEFINE_string("out", None, "The diffusion checkpoint directory to create (must not exist).")
flags.DEFINE_integer("block_size", 32, "Block size B of block diffusion.")
flags.DEFINE_string("mask_token", MASK_TOKEN, "The mask token (must be in the vocabulary).")


def main(argv):
  del argv
  if not FLAGS.ar or not FLAGS.out:
    raise app.UsageError("--ar and --out are required")
  config = convert(FLAGS.ar, FLAGS.out, FLAGS.block_size, FLAGS.mask_token,
                   FLAGS.tokenizer_dir)
  print(f"wrote {FLAGS.out}: block_size {config.block_size}, mask_token_id {config.mask_token_id}")


if __name__ == "__main__":
  cli.run(main)
