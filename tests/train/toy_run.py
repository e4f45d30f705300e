"""Runs the toy SFT stage in its own process (the resume test SIGKILLs it).

  python -m tests.train.toy_run WORKDIR TOKENIZER_DIR STEPS
"""

import os
import sys

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=1")

from gr2jax.data import tokenizer as tokenizer_lib  # noqa: E402
from gr2jax.train import loop, stages  # noqa: E402
from tests.train.toy import toy_config, toy_context  # noqa: E402


def main(workdir: str, tokenizer_dir: str, steps: int) -> None:
  config = toy_config(steps=steps, save_every=2)
  tok = tokenizer_lib.load_tokenizer(tokenizer_dir)
  loop.train(config, workdir, stages.stage("sft"), toy_context(config, tok, workdir))


if __name__ == "__main__":
  main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
