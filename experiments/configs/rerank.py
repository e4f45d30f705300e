"""Re-ranking as a tool (gr2jax/apps/rerank.py): a JSONL of requests -> rankings + reasoning.

  python experiments/run.py --config=rerank.py --workdir=W --config.rerank.ckpt=W/rl/export \
      --config.rerank.requests=req.jsonl --config.rerank.out=out.jsonl

A request line: {"id": ..., "history": [item, ...] oldest first, "candidates": [item, ...] in D's
order}; items are catalogue indices or ASINs. The data build (prompt, tokenizer, evidence
thresholds, SIDs) and the decode spec are the recipe's: pass the variant and overrides of the
model's training run (its data build is reused from W's cache).
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "rerank")
