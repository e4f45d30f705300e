"""gr2jax/hf/safetensors_io.py: bf16 round trip, agreement with the reference reader."""

import ml_dtypes
import numpy as np
import torch

from tests.hf import safetensors_files


def test_safetensors_io_bf16_round_trip(tmp_path):
  file = str(tmp_path / "x.safetensors")
  tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16),
             "b": np.ones((0, 4), np.float32), "c": np.arange(5, dtype=np.int64)}
  safetensors_files.write_file(file, tensors, {"format": "pt"})
  back = dict(safetensors_files.iter_tensors(file))
  assert list(back) == ["a", "b", "c"]
  for k, v in tensors.items():
    assert back[k].dtype == v.dtype and back[k].shape == v.shape
    np.testing.assert_array_equal(back[k], v)
  from safetensors.torch import load_file  # the reference reader agrees

  assert torch.equal(load_file(file)["a"], torch.arange(6.0).reshape(2, 3).bfloat16())
