r"""Exports a gr2jax checkpoint as an HF directory that `transformers.Qwen3ForCausalLM` loads.

  python weights_conversion/export_hf.py --ckpt=DIR --out_dir=OUT [--tokenizer_dir=TOK] \
      [--allow_diffusion]

Writes OUT/config.json (`ModelConfig.to_hf_dict`), OUT/model.safetensors (the inverse of the
table in gr2jax/hf/table.py, params in their stored dtype, streamed one tensor at a time) and the
tokenizer next to the weights: --tokenizer_dir's, else the checkpoint's own tokenizer files (a
converted checkpoint has them), else, for a stage export W/<stage>/export, the tokenizer of W's
data build (W/summary.json) when its vocabulary is the one the export records. A tokenizer whose
vocabulary differs from the export's record, or none at all, is an error. Atomic like
convert_hf.py: on any error nothing is at OUT.

A block-diffusion export (CFT, OPD, RL) is refused unless --allow_diffusion: transformers'
Qwen3ForCausalLM decodes it autoregressively with causal attention, so its block-diffusion
decoding (block size, mask token, block-causal attention) is lost in HF; the weights are exported
unchanged and config.json keeps block_size / mask_token_id for convert_hf.py to read back.
"""

import json
import os
import shutil
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import cli, exports, load  # noqa: E402
from gr2jax.hf import safetensors_io  # noqa: E402
from gr2jax.hf import table as hf_table  # noqa: E402
from gr2jax.hf import weights as hf_weights  # noqa: E402
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


def export(ckpt: str, out_dir: str, *, tokenizer_dir: str | None = None,
           allow_diffusion: bool = False) -> ModelConfig:
  """gr2jax checkpoint directory -> HF directory (atomic; out_dir must not exist).

  Args:
    ckpt: the gr2jax checkpoint directory.
    out_dir: the HF directory to create.
    tokenizer_dir: the tokenizer to write next to the weights (default: load.find_tokenizer).
    allow_diffusion: export a block-diffusion model anyway (module docstring: what is lost).

  Returns:
    The exported config.

  Raises:
    ValueError: a diffusion checkpoint without allow_diffusion; a tokenizer of another
      vocabulary (load.find_tokenizer) or one that does not fit the config (ids past vocab_size, no
      eos / pad token: gr2jax/hf/weights.check_tokenizer).
    FileNotFoundError: no tokenizer.
  """
  config = exports.load_config(ckpt)
  if config.mask_token_id is not None and not allow_diffusion:
    raise ValueError(
      f"{ckpt} is a block-diffusion model (block_size {config.block_size}, mask token "
      f"{config.mask_token_id}); transformers' Qwen3ForCausalLM would decode it "
      "autoregressively with causal attention: its block-diffusion decoding is lost in HF. Pass "
      "--allow_diffusion to export the weights anyway (config.json keeps block_size and "
      "mask_token_id for convert_hf.py)")
  source = load.find_tokenizer(ckpt, tokenizer_dir)
  hf_weights.check_tokenizer(source, config, config_file=os.path.join(ckpt, exports.CONFIG_FILE))
  config, params = exports.restore(ckpt)

  def write(tmp: str) -> None:
    write_hf(tmp, config, params)
    for name in convert_hf.TOKENIZER_FILES:
      if os.path.isfile(os.path.join(source, name)):
        shutil.copy2(os.path.join(source, name), tmp)

  exports.atomic_directory(out_dir, write, overwrite=False)
  return config


FLAGS = flags.FLAGS
flags.DEFINE_string("ckpt", None, "gr2jax checkpoint directory (gr2jax_config.json + params/).")
flags.DEFINE_bool("allow_diffusion", False, "Export a block-diffusion checkpoint anyway: HF "
                  "decodes it autoregressively (its block-diffusion decoding is lost).")
# --out_dir and --tokenizer_dir are defined by convert_hf.py (imported above): the directory to
# create, and the tokenizer to write next to the weights (default: module docstring).


def main(argv):
  del argv
  if not FLAGS.ckpt or not FLAGS.out_dir:
    raise app.UsageError("--ckpt and --out_dir are required")
  config = export(FLAGS.ckpt, FLAGS.out_dir, tokenizer_dir=FLAGS.tokenizer_dir,
                  allow_diffusion=FLAGS.allow_diffusion)
  print(f"wrote {FLAGS.out_dir}: vocab {config.vocab_size}, {config.param_dtype}")


if __name__ == "__main__":
  cli.run(main)
