"""gr2jax/hf/table.py: the HF <-> param table round trip and its shapes against transformers."""

import jax
import numpy as np
import pytest

from gr2jax import exports
from gr2jax.hf import table as hf_table
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig
from tests.weights_conversion.conftest import save_hf


def _hf_state(model) -> dict[str, np.ndarray]:
  return {k: v.detach().float().numpy() for k, v in model.state_dict().items()
          if not (k == "lm_head.weight" and model.config.tie_word_embeddings)}


@pytest.mark.parametrize("tied", [False, True])
def test_table_round_trip(tied):
  config = ModelConfig.tiny(vocab_size=64, hidden_size=32, head_dim=8, intermediate_size=48,
                            num_layers=3, tie_word_embeddings=tied)
  params = jax.tree.map(np.asarray, params_lib.init_params(config, jax.random.key(0)))
  tensors = dict(hf_table.export_tensors(params))
  assert sorted(tensors) == sorted(hf_table.expected_names(params))
  assert [(n, s) for n, s, _ in hf_table.export_specs(params)] == [
    (n, t.shape) for n, t in tensors.items()]
  assert ("lm_head.weight" in tensors) == (not tied)
  shapes = {n: t.shape for n, t in tensors.items()}
  leaves = hf_table.load_leaves(shapes, tensors.__getitem__, params_lib.abstract_params(config),
                                np.float32)
  jax.tree.map(np.testing.assert_array_equal, exports.unflatten(leaves), params)


def test_expected_hf_shapes_match_transformers(tmp_path):
  model = save_hf(str(tmp_path), seed=1)
  config = ModelConfig.from_hf_dict(model.config.to_dict())
  abstract = params_lib.abstract_params(config)
  state = _hf_state(model)
  assert sorted(hf_table.expected_names(abstract)) == sorted(state)
  for name, value in state.items():
    rule, layer = hf_table.match(name, abstract)
    leaf = abstract
    for key in rule.path:
      leaf = leaf[key]
    shape = leaf.shape[1:] if layer is not None else leaf.shape
    assert hf_table.hf_shape(rule, shape) == value.shape, name
