r"""A roofline Table 3 at paper scale: Qwen3-8B decoding on one H100 at batch 1, predicted.

  python experiments/studies/roofline.py --out=docs/roofline_table3.json      (~2 H100 compiles)

A prediction, not a measurement (scripts/gpu_check.sh measures on a lent GPU). The two decoders'
steps are compiled for one H100 by XLA's GPU compiler without hardware (experiments/targets.py,
experiments/roofline_steps.py compile_step): the AR step (one token after the cache:
`generate.decode`'s loop body) and the block-diffusion step (one block of B = 32 after the cache:
`diffusion.decode.block_forward`, the denoising and commit forward), at batch 1 with the static
cache of the paper's 2,200-token prompt + 256 new tokens, bf16. Per step:

  bytes   from the compiled program's memory_analysis: arguments (the weights and the whole KV
          cache buffer, each read once: the attention scores every slot) + outputs not aliased
          (logits; the donated cache's writes are in place).
  FLOPs   analytic (plan.forward_flops; the GPU compiler has no cost analysis).
  time    max(bytes / 3.35 TB/s, FLOPs / 989 TFLOP/s): the H100 SXM roofline.

Forwards per output token are the trained tiny Diffusion-GR2's, read from results/table3.json
(not re-measured): (mean forwards - the prefill) / mean response length at each tau under the
recipe's own commit order (the table's commit_order), and the same for its AR GR2 row. The
prediction for a 256-token response after the 2,200-token prompt: AR tok/s = 256 / (prefill +
256 x f_AR x t_AR), diffusion the same with f_tau x t_block; the prefill is a roofline of its
analytic FLOPs and the weights. Printed next to the paper's AR
71 tok/s and 2.4x / 3.3x / 3.5x (Diffusion-GR2, arXiv 2607.01170), with the paper's AR as a fraction
of the predicted roofline.
"""

import json
import os

from absl import flags

from experiments import plan, roofline_steps, targets
from gr2jax import cli
from gr2jax.apps.tables import PAPER_TABLE3
from gr2jax.model import params as params_lib

FLAGS = flags.FLAGS
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def define_flags() -> None:
  flags.DEFINE_string("out", os.path.join(REPO, "docs", "roofline_table3.json"), "JSON output.")
  flags.DEFINE_string("table3", os.path.join(REPO, "results", "table3.json"),
                      "The tiny Table 3 whose forwards per token the prediction uses.")
  flags.DEFINE_enum("target", "h100", ["h100", "h200"], "The GPU of the roofline.")


def predict(steps: dict, fpt: dict, s: plan.Shapes, target: targets.Target) -> dict:
  """The roofline times and the predicted tok/s and speed-ups (module docstring)."""
  prefill_s = roofline_steps.prefill_seconds(s, target)
  t = {kind: roofline_steps.step_seconds(x, target) for kind, x in steps.items()}
  r = s.response_len
  ar_per_token, ar_s = roofline_steps.decode_seconds({"ar": fpt[None]}, t, 1, prefill_s, r)
  rows = [{"row": "AR", "tau": None, "forwards_per_token": fpt[None], "step_s": t["ar"],
           "tok_s": r / ar_s, "steady_tok_s": 1 / ar_per_token, "speedup": 1.0,
           "paper_tok_s": PAPER_TABLE3[None][1], "paper_speedup": 1.0}]
  for tau in sorted((k for k in fpt if k is not None), reverse=True):
    per_token, total = roofline_steps.decode_seconds({"block": fpt[tau]}, t, 1, prefill_s, r)
    paper = PAPER_TABLE3.get(tau)
    rows.append({"row": "Diffusion-GR2", "tau": tau, "forwards_per_token": fpt[tau],
                 "step_s": t["block"], "tok_s": r / total, "steady_tok_s": 1 / per_token,
                 "speedup": ar_s / total, "paper_tok_s": paper[1] if paper else None,
                 "paper_speedup": paper[2] if paper else None})
  return {"prefill_s": prefill_s, "prefill_flops": roofline_steps.prefill_flops(s), "rows": rows,
          "paper_ar_fraction_of_roofline": PAPER_TABLE3[None][1] / rows[0]["tok_s"]}


def markdown(out: dict) -> str:
  steps = out["steps"]
  lines = [f"Prediction (roofline of {out['device_kind']}: {out['hbm_bytes_s'] / 1e12:.2f} TB/s, "
           f"{out['peak_flops'] / 1e12:.0f} TFLOP/s), Qwen3-8B bf16, batch 1, prompt "
           f"{out['prompt_len']:,} + {out['response_len']} new tokens; steps compiled by XLA's "
           f"GPU compiler ({', '.join(f'{k} {v}' for k, v in out['versions'].items())}).", "",
           "| step | tokens per forward | GB moved (args + outputs) | GFLOP | time at the roofline "
           "| bound |", "|---|---|---|---|---|---|"]
  for kind, x in steps.items():
    t_mem, t_flop = x["bytes"] / out["hbm_bytes_s"], x["flops"] / out["peak_flops"]
    lines.append(f"| {kind} | {x['tokens']} | {x['bytes'] / 1e9:.2f} | {x['flops'] / 1e9:,.0f} | "
                 f"{max(t_mem, t_flop) * 1e3:.2f} ms | "
                 f"{'memory' if t_mem >= t_flop else 'compute'} |")
  lines.append(f"| prefill ({out['prompt_len']:,} tokens, analytic) | {out['prompt_len']} | "
               f"{out['weights_bytes'] / 1e9:.2f} (weights) | "
               f"{out['prediction']['prefill_flops'] / 1e9:,.0f} | "
               f"{out['prediction']['prefill_s'] * 1e3:.1f} ms | compute |")
  lines += ["", "| row | tau | forwards per output token (tiny, results/table3.json) | predicted "
                "tok/s (steady, no prefill) | predicted speed-up | paper tok/s | paper speed-up |",
            "|---|---|---|---|---|---|---|"]
  for r in out["prediction"]["rows"]:
    tau = "-" if r["tau"] is None else f"{r['tau']:g}"
    paper_tok = "-" if r["paper_tok_s"] is None else f"{r['paper_tok_s']}"
    paper_x = "-" if r["paper_speedup"] is None else f"{r['paper_speedup']:g}x"
    lines.append(f"| {r['row']} | {tau} | {r['forwards_per_token']:.3f} | {r['tok_s']:.0f} "
                 f"({r['steady_tok_s']:.0f}) | {r['speedup']:.2f}x | {paper_tok} | {paper_x} |")
  fraction = out["prediction"]["paper_ar_fraction_of_roofline"]
  lines += ["", f"The paper's AR 71 tok/s is {fraction:.0%} of the predicted AR roofline."]
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  plan.use_host_devices(1)
  s = plan.PRESETS["qwen3_8b"]
  target = targets.get_target(FLAGS.target)
  with open(FLAGS.table3) as f:
    fpt = roofline_steps.forwards_per_token(json.load(f))
  steps = {}
  for kind in ("ar", "block"):
    _, steps[kind] = roofline_steps.compile_step(kind, s, FLAGS.target)
    print(f"[roofline] {kind}: {steps[kind]['bytes'] / 1e9:.2f} GB, compile "
          f"{steps[kind]['compile_s']:.0f} s", flush=True)
  out = {"target": FLAGS.target, "device_kind": targets.devices(target, "1x1x1")[0].device_kind,
         "hbm_bytes_s": target.hbm_bytes_s, "peak_flops": target.peak_flops,
         "prompt_len": s.prompt_len, "response_len": s.response_len, "block_size": s.block_size,
         "weights_bytes": params_lib.param_count(s.model) * 2, "versions": plan.versions(),
         "table3": os.path.relpath(FLAGS.table3, REPO), "steps": steps,
         "prediction": predict(steps, fpt, s, target)}
  out["markdown"] = markdown(out)
  with open(FLAGS.out, "w") as f:
    json.dump(out, f, indent=1, default=float)
  print(json.dumps(out["prediction"], indent=1, default=float))
  print(out["markdown"])


if __name__ == "__main__":
  define_flags()
  cli.run(main)
