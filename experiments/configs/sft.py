"""AR GR2 SFT (research/papers.md §1.4): the decoupled lambda_r / lambda_o loss.

  python experiments/run.py --config=sft.py --workdir=workdir
  python experiments/run.py --config=sft.py:qwen3_8b --workdir=W --config.init=ckpt/qwen3_8b

Tiny (default): a fresh `tiny` model sized to the project tokenizer. `:qwen3_8b`: from a converted
checkpoint (weights_conversion/convert_hf.py --add_tokens), the paper's prompt, bf16, remat.
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import get_common_config, use_qwen3_8b_model  # noqa: E402


def get_config(variant: str = ""):
  c = get_common_config("sft")
  c.train.steps = 1200  # ~38k examples (4 epochs of the 9,199 accepted traces), terse prompt
  c.train.batch_size = 32
  c.train.save_every = 200
  c.optimizer.learning_rate = 2e-3  # docs/calibration_tiny_prompt.md
  c.optimizer.warmup_steps = 100
  if variant == "qwen3_8b":
    c.init = "ckpt/qwen3_8b"  # convert_hf.py output with the project's tokens added
    c.data.prompt.style = "chat"
    c.data.prompt.answer_format = "sid"
    c.data.prompt.evidence = "raw"
    c.data.prompt.fields = ("sid", "brand", "leaf", "title")
    c.data.prompt.history_items = 20
    c.data.prompt.max_citations = 3
    use_qwen3_8b_model(c)
    c.train.batch_size = 32
    c.train.micro_batches = 1  # one row per device fits 80 GB (docs/plan_qwen3_8b.md)
    c.train.steps = 900  # ~3 epochs of 9.2k accepted traces at batch 32
    c.optimizer.learning_rate = 1e-5
    c.optimizer.warmup_steps = 30
  elif variant:
    raise ValueError(f"sft.py: unknown variant {variant!r}; expected '' or 'qwen3_8b'")
  return c
