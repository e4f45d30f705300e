"""Evaluate any checkpoint, AR or diffusion, on a split: R@1/R@3/N@3, validity, NFE, tokens/s.

  python experiments/run.py --config=eval.py --workdir=W --config.evaluate.ckpt=W/sft/export
  python experiments/run.py --config=eval.py --config.evaluate.ckpt=... \
      --config.decode.eval_tau=0.9 --config.eval.split=test --config.eval.limit=500

  python experiments/run.py --config=eval.py --config.evaluate.ckpt=W/ar_rl/export \
      --config.evaluate.convert=True   (naive Diffusion-GR2: the AR model converted, untrained)

The data build, eval split and decode spec are the recipe's (the variant, as for training).
Writes <evaluate.out_dir or ckpt>/eval_<split>_tau<tau>[_B<B>].{json,jsonl} (per-example rows a
person can read: user, response text, validity kind, ranking, target rank).
"""

from gr2jax import recipes


def get_config(variant: str = ""):
  return recipes.config(variant, "eval")
