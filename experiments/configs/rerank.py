"""Re-ranking as a tool (gr2jax/rerank.py): a JSONL of requests -> rankings + reasoning.

  python experiments/run.py --config=rerank.py --workdir=W --config.rerank.ckpt=W/rl/export \
      --config.rerank.requests=req.jsonl --config.rerank.out=out.jsonl

A request line: {"id": ..., "history": [item, ...] oldest first, "candidates": [item, ...] in D's
order}; items are catalogue indices or ASINs. `data` must be the data build the model was trained
with (same overrides as its training run; it is reused from W's cache).
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from data import get_data_config  # noqa: E402


def get_config():
  c = ml_collections.ConfigDict()
  c.stage = "rerank"  # experiments/run.py STAGES key
  c.data = get_data_config()  # the data build (prompt, tokenizer, evidence thresholds, SIDs)
  c.rerank = ml_collections.ConfigDict()
  c.rerank.ckpt = os.path.join("{workdir}", "rl", "export")  # the model export (AR or diffusion)
  c.rerank.requests = ""  # JSONL of requests (required)
  c.rerank.out = ""  # output JSONL ('' = <requests>.ranked.jsonl)
  c.rerank.items_file = ""  # a user-supplied items.jsonl ('' = the data build's catalogue)
  c.rerank.batch_size = 64  # decode batch size (one compiled shape)
  c.rerank.tau = 1.0  # diffusion commit threshold (ignored for AR models)
  c.rerank.max_steps_per_block = 64  # diffusion denoising-step cap per block (paper: 64)
  c.rerank.max_new_tokens = 0  # response cap (0 = the build's longest training response)
  return c
