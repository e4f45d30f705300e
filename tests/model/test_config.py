"""ModelConfig: presets, HF config.json round trip, unsupported fields are named errors."""

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from gr2jax.model.config import ModelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

QWEN3_8B_JSON = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.51.0",
    "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}


def test_qwen3_8b_json_matches_preset():
  assert ModelConfig.from_hf_dict(QWEN3_8B_JSON) == ModelConfig.qwen3_8b()


def test_qwen3_0_6b_json_matches_preset():
  d = dict(QWEN3_8B_JSON, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
           num_attention_heads=16, tie_word_embeddings=True)
  assert ModelConfig.from_hf_dict(d) == ModelConfig.qwen3_0_6b()


def test_tiny_size_presets_change_one_axis():
  tiny = ModelConfig.tiny(vocab_size=3072)
  assert ModelConfig.tiny_deep(vocab_size=3072) == dataclasses.replace(tiny, num_layers=4)
  assert ModelConfig.tiny_wide(vocab_size=3072) == dataclasses.replace(
    tiny, hidden_size=256, head_dim=64, intermediate_size=768)
  assert ModelConfig.tiny_wide(num_layers=3).num_layers == 3  # overrides win


def test_rope_theta_from_rope_parameters():
  d = dict(QWEN3_8B_JSON, rope_parameters={"rope_type": "default", "rope_theta": 5000.0})
  del d["rope_theta"]
  assert ModelConfig.from_hf_dict(d).rope_theta == 5000.0


def test_transformers_config_round_trip(tmp_path):
  transformers = pytest.importorskip("transformers")
  config = ModelConfig.tiny(rope_theta=777.0, tie_word_embeddings=True, head_dim=48,
                            eos_token_ids=(3, 5), pad_token_id=1, bos_token_id=2)
  hf = transformers.Qwen3Config(**config.to_hf_dict())
  assert hf.rope_parameters["rope_theta"] == 777.0
  hf.save_pretrained(tmp_path)
  assert ModelConfig.from_hf_dir(str(tmp_path)) == config
  assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config


def test_diffusion_fields_round_trip():
  config = ModelConfig.tiny(block_size=32, mask_token_id=4095)
  assert ModelConfig.from_hf_dict(config.to_hf_dict()) == config


@pytest.mark.parametrize("field,value", [
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0}),
    ("rope_parameters", {"rope_type": "linear", "rope_theta": 1e6, "factor": 2.0}),
    ("num_experts", 128),
    ("use_sliding_window", True),
    ("layer_types", ["sliding_attention"] * 36),
    ("attention_bias", True),
    ("hidden_act", "gelu"),
    ("model_type", "qwen3_moe"),
    ("attention_dropout", 0.1),
    ("pivot_filler_id", 9),  # a retired feature (pivot-aligned blocks)
])
def test_unsupported_field_is_named(field, value):
  with pytest.raises(ValueError, match=field):
    ModelConfig.from_hf_dict(dict(QWEN3_8B_JSON, **{field: value}))


def test_missing_field_is_named():
  d = dict(QWEN3_8B_JSON)
  del d["hidden_size"]
  with pytest.raises(ValueError, match="hidden_size"):
    ModelConfig.from_hf_dict(d)


def test_from_hf_dir_names_the_file(tmp_path):
  (tmp_path / "config.json").write_text(json.dumps(dict(QWEN3_8B_JSON, hidden_act="relu")))
  with pytest.raises(ValueError, match="config.json.*hidden_act"):
    ModelConfig.from_hf_dir(str(tmp_path))
  (tmp_path / "config.json").write_text("{\n  \"vocab_size\": ,\n}")
  with pytest.raises(ValueError, match="config.json:2"):
    ModelConfig.from_hf_dir(str(tmp_path))


@pytest.mark.parametrize("overrides,match", [
    (dict(num_heads=5), "num_kv_heads"),
    (dict(head_dim=33), "head_dim"),
    (dict(param_dtype="float16"), "param_dtype"),
    (dict(eos_token_ids=[1]), "eos_token_ids"),
    (dict(num_layers=0), "num_layers"),
])
def test_invalid_config(overrides, match):
  with pytest.raises((ValueError, TypeError), match=match):
    ModelConfig.tiny(**overrides)


def test_hashable_and_replace():
  config = ModelConfig.tiny()
  assert hash(config) == hash(ModelConfig.tiny())
  assert dataclasses.replace(config, vocab_size=300).vocab_size == 300


def test_public_api_is_lazy():
  code = ("import sys, gr2jax; assert 'jax' not in sys.modules; "
          "from gr2jax import ModelConfig, forward, generate, load_model; "
          "assert ModelConfig.__module__ == 'gr2jax.model.config'")
  subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)
  import gr2jax
  from gr2jax.model.qwen3 import forward
  assert gr2jax.forward is forward
  with pytest.raises(AttributeError, match="nope"):
    gr2jax.nope  # noqa: B018


def test_a_preset_by_name_and_an_unknown_name_refused_naming_its_flag():
  from gr2jax.model.config import PRESETS

  assert ModelConfig.preset("tiny", vocab_size=64) == ModelConfig.tiny(vocab_size=64)
  assert all(callable(getattr(ModelConfig, name)) for name in PRESETS)
  for bad in ("nosuch", "from_hf_dict"):
    with pytest.raises(ValueError, match=f"--presets='{bad}': not a ModelConfig preset"):
      ModelConfig.preset(bad, "--presets")
