"""Re-ranking as a tool (gr2jax/rerank.py): a JSONL of requests -> rankings + reasoning.

  python experiments/run.py --config=rerank.py --workdir=W --config.rerank.ckpt=W/rl/export \
      --config.rerank.requests=req.jsonl --config.rerank.out=out.jsonl

A request line: {"id": ..., "history": [item, ...] oldest first, "candidates": [item, ...] in D's
order}; items are catalogue indices or ASINs. The data build (prompt, tokenizer, evidence
thresholds, SIDs) and the decode spec are the recipe's: pass the variant and overrides of the
model's training run (its data build is reused from W's cache).
"""

import os
import sys

import ml_collections

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from recipe import get_recipe  # noqa: E402


def get_config(variant: str = ""):
  c = get_recipe("rerank", variant)
  c.rerank = ml_collections.ConfigDict()
  c.rerank.ckpt = os.path.join("{workdir}", "rl", "export")  # the model export (AR or diffusion)
  c.rerank.requests = ""  # JSONL of requests (required)
  c.rerank.out = ""  # output JSONL ('' = <requests>.ranked.jsonl)
  c.rerank.items_file = ""  # a user-supplied items.jsonl ('' = the data build's catalogue)
  c.rerank.batch_size = 64  # decode batch size (one compiled shape)
  c.rerank.max_new_tokens = 0  # response cap (0 = the build's response length R)
  return c
