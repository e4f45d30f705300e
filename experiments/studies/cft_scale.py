r"""CFT validity vs model size at one fixed budget: the curve, JSON + PNG.

Each point is a chain workdir W of the tiny recipe with another model preset and the same step
counts for every size (README of docs/results/benchmarks/cft_validity, "Validity vs model size"):

  python experiments/run.py --config=cft.py --workdir=W --config.upstream=run \
      --config.model.preset=PRESET --config.data.sids_file=results/sids_table2.npy \
      --config.stages.sft.train.steps=300 --config.stages.ar_rl.train.steps=1 \
      --config.stages.cft.train.steps=300
  python experiments/studies/cft_validity.py --workdir=W --ckpt=W/cft/export \
      --specs=0.9:confidence:32 \
      --out=W/tau09.json
  python experiments/studies/cft_scale.py --points=W1,W2,W3 \
      --scale_dir=docs/results/benchmarks/cft_validity/scale

A point reads (W is read only): W/cft/export's model config (parameter count, layers, width),
W/cft/eval_final.json (the CFT stage's own evaluation: tau = the recipe's eval_tau, 1.0),
W/tau09.json (cft_validity.py at tau 0.9; `W@PATH` names another file), the steps of each stage
(its eval_final.json) and their wall times (done.json). Points with the same step counts form
one budget; per budget and tau the rise is fit as log(1 - valid) = a + b log(params) (b < 0:
the invalid rate falls as params^b) and reported with the change of the valid rate per doubling.
Writes scale.json (points + fits) and scale.png (valid rate vs parameters, one line per tau).
"""

import json
import math
import os

import numpy as np
from absl import app, flags

from gr2jax import cli, exports
from gr2jax.model import params as params_lib

FLAGS = flags.FLAGS
flags.DEFINE_list("points", None, "Chain workdirs W or W@TAU09_JSON (module docstring).")
flags.DEFINE_string("scale_dir", None, "Where scale.json and scale.png go.")

STAGES = ("sft", "ar_rl", "cft")
GOAL = 0.98  # the valid-rate goal at tau 1.0 and 0.9


def _json(path: str):
  if not os.path.isfile(path):
    raise FileNotFoundError(f"{path}: missing (did the chain / the tau 0.9 decode finish?)")
  return json.load(open(path))


def read_point(spec: str) -> dict:
  """One chain workdir's point (module docstring)."""
  workdir, _, tau09 = spec.partition("@")
  tau09 = tau09 or os.path.join(workdir, "tau09.json")
  config = exports.load_config(os.path.join(workdir, "cft", "export"))
  evals = {s: _json(os.path.join(workdir, s, "eval_final.json")) for s in STAGES}
  cft, (t09,) = evals["cft"], _json(tau09)
  if t09["tau"] != 0.9:
    raise ValueError(f"{tau09}: a decode at tau {t09['tau']}, expected 0.9")
  return dict(
    workdir=workdir, params=params_lib.param_count(config), layers=config.num_layers,
    hidden=config.hidden_size,
    steps={s: evals[s]["step"] for s in STAGES},
    train_seconds={s: _json(os.path.join(workdir, s, "done.json"))["seconds"] for s in STAGES},
    ar_valid=evals["ar_rl"]["valid_rate"], ar_R1=evals["ar_rl"]["R@1"],
    taus={"1.0": dict(valid=cft["valid_rate"], duplicate=cft["counts"]["duplicate"],
                      out_of_set=cft["counts"]["out_of_set"], R1=cft["R@1"],
                      nfe_per_token=cft["nfe_per_token"], seconds=cft["seconds"]),
          "0.9": dict(valid=t09["valid_rate"], duplicate=t09["duplicate"],
                      out_of_set=t09["out_of_set"], R1=t09["R1"],
                      nfe_per_token=t09["nfe_per_token"], seconds=t09["seconds"])})


def rise(params: list[int], valid: list[float]) -> dict:
  """The fit log(1 - valid) = a + b log(params) over >= 2 sizes: the exponent b, the valid rate's
  change per doubling of params at the largest size, and the params where the fit reaches GOAL
  (an extrapolation; None when the invalid rate does not fall)."""
  if len(params) < 2 or len(set(params)) < 2:
    raise ValueError(f"a fit needs >= 2 distinct sizes, got params={params}")
  x = np.log(np.asarray(params, float))
  y = np.log(np.clip(1.0 - np.asarray(valid, float), 1e-6, None))
  b, a = np.polyfit(x, y, 1)
  top = x.max()
  per_doubling = math.exp(a + b * top) - math.exp(a + b * (top + math.log(2.0)))
  goal = math.exp((math.log(1.0 - GOAL) - a) / b) if b < 0 else None
  return dict(exponent=float(b), valid_gain_per_doubling=float(per_doubling),
              params_for_goal=goal)


def by_budget(points: list[dict]) -> list[tuple[dict, list[dict]]]:
  """[(budget {stage: steps}, its points by params)], the budgets in order."""
  budgets = sorted({tuple(sorted(p["steps"].items())) for p in points})
  return [(dict(budget), sorted((p for p in points if tuple(sorted(p["steps"].items())) == budget),
                                key=lambda p: p["params"])) for budget in budgets]


def fits(points: list[dict]) -> list[dict]:
  """One rise() per budget (the same steps per stage) and tau, over that budget's sizes."""
  out = []
  for budget, group in by_budget(points):
    for tau in ("1.0", "0.9"):
      fit = (rise([p["params"] for p in group], [p["taus"][tau]["valid"] for p in group])
             if len({p["params"] for p in group}) > 1 else None)
      out.append(dict(steps=budget, tau=tau, sizes=len(group), fit=fit))
  return out


def plot(points: list[dict], path: str) -> None:
  """Valid rate vs parameters (log x), one line per (budget, tau); the goal as a line."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(5.2, 3.6))
  for budget, group in by_budget(points):
    label = "/".join(str(budget[s]) for s in STAGES)
    for tau, style in (("1.0", "o-"), ("0.9", "s--")):
      ax.plot([p["params"] for p in group], [p["taus"][tau]["valid"] for p in group], style,
              label=f"tau {tau}, steps {label}")
      for p in group:
        ax.annotate(f"L{p['layers']} D{p['hidden']}", (p["params"], p["taus"][tau]["valid"]),
                    fontsize=6, textcoords="offset points", xytext=(3, 3))
  ax.axhline(GOAL, color="gray", lw=0.6, ls=":")
  ax.set(xscale="log", xlabel="parameters", ylabel="valid rate (no constraint, 1,615 users)",
         title="CFT validity vs model size (sft/ar_rl/cft steps)")
  ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def main(argv):
  del argv
  for name in ("points", "scale_dir"):  # checked here: a validator at import would fire in
    if not getattr(FLAGS, name):        # every other script's flag parsing of the test process
      raise app.UsageError(f"--{name} is required (module docstring)")
  points = [read_point(s) for s in FLAGS.points]
  result = dict(points=points, fits=fits(points), goal=GOAL)
  os.makedirs(FLAGS.scale_dir, exist_ok=True)
  with open(os.path.join(FLAGS.scale_dir, "scale.json"), "w") as f:
    json.dump(result, f, indent=1)
  plot(points, os.path.join(FLAGS.scale_dir, "scale.png"))
  print("| params | L | D | steps sft/ar_rl/cft | AR valid | tau | valid | dup | oos | R@1 | "
        "NFE/tok | eval s | CFT train s |\n|" + "---|" * 13)
  for p in points:
    steps = "/".join(str(p["steps"][s]) for s in STAGES)
    for tau, t in p["taus"].items():
      print(f"| {p['params']:,} | {p['layers']} | {p['hidden']} | {steps} | {p['ar_valid']:.3f} "
            f"| {tau} | {t['valid']:.3f} | {t['duplicate']} | {t['out_of_set']} | {t['R1']:.4f} "
            f"| {t['nfe_per_token']:.2f} | {t['seconds']:.0f} | {p['train_seconds']['cft']:.0f} |")
  print(json.dumps(result["fits"], indent=1))


if __name__ == "__main__":
  cli.run(main)
