r"""Exports a gr2jax checkpoint as an HF directory that `transformers.Qwen3ForCausalLM` loads.

  python weights_conversion/export_hf.py --ckpt=DIR --out_dir=OUT

Writes OUT/config.json (`ModelConfig.to_hf_dict`), OUT/model.safetensors (the inverse of the
table in gr2jax/hf/table.py, params in their stored dtype, streamed one tensor at a time) and
copies the tokenizer files of the checkpoint. Atomic like convert_hf.py: on any error nothing is
at OUT.
"""

import json
import os
import shutil
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import exports  # noqa: E402
from gr2jax.hf import safetensors_io  # noqa: E402
from gr2jax.hf import table as hf_table  # noqa: E402
from gr2jax.model.config import ModelConfig  # noqa: E402
from weights_conversion import convert_hf  # noqa: E402


def write_hf(directory: str, config: ModelConfig, params) -> None:
  """Writes config.json + model.safetensors for (config, params) into an existing directory.

  Args:
    directory: the output directory.
    config: the model config.
    params: the param pytree (numpy or host-addressable jax arrays).
  """
  hf_config = {**config.to_hf_dict(), "dtype": config.param_dtype}
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump(hf_config, f, indent=2)
  safetensors_io.write_stream(os.path.join(directory, "model.safetensors"),
                              hf_table.export_specs(params),
                              (a for _, a in hf_table.export_tensors(params)), {"format": "pt"})


def export(ckpt: str, out_dir: str) -> ModelConfig:
  """gr2jax checkpoint directory -> HF directory (atomic; out_dir must not exist).

  Args:
    ckpt: the gr2jax checkpoint directory.
    out_dir: the HF directory to create.

  Returns:
    The exported config.
  """
  config, params = exports.restore(ckpt)

  def write(tmp: str) -> None:
    write_hf(tmp, config, params)
    for name in convert_hf.TOKENIZER_FILES:
      if os.path.isfile(os.path.join(ckpt, name)):
        shutil.copy2(os.path.join(ckpt, name), tmp)

  exports.atomic_directory(out_dir, write, overwrite=False)
  return config


FLAGS = flags.FLAGS
flags.DEFINE_string("ckpt", None, "gr2jax checkpoint directory (gr2jax_config.json + params/).")
# --out_dir is defined by convert_hf.py (imported above) with the same meaning.


def main(argv):
  del argv
  if not FLAGS.ckpt or not FLAGS.out_dir:
    raise app.UsageError("--ckpt and --out_dir are required")
  config = export(FLAGS.ckpt, FLAGS.out_dir)
  print(f"wrote {FLAGS.out_dir}: vocab {config.vocab_size}, {config.param_dtype}")


if __name__ == "__main__":
  app.run(main)
