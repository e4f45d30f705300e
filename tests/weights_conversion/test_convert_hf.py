"""convert_hf.py (+ the library's HF reader): formats, dtypes, add_tokens, tokenizers, bad input.

The table and safetensors unit tests live in tests/hf/."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
import torch

from gr2jax import exports
from gr2jax.hf import safetensors_io
from gr2jax.hf import table as hf_table
from gr2jax.hf import weights as hf_weights
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig
from tests.hf import safetensors_files
from tests.weights_conversion.conftest import leftovers, run_main, save_hf, word_tokenizer
from weights_conversion import convert_hf


def _hf_state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().float().numpy() for k, v in model.state_dict().items()
          if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}


def _assert_matches_hf(params, model):
  """Every param equals its HF tensor through the inverse table (and nothing is left over)."""
  state = _hf_state(model)
  exported = dict(hf_table.export_tensors(params))
  assert sorted(exported) == sorted(state)
  for name, value in exported.items():
    np.testing.assert_array_equal(value.astype(np.float32), state[name], err_msg=name)


def test_convert_main_writes_checkpoint(hf_untied, tmp_path):
  model, hf_dir = hf_untied
  with open(os.path.join(hf_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"model_max_length": 256}, f)
  out = str(tmp_path / "ckpt")
  run_main(convert_hf, hf_dir=hf_dir, out_dir=out)
  assert sorted(os.listdir(out)) == ["generation_config.json", "gr2jax_config.json",
                                     "gr2jax_metadata.json", "params", "tokenizer_config.json"]
  assert leftovers(out) == ["ckpt"]
  config, params = exports.restore(out)
  assert config == ModelConfig.from_hf_dir(hf_dir)
  _assert_matches_hf(jax.tree.map(np.asarray, params), model)
  with pytest.raises(FileExistsError, match="already exists"):
    convert_hf.convert(hf_dir, out)


@pytest.mark.parametrize("layout", ["sharded", "bin", "bf16"])
def test_weight_layouts(layout, tmp_path):
  hf_dir = str(tmp_path / "hf")
  model = save_hf(hf_dir, seed=2, tie_word_embeddings=True,
                  dtype=torch.bfloat16 if layout == "bf16" else torch.float32)
  if layout == "sharded":
    model.save_pretrained(hf_dir, max_shard_size="20KB")
    assert len(hf_weights.weight_files(hf_dir)) > 2
  if layout == "bin":
    os.remove(os.path.join(hf_dir, "model.safetensors"))
    torch.save(model.state_dict(), os.path.join(hf_dir, "pytorch_model.bin"))
  config, params = convert_hf.load_hf(hf_dir)
  assert config.param_dtype == ("bfloat16" if layout == "bf16" else "float32")
  assert {x.dtype for x in jax.tree.leaves(params)} == {np.dtype(config.param_dtype)}
  _assert_matches_hf(params, model)
  if layout == "bf16":  # bf16 -> fp32 on request is exact
    _, params32 = convert_hf.load_hf(hf_dir, param_dtype="float32")
    assert params32["embed"].dtype == np.float32
    np.testing.assert_array_equal(params32["embed"], params["embed"].astype(np.float32))
  else:  # fp32 -> bf16 on request rounds like torch's .bfloat16()
    _, params16 = convert_hf.load_hf(hf_dir, param_dtype="bfloat16")
    _assert_matches_hf(params16, model.bfloat16())


def test_add_tokens(hf_untied, tmp_path):
  model, hf_dir = hf_untied
  token_file = tmp_path / "tokens.txt"
  token_file.write_text("<|mask|>\n<a_1>\n<b_2>\n")
  out = str(tmp_path / "ckpt")
  run_main(convert_hf, hf_dir=hf_dir, out_dir=out, add_tokens=str(token_file))
  config, params = exports.restore(out)
  v = model.config.vocab_size
  assert config.vocab_size == v + 3
  with open(os.path.join(out, convert_hf.ADDED_IDS_FILE)) as f:
    assert json.load(f) == {"<|mask|>": v, "<a_1>": v + 1, "<b_2>": v + 2}
  embed, head = np.asarray(params["embed"]), np.asarray(params["lm_head"])
  assert embed.shape == (v + 3, 32) and head.shape == (32, v + 3)
  np.testing.assert_array_equal(embed[:v], _hf_state(model)["model.embed_tokens.weight"])
  np.testing.assert_allclose(embed[v:], np.broadcast_to(embed[:v].mean(0), (3, 32)), atol=1e-4)
  np.testing.assert_allclose(head[:, v:], np.broadcast_to(head[:, :v].mean(1)[:, None], (32, 3)),
                             atol=1e-4)
  assert len({row.tobytes() for row in embed[v:]}) == 3  # the noise separates the new rows


def _ids(out):
  """(added_token_ids.json, the same tokens' ids in the copied tokenizer.json)."""
  import tokenizers

  with open(os.path.join(out, convert_hf.ADDED_IDS_FILE)) as f:
    ids = json.load(f)
  copied = tokenizers.Tokenizer.from_file(os.path.join(out, "tokenizer.json"))
  return ids, {t: copied.token_to_id(t) for t in ids}


def test_add_tokens_takes_ids_from_the_tokenizer(hf_untied, tmp_path):
  """Like Qwen3: tokenizer ids 90.. overwrite the unused rows 90..95 of V=96 and grow beyond."""
  model, hf_dir = hf_untied
  new = [f"<s_{i}>" for i in range(10)]
  tok_dir = word_tokenizer(tmp_path / "tok", added=new)
  token_file = tmp_path / "added_tokens.txt"
  token_file.write_text("".join(t + "\n" for t in new))
  out = str(tmp_path / "ckpt")
  run_main(convert_hf, hf_dir=hf_dir, out_dir=out, add_tokens=str(token_file),
           tokenizer_dir=tok_dir)
  config, params = exports.restore(out)
  assert config.vocab_size == 100
  ids, copied = _ids(out)
  assert ids == copied == {t: 90 + i for i, t in enumerate(new)}
  embed = np.asarray(params["embed"])
  np.testing.assert_array_equal(embed[:90], _hf_state(model)["model.embed_tokens.weight"][:90])
  np.testing.assert_allclose(embed[90:], np.broadcast_to(embed[:90].mean(0), (10, 32)),
                             atol=1e-4)
  # A token the tokenizer lacks is appended to the copied tokenizer, with the id it gets there.
  partial = tmp_path / "partial.txt"
  partial.write_text("<s_0>\n<not_there>\n")
  out = str(tmp_path / "appended")
  one = word_tokenizer(tmp_path / "one", added=new[:1])
  config = convert_hf.convert(hf_dir, out, add_tokens_file=str(partial), tokenizer_dir=one)
  ids, copied = _ids(out)
  assert ids == copied == {"<s_0>": 90, "<not_there>": 91} and config.vocab_size == 96
  # tok_dir's other tokens (<s_6>.. at ids 96..99, past V, not in the file) would get
  # placeholder rows: refused, naming the first
  with pytest.raises(ValueError, match=r"4 token id\(s\) >= vocab_size 96 .* '<s_6>' = 96"):
    convert_hf.convert(hf_dir, str(tmp_path / "placeholders"), add_tokens_file=str(partial),
                       tokenizer_dir=tok_dir)
  assert leftovers(str(tmp_path / "placeholders")) == []


def test_add_tokens_refuses_tokens_the_model_already_has(hf_untied, tmp_path):
  """an existing token is an error naming it; its trained row is untouched."""
  _, hf_dir = hf_untied
  tok_dir = word_tokenizer(tmp_path / "tok", added=["<new>"])
  token_file = tmp_path / "tokens.txt"
  token_file.write_text("<new>\nt5\n")
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=r"'t5' \(id 5\) already in the model's tokenizer"):
    convert_hf.convert(hf_dir, out, add_tokens_file=str(token_file), tokenizer_dir=tok_dir)
  assert leftovers(out) == []
  # The same through --hf_dir's own tokenizer (an added token of it counts as existing too).
  own = str(tmp_path / "hf")
  save_hf(own, seed=1)
  word_tokenizer(own, added=["<im_end>"])
  token_file.write_text("<new>\n<im_end>\n")
  with pytest.raises(ValueError, match=r"'<im_end>' \(id 90\) already"):
    convert_hf.convert(own, out, add_tokens_file=str(token_file))
  assert leftovers(out) == []


def test_tokenizer_dir(tmp_path):
  """a missing --tokenizer_dir is an error; without it --hf_dir's tokenizer
  gives the ids, and the copied tokenizer agrees with added_token_ids.json."""
  hf_dir = str(tmp_path / "hf")
  save_hf(hf_dir, seed=1)
  word_tokenizer(hf_dir)
  token_file = tmp_path / "tokens.txt"
  token_file.write_text("<a>\n<b>\n")
  with pytest.raises(FileNotFoundError, match="--tokenizer_dir=.*nowhere is not a directory"):
    convert_hf.convert(hf_dir, str(tmp_path / "x"), add_tokens_file=str(token_file),
                       tokenizer_dir=str(tmp_path / "nowhere"))
  out = str(tmp_path / "ckpt")
  config = convert_hf.convert(hf_dir, out, add_tokens_file=str(token_file))
  ids, copied = _ids(out)
  assert ids == copied == {"<a>": 90, "<b>": 91}  # the tokenizer's next ids (padding rows of V=96)
  assert config.vocab_size == 96
  slow_only = tmp_path / "slow"
  slow_only.mkdir()
  (slow_only / "vocab.json").write_text("{}")
  with pytest.raises(ValueError, match="has no tokenizer.json"):
    convert_hf.convert(hf_dir, str(tmp_path / "y"), add_tokens_file=str(token_file),
                       tokenizer_dir=str(slow_only))
  assert leftovers(str(tmp_path / "y")) == []


def _rewrite(hf_dir, edit):
  """Applies `edit(dict of tensors)` to model.safetensors."""
  file = os.path.join(hf_dir, "model.safetensors")
  tensors = dict(safetensors_files.iter_tensors(file))
  edit(tensors)
  safetensors_files.write_file(file, tensors, {"format": "pt"})


def _edit_config(hf_dir, **fields):
  file = os.path.join(hf_dir, "config.json")
  with open(file) as f:
    d = json.load(f)
  d.update(fields)
  with open(file, "w") as f:
    json.dump(d, f)


def _truncate(hf_dir):
  file = os.path.join(hf_dir, "model.safetensors")
  os.truncate(file, os.path.getsize(file) - 100)


BAD_INPUTS = {
  "missing": (lambda d: _rewrite(d, lambda t: t.pop("model.layers.1.mlp.up_proj.weight")),
              "missing tensor 'model.layers.1.mlp.up_proj.weight'"),
  "unexpected": (lambda d: _rewrite(d, lambda t: t.update(
    {"model.layers.0.self_attn.q_proj.bias": np.zeros(64, np.float32)})),
                 "unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"),
  "extra_layer": (lambda d: _rewrite(d, lambda t: t.update(
    {"model.layers.2.input_layernorm.weight": np.ones(32, np.float32)})),
                  "unexpected tensor 'model.layers.2.input_layernorm.weight'"),
  "tied_head": (lambda d: _edit_config(d, tie_word_embeddings=True),
                "tensor 'lm_head.weight' differs from 'model.embed_tokens.weight'"),
  "wrong_shape": (lambda d: _rewrite(d, lambda t: t.update(
    {"model.layers.0.self_attn.k_proj.weight": np.zeros((32, 16), np.float32)})),
                  r"tensor 'model.layers.0.self_attn.k_proj.weight' has shape \(32, 16\), "
                  r"expected \(32, 32\)"),
  "unsupported_field": (lambda d: _edit_config(d, rope_parameters={"rope_type": "yarn",
                                                                   "rope_theta": 1e4}),
                        "rope_parameters.rope_type='yarn'"),
  "truncated": (_truncate,
                r"tensor '[\w.]+' ends at byte \d+ but the file has \d+ bytes \(truncated"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_names_the_problem_and_leaves_nothing(case, tmp_path):
  hf_dir = str(tmp_path / "hf")
  save_hf(hf_dir, seed=3)
  damage, message = BAD_INPUTS[case]
  damage(hf_dir)
  out = str(tmp_path / "out")
  with pytest.raises(ValueError, match=message):
    run_main(convert_hf, hf_dir=hf_dir, out_dir=out)
  assert leftovers(out) == []


def test_duplicate_tensor_across_shards(tmp_path):
  hf_dir = str(tmp_path / "hf")
  save_hf(hf_dir, seed=4)
  os.rename(os.path.join(hf_dir, "model.safetensors"), os.path.join(hf_dir, "a.safetensors"))
  safetensors_files.write_file(os.path.join(hf_dir, "b.safetensors"),
                            {"model.norm.weight": np.ones(32, np.float32)}, {"format": "pt"})
  with pytest.raises(ValueError, match="'model.norm.weight' appears more than once"):
    convert_hf.load_hf(hf_dir)


def _synthetic_hf_dir(directory: str, config: ModelConfig, num_shards: int) -> int:
  """Writes a random HF checkpoint of `config` in shards, one tensor at a time; returns bytes."""
  specs = hf_table.export_specs(params_lib.abstract_params(config))
  rng = np.random.default_rng(0)
  per = -(-len(specs) // num_shards)
  weight_map = {}
  for s in range(num_shards):
    part = specs[s * per : (s + 1) * per]
    name = f"model-{s + 1:05d}-of-{num_shards:05d}.safetensors"
    arrays = ((0.02 * rng.standard_normal(shape, np.float32)).astype(dtype)
              for _, shape, dtype in part)
    safetensors_io.write_stream(os.path.join(directory, name), part, arrays, {"format": "pt"})
    weight_map.update({n: name for n, _, _ in part})
  with open(os.path.join(directory, "model.safetensors.index.json"), "w") as f:
    json.dump({"metadata": {}, "weight_map": weight_map}, f)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({**config.to_hf_dict(), "dtype": "bfloat16"}, f)
  return sum(os.path.getsize(os.path.join(directory, n)) for n in set(weight_map.values()))


@pytest.mark.slow
def test_peak_rss_on_multi_gb_checkpoint(tmp_path):
  """Converting a 3.1 GB bf16 checkpoint peaks at <= 1.3x its size (measured: 0.96x).

  The conversion runs in a fresh process so its VmHWM covers exactly python + jax + the convert.
  """
  config = ModelConfig(vocab_size=32000, hidden_size=2048, num_layers=28, num_heads=16,
                       num_kv_heads=8, head_dim=128, intermediate_size=6144,
                       param_dtype="bfloat16")
  hf_dir, out = tmp_path / "hf", tmp_path / "ckpt"
  hf_dir.mkdir()
  size = _synthetic_hf_dir(str(hf_dir), config, num_shards=3)
  code = ("import sys; sys.path.insert(0, '.');"
          "from weights_conversion import convert_hf;"
          f"convert_hf.convert({str(hf_dir)!r}, {str(out)!r});"
          "print([l for l in open('/proc/self/status') if l.startswith('VmHWM')][0])")
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  result = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                          check=True)
  peak = int(result.stdout.split("VmHWM:")[1].split()[0]) * 1024
  print(f"checkpoint {size / 1e9:.2f} GB, peak RSS {peak / 1e9:.2f} GB = {peak / size:.2f}x")
  assert peak <= 1.3 * size
  assert exports.load_config(str(out)) == config
