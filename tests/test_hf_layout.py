"""The HF-layout fixture is what a GPU box holds: sharded safetensors + index, a chat template."""

import json
import os

from gr2jax import load
from tests.hf_layout import save_qwen3_dir


def test_layout_loads_through_the_project_loader(tmp_path):
  d = save_qwen3_dir(tmp_path / "Qwen3-tiny")
  index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
  assert len(set(index["weight_map"].values())) >= 2  # sharded
  assert "chat_template" in open(os.path.join(d, "tokenizer_config.json")).read() or \
    os.path.exists(os.path.join(d, "chat_template.jinja"))
  config, params = load.load_model(d)
  assert params["embed"].shape == (config.vocab_size, 32)
  assert config.vocab_size > 600  # padded past the tokenizer, as Qwen3's table is
