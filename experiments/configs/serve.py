"""Re-ranking as a service (gr2jax/apps/serve/server.py): an HTTP server over a trained re-ranker.

  python experiments/run.py --config=serve.py --workdir=W --config.serve.ckpt=W/rl/export \
      --config.serve.port=8000

The data build (prompt, tokenizer, evidence thresholds, SIDs) and the decode spec are the
recipe's, as for the offline tool (rerank.py): pass the variant and overrides of the model's
training run (its data build is reused from W's cache). Every (batch bucket x prompt length)
program is compiled before /healthz reports ready, with JAX's persistent compilation cache in W.
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "serve")
