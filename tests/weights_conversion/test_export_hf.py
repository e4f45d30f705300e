"""export_hf.py: gr2jax checkpoint -> HF directory that transformers reloads, weights intact."""

import json
import os
import shutil

import jax
import numpy as np
import pytest
import torch
import transformers

from gr2jax import exports
from gr2jax.hf import weights as hf_weights
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig
from tests.weights_conversion.conftest import leftovers, run_main, word_tokenizer
from weights_conversion import convert_hf, export_hf


def test_export_round_trip_reloads_in_transformers(hf_untied, tmp_path):
  model, hf_dir = hf_untied
  ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hf_out")
  convert_hf.convert(hf_dir, ckpt)
  tok = word_tokenizer(tmp_path / "tok")
  run_main(export_hf, ckpt=ckpt, out_dir=out, tokenizer_dir=tok)
  assert open(os.path.join(out, "tokenizer.json")).read() == open(
    os.path.join(tok, "tokenizer.json")).read()  # the tokenizer next to the weights
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(out).eval()
  tokens = torch.arange(20).reshape(2, 10) % model.config.vocab_size
  with torch.no_grad():
    torch.testing.assert_close(reloaded(tokens).logits, model(tokens).logits, rtol=0, atol=0)
  assert ModelConfig.from_hf_dir(out) == ModelConfig.from_hf_dir(hf_dir)
  with pytest.raises(FileExistsError):
    export_hf.export(ckpt, out, tokenizer_dir=tok)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_export_tied_and_grown_vocab(dtype, tmp_path):
  """A tied bf16/fp32 checkpoint (e.g. after --add_tokens) exports with every weight intact."""
  config = ModelConfig.tiny(vocab_size=70, hidden_size=32, head_dim=8, intermediate_size=48,
                            tie_word_embeddings=True, param_dtype=dtype, eos_token_ids=(3,))
  params = params_lib.init_params(config, jax.random.key(1))
  ckpt, out = str(tmp_path / "ckpt"), str(tmp_path / "hf_out")
  exports.save(ckpt, config, params)
  export_hf.export(ckpt, out, tokenizer_dir=word_tokenizer(tmp_path / "tok", base=70))
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["dtype"] == dtype
  assert ModelConfig.from_hf_dir(out, param_dtype=dtype) == config
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(out, dtype=getattr(torch, dtype))
  assert reloaded.lm_head.weight.data_ptr() == reloaded.model.embed_tokens.weight.data_ptr()
  q = reloaded.model.layers[1].self_attn.q_proj.weight.detach().float().numpy()  # [N*H, D]
  np.testing.assert_array_equal(
    q, np.asarray(params["layers"]["q"][1].astype(np.float32)).reshape(32, -1).T)
  _, back = convert_hf.load_hf(out)
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), back,
               params)


def test_export_of_damaged_checkpoint_leaves_nothing(tmp_path):
  out = str(tmp_path / "hf_out")
  with pytest.raises(exports.CheckpointError, match="not a gr2jax checkpoint"):
    export_hf.export(str(tmp_path), out)
  assert leftovers(out) == []


def test_diffusion_export_needs_allow_diffusion_and_a_tokenizer_is_always_written(tmp_path):
  """A block-diffusion export is refused (what HF loses is said) unless --allow_diffusion; a
  checkpoint without a tokenizer needs --tokenizer_dir; one of another vocabulary is refused;
  a stage export finds its workdir's data build tokenizer by the vocabulary it records (the
  last build's, W/summary.json, or any build cached in W)."""
  config = ModelConfig.tiny(vocab_size=96, hidden_size=32, head_dim=8, intermediate_size=48,
                            eos_token_ids=(3,), block_size=4, mask_token_id=95)
  params = params_lib.init_params(config, jax.random.key(0))
  tok = word_tokenizer(tmp_path / "elsewhere" / "tokenizer-k", added=["<|mask|>"], base=95)
  vocab = exports.vocab_digest(hf_weights.load_tokenizer_json(tok))
  ckpt = str(tmp_path / "W" / "rl" / "export")
  exports.save(ckpt, config, params, metadata={"data_build": {"vocab_sha256": vocab}})
  out = str(tmp_path / "hf_out")
  with pytest.raises(ValueError, match="block-diffusion model .*--allow_diffusion"):
    export_hf.export(ckpt, out)
  with pytest.raises(FileNotFoundError, match="no tokenizer found.*--tokenizer_dir"):
    export_hf.export(ckpt, out, allow_diffusion=True)
  with pytest.raises(ValueError, match="is not the one .* was trained with"):
    export_hf.export(ckpt, out, allow_diffusion=True,
                     tokenizer_dir=word_tokenizer(tmp_path / "other", base=95))
  assert leftovers(out) == []
  (tmp_path / "W" / "summary.json").write_text(json.dumps({"paths": {"tokenizer": tok}}))
  export_hf.export(ckpt, out, allow_diffusion=True)
  assert open(os.path.join(out, "tokenizer.json")).read() == open(
    os.path.join(tok, "tokenizer.json")).read()
  with open(os.path.join(out, "config.json")) as f:
    assert json.load(f)["block_size"] == 4  # kept for convert_hf.py
  os.remove(tmp_path / "W" / "summary.json")
  shutil.copytree(tok, tmp_path / "W" / "tokenizer-k")
  export_hf.export(ckpt, str(tmp_path / "hf_cached"), allow_diffusion=True)
