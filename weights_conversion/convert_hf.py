r"""Converts a local HF Qwen3 directory into a gr2jax (orbax) checkpoint.

  python weights_conversion/convert_hf.py --hf_dir=DIR --out_dir=OUT \
      [--param_dtype=float32|bfloat16] [--add_tokens=FILE] [--add_tokens_seed=0] \
      [--tokenizer_dir=DIR]

The command line of gr2jax/hf/convert.py (its docstring: formats, the streaming conversion, how
--add_tokens picks ids and initialises rows, atomic writes). A recipe's `convert` step runs the
same function with the data build's extended tokenizer (experiments/configs/convert.py).
"""

import os
import sys

from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import cli  # noqa: E402
from gr2jax.hf.convert import (  # noqa: E402
  ADDED_IDS_FILE,
  TOKENIZER_FILES,
  convert,
  load_hf,
)
from gr2jax.model import params as params_lib  # noqa: E402

__all__ = ["ADDED_IDS_FILE", "TOKENIZER_FILES", "convert", "load_hf"]  # what its users import

FLAGS = flags.FLAGS
flags.DEFINE_string("hf_dir", None, "Local HF Qwen3 directory (config.json + weights).")
flags.DEFINE_string("out_dir", None, "Output directory to create; must not exist. Written "
                    "atomically: on any error nothing is left there. (Shared with export_hf.py.)")
flags.DEFINE_enum("param_dtype", None, ["float32", "bfloat16"],
                  "Param storage dtype (default: bfloat16 if the HF config says bf16, else fp32).")
flags.DEFINE_string("add_tokens", None, "File of new tokens, one per line: grows embed/lm_head "
                    "(init: mean row + 1e-3*std noise); ids written to added_token_ids.json. A "
                    "token the model already has is an error.")
flags.DEFINE_integer("add_tokens_seed", 0, "Seed of the --add_tokens init noise.")
flags.DEFINE_string("tokenizer_dir", None, "Existing directory of the tokenizer to copy into the "
                    "checkpoint and to take the --add_tokens ids from (its tokenizer.json; tokens "
                    "it lacks are appended to the copy); default --hf_dir. (Shared with "
                    "export_hf.py: the tokenizer written next to the exported weights.)")


def main(argv):
  del argv
  if not FLAGS.hf_dir or not FLAGS.out_dir:
    raise app.UsageError("--hf_dir and --out_dir are required")
  config = convert(FLAGS.hf_dir, FLAGS.out_dir, FLAGS.param_dtype, FLAGS.add_tokens,
                   FLAGS.add_tokens_seed, FLAGS.tokenizer_dir)
  print(f"wrote {FLAGS.out_dir}: {params_lib.param_count(config):,} params, "
        f"{config.param_dtype}, vocab {config.vocab_size}")


if __name__ == "__main__":
  cli.run(main)
