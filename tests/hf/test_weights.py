"""gr2jax/hf/weights.py: HF weights are checked, not cast. A non-float or wrongly shaped tensor is
refused naming the tensor and its file; a tokenizer.json with ids past config.json's vocab_size
(but for the tokens a conversion adds on purpose) or without the eos / pad ids is refused, by
`load_model` and by the conversion alike. Tiny random models saved offline."""

import json
import os

import ml_dtypes
import numpy as np
import pytest

from gr2jax import exports, load
from gr2jax.hf import convert
from gr2jax.hf import weights as hf_weights
from tests.hf import safetensors_files
from tests.weights_conversion.conftest import leftovers, save_hf, word_tokenizer


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny fp32 model (V = 96, eos / pad 3) with a fitting 90-token tokenizer."""
  d = str(tmp_path_factory.mktemp("hf"))
  save_hf(d, seed=2, eos_token_id=3, pad_token_id=3)
  word_tokenizer(d)
  return d


def _copy_with(src: str, dst, change) -> str:
  """src's files in dst, model.safetensors rewritten with {name: change(name, array)}."""
  os.makedirs(dst)
  for name in os.listdir(src):
    if name != "model.safetensors":
      with open(os.path.join(src, name), "rb") as f, open(os.path.join(dst, name), "wb") as g:
        g.write(f.read())
  tensors = dict(safetensors_files.iter_tensors(os.path.join(src, "model.safetensors")))
  safetensors_files.write_file(os.path.join(dst, "model.safetensors"),
                            {n: change(n, a) for n, a in tensors.items()}, {"format": "pt"})
  return str(dst)


def test_a_non_float_tensor_is_refused_naming_it_and_its_file(hf_dir, tmp_path):
  bad = _copy_with(hf_dir, tmp_path / "int16", lambda n, a: (
    (a * 1e6).astype(np.int16) if n == "model.embed_tokens.weight" else a))
  weights_file = os.path.join(bad, "model.safetensors")
  with pytest.raises(exports.CheckpointError, match=rf"{weights_file}: tensor "
                     r"'model.embed_tokens.weight' is stored as int16, not a float type"):
    load.load_model(bad)
  with pytest.raises(ValueError, match="'model.embed_tokens.weight' is stored as int16"):
    convert.convert(bad, str(tmp_path / "out"))
  assert leftovers(str(tmp_path / "out")) == []
  bf16 = _copy_with(hf_dir, tmp_path / "bf16", lambda n, a: a.astype(ml_dtypes.bfloat16))
  assert load.load_model(bf16, param_dtype="float32")[1]["embed"].dtype == np.float32


def test_a_nan_or_inf_weight_is_refused_naming_the_tensor(hf_dir, tmp_path):
  def damage(name, a):
    if name != "model.layers.1.mlp.up_proj.weight":
      return a
    a = a.copy()
    a[3, 5], a[4, 0] = np.nan, np.inf
    return a

  bad = _copy_with(hf_dir, tmp_path / "nan", damage)
  match = (rf"{os.path.join(bad, 'model.safetensors')}: tensor 'model.layers.1.mlp.up_proj."
           r"weight' holds 2 NaN / inf values \(first at index \[3, 5\]\)")
  with pytest.raises(exports.CheckpointError, match=match):
    load.load_model(bad)
  with pytest.raises(ValueError, match=match):
    convert.convert(bad, str(tmp_path / "out"))
  assert leftovers(str(tmp_path / "out")) == []


def test_a_wrongly_shaped_tensor_names_its_file(hf_dir, tmp_path):
  bad = _copy_with(hf_dir, tmp_path / "shape", lambda n, a: (
    a[:, :16] if n == "model.layers.1.mlp.up_proj.weight" else a))
  with pytest.raises(exports.CheckpointError, match=rf"{os.path.join(bad, 'model.safetensors')}: "
                     r"tensor 'model.layers.1.mlp.up_proj.weight' has shape \(48, 16\)"):
    load.load_model(bad)


def _config_with(hf_dir: str, dst, **fields) -> str:
  """A copy of hf_dir with config.json fields replaced."""
  dst = _copy_with(hf_dir, dst, lambda n, a: a)
  with open(os.path.join(dst, "config.json")) as f:
    config = json.load(f)
  with open(os.path.join(dst, "config.json"), "w") as f:
    json.dump({**config, **fields}, f)
  return dst


def test_a_tokenizer_past_vocab_size_or_without_the_eos_is_refused(hf_dir, tmp_path):
  """config.json's vocab_size 96 next to a 120-token tokenizer (ids 96.. would get placeholder
  rows); an eos id the tokenizer lacks; the conversion's own added tokens are allowed."""
  big = _copy_with(hf_dir, tmp_path / "big", lambda n, a: a)
  word_tokenizer(big, base=120)
  with pytest.raises(exports.CheckpointError, match=r"tokenizer.json: 24 token id\(s\) >= "
                     r"vocab_size 96 .*'t96' = 96"):
    load.load_model(big)
  with pytest.raises(ValueError, match=r"24 token id\(s\) >= vocab_size 96"):
    convert.convert(big, str(tmp_path / "out"))
  no_eos = _config_with(hf_dir, tmp_path / "eos", eos_token_id=95)
  with pytest.raises(exports.CheckpointError, match=r"config.json: eos_token_id 95 is no token "
                     r"of .*tokenizer.json"):
    load.load_model(no_eos)
  # the project's tokens past V, added by the conversion itself, are what --add_tokens is for
  added = ["<a_0>", "<a_1>", "<|mask|>"]
  tok = word_tokenizer(tmp_path / "extended", added=added, base=95)  # ids 95, 96, 97
  tokens = tmp_path / "added_tokens.txt"
  tokens.write_text("".join(t + "\n" for t in added))
  hf_weights.check_tokenizer(tok, hf_weights.read_config(hf_dir), added=added)
  config = convert.convert(hf_dir, str(tmp_path / "converted"), add_tokens_file=str(tokens),
                           tokenizer_dir=tok)
  assert config.vocab_size == 98  # row 95 of the padding reused, two new rows
