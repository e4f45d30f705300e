"""HF parity on the real path: save_pretrained -> convert_hf.py main() -> load_model -> forward.

Three tiny random configs cover tied / untied embeddings, GQA ratios 1, 2 and 4, head_dim !=
hidden / heads, and a non-default rope_theta read from `rope_parameters` (transformers 5) and from
the top-level field (older config.json files). fp32 max |dlogit| <= 1e-4.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from gr2jax import load
from gr2jax.model import generate, qwen3
from tests.weights_conversion.conftest import run_main, save_hf, word_tokenizer
from weights_conversion import convert_hf, export_hf

ATOL = 1e-4
CONFIGS = {
  # GQA 2, head_dim 16 != 32/4, rope_theta 1e6 via rope_parameters (what transformers 5 writes).
  "untied_gqa2_rope_parameters": dict(rope_parameters={"rope_type": "default",
                                                       "rope_theta": 1e6}),
  # GQA 1 (MHA), head_dim 8 == 32/4, tied embeddings, default theta 1e4.
  "tied_mha": dict(num_key_value_heads=4, head_dim=8, tie_word_embeddings=True),
  # GQA 4, head_dim 12, 3 layers, rope_theta 5e5 as a top-level field (older config.json).
  "untied_gqa4_top_level_theta": dict(num_attention_heads=8, num_key_value_heads=2, head_dim=12,
                                      num_hidden_layers=3, top_level_theta=5e5),
}


def _hf_logits(model, tokens: np.ndarray):
  with torch.no_grad():
    out = model(torch.from_numpy(tokens), output_hidden_states=True)
  return out.logits.numpy(), [h.numpy() for h in out.hidden_states]


@pytest.fixture(scope="module", params=sorted(CONFIGS))
def converted(request, tmp_path_factory):
  """(HF model, HF dir, gr2jax checkpoint dir, config, params) for one CONFIGS entry."""
  overrides = dict(CONFIGS[request.param])
  theta = overrides.pop("top_level_theta", None)
  root = tmp_path_factory.mktemp(request.param)
  hf_dir, ckpt = str(root / "hf"), str(root / "ckpt")
  model = save_hf(hf_dir, seed=7, **overrides)
  word_tokenizer(hf_dir)  # copied into the checkpoint, then written next to the exported weights
  if theta is not None:  # rewrite config.json the old way and make the HF model agree
    with open(os.path.join(hf_dir, "config.json")) as f:
      d = json.load(f)
    del d["rope_parameters"]
    d["rope_theta"] = theta
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
      json.dump(d, f)
    model = transformers.Qwen3ForCausalLM.from_pretrained(hf_dir).eval()
    assert model.config.rope_parameters["rope_theta"] == theta
  run_main(convert_hf, hf_dir=hf_dir, out_dir=ckpt)
  config, params = load.load_model(ckpt)
  return model, hf_dir, ckpt, config, params


def _tokens(config, batch=2, length=13, seed=0):
  return np.random.default_rng(seed).integers(0, config.vocab_size, (batch, length)).astype(
    np.int64)


def test_logits_and_hidden_states_match_transformers(converted):
  model, _, _, config, params = converted
  assert config.rope_theta == model.config.rope_parameters["rope_theta"]
  tokens = _tokens(config)
  want, want_hidden = _hf_logits(model, tokens)
  logits, hidden = qwen3.hidden_states(params, config, jnp.asarray(tokens, jnp.int32))
  assert logits.dtype == jnp.float32
  for i in range(config.num_layers):  # HF's last hidden state is after the final norm
    np.testing.assert_allclose(hidden[i], want_hidden[i], atol=ATOL, err_msg=f"layer {i}")
  assert np.abs(np.asarray(logits) - want).max() <= ATOL


def test_ragged_batch_matches_one_by_one(converted):
  """Right-padded prompts of different lengths: each row's valid logits equal HF on that row."""
  model, _, _, config, params = converted
  tokens = _tokens(config, batch=3, length=11, seed=1)
  lengths = [11, 4, 7]
  padded = np.where(np.arange(11)[None] < np.array(lengths)[:, None], tokens, 0)
  logits, _ = qwen3.forward(params, config, jnp.asarray(padded, jnp.int32))
  for row, n in enumerate(lengths):
    want, _ = _hf_logits(model, tokens[row : row + 1, :n])
    assert np.abs(np.asarray(logits[row, :n]) - want[0]).max() <= ATOL, row


def test_load_model_on_hf_dir_equals_converted(converted):
  _, hf_dir, _, config, params = converted
  config2, params2 = load.load_model(hf_dir)
  assert config2 == config
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_export_then_transformers_reload_gives_same_logits(converted, tmp_path):
  _, _, ckpt, config, params = converted
  out = str(tmp_path / "exported")
  run_main(export_hf, ckpt=ckpt, out_dir=out)
  reloaded = transformers.Qwen3ForCausalLM.from_pretrained(out).eval()
  tokens = _tokens(config, seed=2)
  want, _ = _hf_logits(reloaded, tokens)
  logits, _ = qwen3.forward(params, config, jnp.asarray(tokens, jnp.int32))
  assert np.abs(np.asarray(logits) - want).max() <= ATOL


def _hf_greedy(model, prompt: np.ndarray, max_new: int) -> np.ndarray:
  with torch.no_grad():
    out = model.generate(torch.from_numpy(prompt), attention_mask=torch.ones_like(
      torch.from_numpy(prompt)), do_sample=False, max_new_tokens=max_new, min_new_tokens=max_new,
                         eos_token_id=None, pad_token_id=0)
  return out[:, prompt.shape[1]:].numpy()


def test_greedy_tokens_match_transformers_generate(converted):
  """A ragged batch of prompts decodes like transformers' greedy generate on each prompt alone."""
  model, _, _, config, params = converted
  max_new, lengths = 10, [9, 4, 6]
  prompts = _tokens(config, batch=3, length=9, seed=3)
  padded = np.where(np.arange(9)[None] < np.array(lengths)[:, None], prompts, 0)
  out = generate.generate(params, config, jnp.asarray(padded, jnp.int32),
                          jnp.asarray(lengths, jnp.int32),
                          generate.ARDecoding(max_new_tokens=max_new, stop_token_ids=()))
  assert int(out.nfe) == max_new
  for row, n in enumerate(lengths):
    want = _hf_greedy(model, prompts[row : row + 1, :n], max_new)[0]
    np.testing.assert_array_equal(np.asarray(out.tokens[row]), want, err_msg=f"row {row}")
