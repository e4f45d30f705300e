"""AR -> diffusion checkpoint conversion: tensors byte-identical, only the config changes."""

import dataclasses
import filecmp
import json
import os

import jax
import numpy as np
import pytest
from tokenizers import Tokenizer, models

from gr2jax import exports
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from tests.weights_conversion.conftest import leftovers, run_main
from weights_conversion import ar_to_diffusion, convert_hf

CONFIG = ModelConfig.tiny(vocab_size=64, eos_token_ids=(2,))


def _ar_checkpoint(directory, vocab, added=None):
  """A tiny AR checkpoint with a word-level tokenizer.json over `vocab` (+ added_token_ids.json)."""
  exports.save(directory, CONFIG, init_params(CONFIG, jax.random.key(0)))
  Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0])).save(
    os.path.join(directory, "tokenizer.json")
  )
  if added is not None:
    with open(os.path.join(directory, convert_hf.ADDED_IDS_FILE), "w") as f:
      json.dump(added, f)
  return directory


@pytest.fixture(scope="module")
def ar_ckpt(tmp_path_factory):
  vocab = ["<unk>", "a", "b", "<|mask|>"]
  return _ar_checkpoint(str(tmp_path_factory.mktemp("ar") / "ckpt"), vocab)


def _same_tree(a, b):
  cmp = filecmp.dircmp(a, b)
  assert not cmp.left_only and not cmp.right_only and not cmp.funny_files, cmp.report()
  _, mismatch, errors = filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)
  assert not mismatch and not errors, (mismatch, errors)
  for sub in cmp.common_dirs:
    _same_tree(os.path.join(a, sub), os.path.join(b, sub))


def test_tensors_byte_identical_and_only_config_changes(ar_ckpt, tmp_path):
  out = str(tmp_path / "diff")
  run_main(ar_to_diffusion, ar=ar_ckpt, out=out, block_size=32)
  _same_tree(os.path.join(ar_ckpt, "params"), os.path.join(out, "params"))
  assert filecmp.cmp(
    os.path.join(ar_ckpt, "tokenizer.json"), os.path.join(out, "tokenizer.json"), shallow=False
  )
  config, params = exports.restore(out)
  assert config == dataclasses.replace(CONFIG, block_size=32, mask_token_id=3)
  _, ar_params = exports.restore(ar_ckpt)
  for x, y in zip(jax.tree.leaves(ar_params), jax.tree.leaves(params), strict=True):
    assert x.dtype == y.dtype and np.asarray(x).tobytes() == np.asarray(y).tobytes()
  assert leftovers(out) == ["diff"]


def test_added_token_ids_take_precedence(tmp_path):
  ckpt = _ar_checkpoint(str(tmp_path / "ar"), ["<unk>", "a"], added={"<|mask|>": 60})
  config = ar_to_diffusion.convert(ckpt, str(tmp_path / "out"), block_size=4)
  assert (config.block_size, config.mask_token_id) == (4, 60)


def test_missing_mask_token_points_at_add_tokens(tmp_path):
  ckpt = _ar_checkpoint(str(tmp_path / "ar"), ["<unk>", "a"])
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=r"<\|mask\|>.*--add_tokens"):
    ar_to_diffusion.convert(ckpt, out, block_size=32)
  assert leftovers(out) == []


def test_bad_input(ar_ckpt, tmp_path):
  with pytest.raises(ValueError, match="outside the model's vocab_size 64"):
    ar_to_diffusion.convert(
      _ar_checkpoint(str(tmp_path / "big"), ["<unk>"], {"<|mask|>": 64}), str(tmp_path / "o"), 4
    )
  with pytest.raises(ValueError, match="block_size=0"):
    ar_to_diffusion.convert(ar_ckpt, str(tmp_path / "o"), block_size=0)
  with pytest.raises(exports.CheckpointError, match="not a gr2jax checkpoint"):
    ar_to_diffusion.convert(str(tmp_path), str(tmp_path / "o"), block_size=4)
  os.makedirs(tmp_path / "exists")
  with pytest.raises(FileExistsError):
    ar_to_diffusion.convert(ar_ckpt, str(tmp_path / "exists"), block_size=4)


@pytest.mark.parametrize("role,added", [("eos", {"<|mask|>": 2}), ("pad", {"<|mask|>": 0})])
def test_mask_token_that_stops_or_pads_is_refused(tmp_path, role, added):
  """the decoder never proposes the mask token: a mask = eos row never ends."""
  ckpt = _ar_checkpoint(str(tmp_path / "ar"), ["<unk>", "a"], added=added)
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=rf"'<\|mask\|>'.*\b{added['<|mask|>']}\b.*{role}"):
    ar_to_diffusion.convert(ckpt, out, block_size=4)
  assert leftovers(out) == []


def test_a_stage_export_takes_its_mask_token_from_its_data_build(tmp_path):
  """A training stage's export carries no tokenizer files: the mask token is its data build's
  (the tokenizer cached in its workdir whose vocabulary the export records, as the training
  stages convert), and the converted export's metadata says it is a diffusion model."""
  from gr2jax.data import prompts
  from gr2jax.data import tokenizer as tokenizer_lib
  from tests.train.toy import PROMPT, toy_tokenizer

  workdir = tmp_path / "W"
  tok_dir = str(workdir / "tokenizer-0123")
  toy_tokenizer(tok_dir)
  tok = tokenizer_lib.load_tokenizer(tok_dir)
  config = ModelConfig.tiny(vocab_size=-(-len(tok) // 128) * 128, eos_token_ids=(2,))
  metadata = {"stage": "ar_rl", "kind": "ar", "data_build": exports.data_build_record(tok, PROMPT)}
  ar = str(workdir / "ar_rl" / "export")
  exports.save(ar, config, init_params(config, jax.random.key(0)), metadata=metadata)
  out = str(workdir / "naive")
  run_main(ar_to_diffusion, ar=ar, out=out, block_size=32)
  converted = exports.load_config(out)
  assert converted.mask_token_id == tok.convert_tokens_to_ids(prompts.MASK_TOKEN)
  assert converted.block_size == 32
  assert exports.load_metadata(out) == exports.load_metadata(ar) | {"kind": "diffusion"}
  other = dict(metadata, data_build=dict(metadata["data_build"], vocab_sha256="0" * 64))
  exports.save(ar, config, init_params(config, jax.random.key(0)), metadata=other)
  with pytest.raises(ValueError, match=r"<\|mask\|>.*neither .* nor the tokenizer it was "
                                       r"trained with.*--tokenizer_dir="):
    ar_to_diffusion.convert(ar, str(workdir / "other"), block_size=32)
