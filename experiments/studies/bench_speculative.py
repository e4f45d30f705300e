r"""Lossless draft-and-verify on a trained pair: exactness, acceptance, batch-1 speed, the 8B
roofline.

  python experiments/studies/bench_speculative.py --workdir=W --report_dir=docs/results/lossless
  python experiments/studies/bench_speculative.py --workdir=W --sections=speed --speed_users=16

W is a workdir of the Table 2 chain (read only): its data build (summary.json), the AR GR2 export
W/ar_rl/export (the verifier) and the Diffusion-GR2 export W/rl/export (the drafter), which must
come from the same data build (exports.check_same_build). Sections (--sections):

  grid      every (K, tau_d) of --ks x --taus decodes the whole --split (test_1615: all 1,615
            users) greedily at the evaluation's batch size (--batch_size) with
            speculative.speculative_generate, next to `generate`'s greedy decode of the same
            batches (the AR GR2 row's decode: its Reranker.answer). Exactness: rows identical
            token for token, the first divergences (emulate.first_divergence: token, logit
            margin), and R@1 / R@3 / N@3 / validity of both (evaluation.score on
            reranker.read_answers), which must be equal. Acceptance, from the same decodes:
            accepted drafted tokens per verify forward, tokens per verify forward and forwards
            (draft + verify, both prefills excluded) per token, over the whole response and by
            part: reasoning = the tokens up to and including `</think>`, answer = the rest. A
            verify step's forwards are shared evenly by the tokens it commits; the first token
            (the verifier's prefill) is left out.
  speed     batch 1, the first --speed_users users, one run: AR (`generate`), diffusion (the
            drafter's own block_diffusion_generate at --speed_diffusion_tau, the evaluation's
            step cap) and draft-and-verify at each --speed_specs K/tau_d; every call warm
            (compiled by one call first), the methods interleaved user by user, whole calls
            timed (prefill included): tokens/s, forwards per token, speed-up over AR.
  roofline  Qwen3-8B bf16 on one H100, batch 1, prompt 2,200 + 256
            (experiments/studies/roofline.py's shapes): the AR step, one drafter forward (a block of
            B after the cache, LM head at K queries) and one verify forward (K + 1 causal queries)
            of each --ks compiled by XLA's GPU compiler deviceless; bytes moved from memory_analysis
            (arguments + outputs not aliased), time = max(bytes / HBM bandwidth, analytic FLOPs /
            peak). Predicted speed-up for a 256-token response: AR = prefill + 256 t_AR;
            draft-and-verify = both prefills + 256 (draft forwards per token x t_draft + verify
            forwards per token x t_verify), forwards per token from this run's grid (or
            --grid_json).

Outputs (--report_dir, default a fresh directory): bench_speculative.json, bench_speculative.md,
acceptance.png (tokens per verify forward and forwards per token vs K, per tau_d and part).
"""

import json
import os
import sys
import tempfile
import time

import jax
import numpy as np
from absl import app, flags, logging

from experiments import emulate, export_reads, plan, roofline_steps, targets
from gr2jax import cli, exports, load
from gr2jax import recipe as recipe_lib
from gr2jax.data import pipeline, prompts
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import evaluation, prompt_io
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode
from gr2jax.diffusion import speculative as sp
from gr2jax.model import generate

FLAGS = flags.FLAGS
SECTIONS = ("grid", "speed", "roofline")
PARTS = ("all", "reasoning", "answer")
flags.DEFINE_string("workdir", None, "The Table 2 workdir W (read only).")
flags.DEFINE_string("drafter", None, "The drafter export (default W/rl/export).")
flags.DEFINE_string("verifier", None, "The verifier export (default W/ar_rl/export).")
cli.define_list("sections", list(SECTIONS), "Which parts to run.", cli.choice(SECTIONS))
flags.DEFINE_string("split", "test_1615", "The split decoded by the grid.")
flags.DEFINE_integer("limit", 0, "Users of the split (0 = all).", lower_bound=0)
flags.DEFINE_integer("batch_size", 256, "Decode batch of the grid (the evaluation's).",
                     lower_bound=1)
cli.define_list("ks", [4, 8, 16, 32], "K, tokens drafted per verify step (<= B).", cli.integer(1))
cli.define_list("taus", [0.0, 0.6, 0.9], "tau_d, the drafter's threshold (0 = one step).",
                cli.number(0, 1))
flags.DEFINE_integer("draft_steps", 64, "Denoising-step budget of one draft (the evaluation's "
                     "per-block cap: no cap for a draft of K <= 64).", lower_bound=1)
flags.DEFINE_integer("speed_users", 32, "Users timed at batch 1.", lower_bound=1)
cli.define_list("speed_specs", ["8/0", "8/0.9", "32/0.9"], "K/tau_d of the speed section.",
                cli.fields("/", K=cli.integer(1), TAU=cli.number(0, 1)))
cli.define("speed_diffusion_tau", 0.9, "tau of the diffusion decode in the speed section.",
           cli.number(0, 1, low_open=True))
flags.DEFINE_string("grid_json", None, "The roofline's forwards per token from this report "
                    "(default: this run's grid).")
flags.DEFINE_string("report_dir", None, "Where the outputs go (default: a fresh directory).")


# ---- inputs -----------------------------------------------------------------------------------


def check_flags() -> None:
  """What absl's parsing cannot check (each flag's own value it checks, naming the flag), before
  anything loads: one-line errors naming the flag."""
  if not FLAGS.workdir or not os.path.isfile(os.path.join(FLAGS.workdir, "summary.json")):
    raise app.UsageError(f"--workdir={FLAGS.workdir}: no summary.json (not a data build)")
  if FLAGS.grid_json and not os.path.isfile(FLAGS.grid_json):
    raise app.UsageError(f"--grid_json={FLAGS.grid_json} does not exist")


def load_pair():
  """(drafter Model, verifier Model, data, tokenizer, P, R, paths) of the workdir's pair."""
  w = FLAGS.workdir
  paths = {"drafter": FLAGS.drafter or os.path.join(w, "rl", "export"),
           "verifier": FLAGS.verifier or os.path.join(w, "ar_rl", "export")}
  for name, path in paths.items():
    if not os.path.isdir(path):
      raise app.UsageError(f"--{name}={path} does not exist (the {name}'s export)")
  exports.check_same_build(paths["drafter"], paths["verifier"])
  summary = pipeline.read_summary(w)
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  export_reads.check_build(paths["drafter"], summary, tok)  # the verifier's is the drafter's
  models = {}
  for name, path in paths.items():
    config, params = load.load_model(path)
    if config.vocab_size != len(tok):
      raise app.UsageError(f"--{name}={path}: vocab {config.vocab_size}, the workdir's "
                           f"tokenizer {len(tok)} (another data build)")
    models[name] = sp.Model(params, config)
  drafter, verifier = models["drafter"], models["verifier"]
  prompt_len, response_len = recipe_lib.lengths(summary)
  data = prompt_io.load_split(summary["paths"]["tfds"], FLAGS.split, tok, limit=FLAGS.limit)
  return drafter, verifier, data, tok, prompt_len, response_len, paths


# ---- grid: exactness and acceptance -----------------------------------------------------------


def part_stats(out: dict, think_end: int) -> dict:
  """Acceptance per response part (module doc) of a decode's SpecOutput fields (numpy).

  Returns:
    {part: {tokens, accepted, verify_forwards, draft_forwards, accepted_per_verify,
    tokens_per_verify, forwards_per_token}}, verify / draft forwards fractional (a step's shared
    evenly by its tokens).
  """
  sums = {p: np.zeros(4) for p in PARTS}  # tokens, accepted, verify, draft
  for b in range(len(out["lengths"])):
    n = int(out["lengths"][b])
    steps = out["token_step"][b, 1:n]
    if not len(steps):
      continue
    counts = np.bincount(steps)
    first = np.searchsorted(steps, np.arange(len(counts)))  # a step's first token (sorted)
    rank = np.arange(len(steps)) - first[steps]
    drafted = rank < out["step_accepted"][b, steps]
    share = 1.0 / counts[steps]
    tokens = out["tokens"][b, :n]
    ends = np.flatnonzero(tokens == think_end)
    reasoning = np.arange(1, n) <= (ends[0] if len(ends) else n)
    for part, where in (("all", np.ones_like(reasoning)), ("reasoning", reasoning),
                        ("answer", ~reasoning)):
      sums[part] += [where.sum(), (drafted & where).sum(), (share * where).sum(),
                     (share * out["step_draft_forwards"][b, steps] * where).sum()]
  stats = {}
  for part, (tokens, accepted, verify, draft) in sums.items():
    stats[part] = dict(tokens=int(tokens), accepted=int(accepted), verify_forwards=verify,
                       draft_forwards=draft,
                       accepted_per_verify=accepted / verify if verify else None,
                       tokens_per_verify=tokens / verify if verify else None,
                       forwards_per_token=(verify + draft) / tokens if tokens else None)
  return stats


def _score(tok, data, tokens, lengths) -> dict:
  """The ranking metrics and validity of decoded responses (reranker.read_answers, then
  evaluation.score)."""
  _, results = reranker_lib.read_answers(tok, tokens, lengths, data.labels[:len(tokens)])
  s = evaluation.score(results, data)
  return {k: s[k] for k in ("R@1", "R@3", "N@3", "valid_rate", "counts")}


def _batches(data, prompt_len, pad):
  for first in range(0, len(data), FLAGS.batch_size):
    chunk = data.encoded[first:first + FLAGS.batch_size]
    yield first, len(chunk), *prompt_io.prompt_arrays(chunk, FLAGS.batch_size, prompt_len, pad)


def run_grid(drafter, verifier, data, tok, prompt_len, response_len) -> dict:
  """The grid section (module doc)."""
  pad = verifier.config.pad_token_id
  think_end = tok.convert_tokens_to_ids(prompts.THINK_END)
  ar = reranker_lib.Reranker.of(policy_lib.make_policy(verifier.config, DecodeSpec(),
                                                       response_len),
                                verifier.params, tok, prompt_len)
  ar_tokens, ar_lengths, t0 = [], [], time.perf_counter()
  for first in range(0, len(data), FLAGS.batch_size):
    chunk = data.encoded[first:first + FLAGS.batch_size]
    out = ar.answer(chunk, data.labels[first:first + len(chunk)], rows=FLAGS.batch_size).decoded
    ar_tokens.append(out.tokens)
    ar_lengths.append(out.lengths)
  ar_tokens, ar_lengths = np.concatenate(ar_tokens), np.concatenate(ar_lengths)
  ar = dict(seconds=time.perf_counter() - t0, **_score(tok, data, ar_tokens, ar_lengths))
  print(f"[grid] AR: R@1 {ar['R@1']:.4f} valid {ar['valid_rate']:.4f} ({ar['seconds']:.0f} s)",
        flush=True)
  rows = []
  for k in map(int, FLAGS.ks):
    if k > drafter.config.block_size:
      raise app.UsageError(f"--ks: {k} exceeds the drafter's block size "
                           f"{drafter.config.block_size}")
    for tau in map(float, FLAGS.taus):
      spec = sp.DraftDecoding(max_new_tokens=response_len, k=k, draft_tau=tau,
                              draft_steps=FLAGS.draft_steps)
      fields, diverged, t0 = [], [], time.perf_counter()
      for first, n, tokens, lengths in _batches(data, prompt_len, pad):
        out = jax.device_get(sp.speculative_generate(drafter, verifier, tokens, lengths, spec))
        out = {f: np.asarray(getattr(out, f))[:n] for f in sp.SpecOutput._fields
               if getattr(out, f).ndim}
        fields.append(out)
        diverged += [dict(d, row=first + d["row"]) for d in emulate.first_divergence(
          verifier, tokens[:n], lengths[:n], out["tokens"], ar_tokens[first:first + n])]
      seconds = time.perf_counter() - t0
      out = {f: np.concatenate([x[f] for x in fields]) for f in fields[0]}
      same = (out["tokens"] == ar_tokens).all(axis=1) & (out["lengths"] == ar_lengths)
      row = dict(k=k, tau=tau, draft_steps=FLAGS.draft_steps, users=len(data),
                 identical_rows=int(same.sum()), divergences=diverged, seconds=seconds,
                 metrics=_score(tok, data, out["tokens"], out["lengths"]),
                 parts=part_stats(out, think_end),
                 drafted_per_step=float(out["step_drafted"].sum() / out["verify_forwards"].sum()),
                 acceptance_rate=float(out["accepted"].sum() / max(out["step_drafted"].sum(), 1)))
      row["metrics_equal_ar"] = all(row["metrics"][m] == ar[m] for m in
                                    ("R@1", "R@3", "N@3", "valid_rate"))
      rows.append(row)
      a = row["parts"]["all"]
      print(f"[grid] K={k} tau_d={tau:g}: identical {row['identical_rows']}/{len(data)}, "
            f"metrics equal {row['metrics_equal_ar']}; {a['accepted_per_verify']:.2f} accepted / "
            f"verify, {a['forwards_per_token']:.2f} forwards / token ({seconds:.0f} s)",
            flush=True)
  return {"ar": ar, "rows": rows}


# ---- speed ------------------------------------------------------------------------------------


def run_speed(drafter, verifier, data, prompt_len, response_len) -> dict:
  """The speed section (module doc)."""
  pad = verifier.config.pad_token_id
  users = data.encoded[:FLAGS.speed_users]

  def ar(tokens, lengths):
    out = generate.generate(verifier.params, verifier.config, tokens, lengths,
                            generate.ARDecoding(max_new_tokens=response_len))
    return out.lengths, np.full(1, int(out.nfe))

  def diffusion(tokens, lengths):
    out = decode.block_diffusion_generate(
      drafter.params, drafter.config, tokens, lengths, decode.BlockDecoding(
        threshold=FLAGS.speed_diffusion_tau, max_steps_per_block=64,
        max_new_tokens=response_len))
    return out.lengths, out.nfe

  def speculative(spec):
    def run(tokens, lengths):
      out = sp.speculative_generate(drafter, verifier, tokens, lengths, spec)
      return out.lengths, 2 + out.verify_forwards + out.draft_forwards  # + both prefills
    return run

  methods = [("AR", None, ar), (f"diffusion tau {FLAGS.speed_diffusion_tau:g}", None, diffusion)]
  for k, tau in FLAGS.speed_specs:
    spec = sp.DraftDecoding(max_new_tokens=response_len, k=k, draft_tau=tau,
                            draft_steps=FLAGS.draft_steps)
    methods.append((f"draft-and-verify K={k} tau_d={tau:g}", spec, speculative(spec)))
  totals = {name: [0.0, 0, 0] for name, _, _ in methods}  # seconds, tokens, forwards
  compile_s = {}
  for i, example in enumerate(users):
    tokens, lengths = prompt_io.prompt_arrays([example], 1, prompt_len, pad)
    for name, _, fn in methods:
      start = time.perf_counter()
      n, forwards = jax.block_until_ready(fn(tokens, lengths))
      seconds = time.perf_counter() - start
      if i == 0:  # the compiling call
        compile_s[name] = seconds
        start = time.perf_counter()
        n, forwards = jax.block_until_ready(fn(tokens, lengths))
        seconds = time.perf_counter() - start
        compile_s[name] -= seconds
      totals[name] = [totals[name][0] + seconds, totals[name][1] + int(n[0]),
                      totals[name][2] + int(forwards[0])]
  ar_rate = totals["AR"][1] / totals["AR"][0]
  rows = []
  for name, spec, _ in methods:
    seconds, n, forwards = totals[name]
    rows.append(dict(method=name, k=spec and spec.k, tau=spec and spec.draft_tau,
                     users=len(users), tokens=n, seconds=seconds, tokens_per_s=n / seconds,
                     forwards_per_token=forwards / n, speedup=n / seconds / ar_rate,
                     compile_s=compile_s[name]))
    print(f"[speed] {name}: {n / seconds:.0f} tok/s, {forwards / n:.2f} forwards/token, "
          f"{rows[-1]['speedup']:.2f}x", flush=True)
  return {"device": str(jax.devices()[0].device_kind), "rows": rows,
          "load_avg_1min": os.getloadavg()[0]}


# ---- roofline ---------------------------------------------------------------------------------


def run_roofline(grid_rows: list[dict]) -> dict:
  """The roofline section (module doc)."""
  target_name = "h100"
  s = plan.PRESETS["qwen3_8b"]
  target = targets.get_target(target_name)
  steps = {"ar": roofline_steps.compile_step("ar", s, target_name)[1]}
  for k in sorted({r["k"] for r in grid_rows}):
    for kind in ("draft", "verify"):
      steps[f"{kind}_k{k}"] = roofline_steps.compile_step(kind, s, target_name, k=k)[1]
    print(f"[roofline] K={k}: draft {steps[f'draft_k{k}']['bytes'] / 1e9:.2f} GB, verify "
          f"{steps[f'verify_k{k}']['bytes'] / 1e9:.2f} GB", flush=True)
  t = {name: roofline_steps.step_seconds(x, target) for name, x in steps.items()}
  prefill_s = roofline_steps.prefill_seconds(s, target)
  r = s.response_len
  _, ar_s = roofline_steps.decode_seconds({"ar": 1.0}, t, 1, prefill_s, r)
  rows = []
  for (k, tau), fpt in roofline_steps.speculative_forwards_per_token(grid_rows).items():
    per_token, total = roofline_steps.decode_seconds(
      {f"draft_k{k}": fpt["draft"], f"verify_k{k}": fpt["verify"]}, t, 2, prefill_s, r)
    rows.append(dict(k=k, tau=tau, verify_forwards_per_token=fpt["verify"],
                     draft_forwards_per_token=fpt["draft"], tok_s=r / total,
                     steady_tok_s=1 / per_token, speedup=ar_s / total))
  return {"target": target_name, "hbm_bytes_s": target.hbm_bytes_s,
          "peak_flops": target.peak_flops, "prompt_len": s.prompt_len, "response_len": r,
          "block_size": s.block_size, "steps": steps, "step_s": t, "prefill_s": prefill_s,
          "ar_tok_s": r / ar_s, "rows": rows, "versions": plan.versions()}


# ---- report -----------------------------------------------------------------------------------


def _f(x, fmt=".3f"):
  return "-" if x is None else format(x, fmt)


def markdown(result: dict) -> str:
  lines = [f"# Draft-and-verify: {result['drafter']} drafts, {result['verifier']} verifies", "",
           f"Command: `{result['command']}`", ""]
  grid = result.get("grid")
  if grid:
    ar = grid["ar"]
    lines += [f"AR (`generate`, greedy, batch {result['batch_size']}) on {result['split']}: "
              f"R@1 {ar['R@1']:.4f}, R@3 {ar['R@3']:.4f}, N@3 {ar['N@3']:.4f}, valid "
              f"{ar['valid_rate']:.4f}.", "",
              "| K | tau_d | rows identical to AR | R@1 | R@3 | N@3 | valid | = AR | accepted / "
              "verify (reasoning, answer) | tokens / verify | forwards / token (reasoning, "
              "answer) | drafted / step | acceptance | first divergence (row, token, margin) |",
              "|" + "---|" * 14]
    for r in grid["rows"]:
      m, p = r["metrics"], r["parts"]
      first = r["divergences"][0] if r["divergences"] else None
      where = "-" if first is None else (f"{first['row']}, {first['index']}, "
                                         f"{first['margin']:.2e}")

      def by_part(key, p=p):
        return (f"{_f(p['all'][key], '.2f')} ({_f(p['reasoning'][key], '.2f')}, "
                f"{_f(p['answer'][key], '.2f')})")

      lines.append(
        f"| {r['k']} | {r['tau']:g} | {r['identical_rows']}/{r['users']} | {m['R@1']:.4f} | "
        f"{m['R@3']:.4f} | {m['N@3']:.4f} | {m['valid_rate']:.4f} | "
        f"{'yes' if r['metrics_equal_ar'] else '**no**'} | {by_part('accepted_per_verify')} | "
        f"{_f(p['all']['tokens_per_verify'], '.2f')} | {by_part('forwards_per_token')} | "
        f"{r['drafted_per_step']:.2f} | {r['acceptance_rate']:.2f} | {where} |")
  speed = result.get("speed")
  if speed:
    lines += ["", f"Batch 1, {speed['rows'][0]['users']} users, one run on {speed['device']} "
                  "(whole calls, prefill included, warm):", "",
              "| method | tokens/s | forwards / token | speed-up over AR | compile s |",
              "|---|---|---|---|---|"]
    lines += [f"| {r['method']} | {r['tokens_per_s']:.0f} | {r['forwards_per_token']:.2f} | "
              f"{r['speedup']:.2f}x | {r['compile_s']:.1f} |" for r in speed["rows"]]
  roof = result.get("roofline")
  if roof:
    lines += ["", f"Qwen3-8B bf16 on one H100 (roofline: {roof['hbm_bytes_s'] / 1e12:.2f} TB/s, "
                  f"{roof['peak_flops'] / 1e12:.0f} TFLOP/s), batch 1, prompt "
                  f"{roof['prompt_len']:,} + {roof['response_len']}; forwards compiled by XLA's "
                  "GPU compiler:", "", "| forward | tokens | GB moved | GFLOP | time |",
              "|---|---|---|---|---|"]
    for name, x in roof["steps"].items():
      lines.append(f"| {name} | {x['tokens']} | {x['bytes'] / 1e9:.2f} | {x['flops'] / 1e9:,.0f} "
                   f"| {roof['step_s'][name] * 1e3:.2f} ms |")
    lines += ["", f"Predicted AR {roof['ar_tok_s']:.0f} tok/s (prefill "
                  f"{roof['prefill_s'] * 1e3:.0f} ms, twice for draft-and-verify).", "",
              "| K | tau_d | draft forwards / token | verify forwards / token | predicted tok/s "
              "(steady) | predicted speed-up |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['k']} | {r['tau']:g} | {r['draft_forwards_per_token']:.3f} | "
              f"{r['verify_forwards_per_token']:.3f} | {r['tok_s']:.0f} ({r['steady_tok_s']:.0f})"
              f" | {r['speedup']:.2f}x |" for r in roof["rows"]]
  return "\n".join(lines) + "\n"


def plot(grid: dict, path: str) -> None:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, axes = plt.subplots(1, 2, figsize=(10, 3.6))
  for tau in sorted({r["tau"] for r in grid["rows"]}):
    rows = sorted((r for r in grid["rows"] if r["tau"] == tau), key=lambda r: r["k"])
    for part, style in (("reasoning", "o-"), ("answer", "s--")):
      ks = [r["k"] for r in rows]
      axes[0].plot(ks, [r["parts"][part]["tokens_per_verify"] for r in rows], style,
                   label=f"tau_d={tau:g} {part}")
      axes[1].plot(ks, [r["parts"][part]["forwards_per_token"] for r in rows], style,
                   label=f"tau_d={tau:g} {part}")
  axes[0].set(xscale="log", xlabel="K", ylabel="tokens per verify forward")
  axes[1].set(xscale="log", xlabel="K", ylabel="forwards (draft + verify) per token")
  axes[1].axhline(1.0, color="gray", lw=0.5)
  ks = sorted({r["k"] for r in grid["rows"]})
  for ax in axes:
    ax.set_xticks(ks, [str(k) for k in ks])
    ax.minorticks_off()
    ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def in_workdir(path: str) -> str:
  """A path under --workdir as W/..., as the reports name it (W is the reader's workdir)."""
  rel = os.path.relpath(path, FLAGS.workdir)
  return path if rel.startswith("..") else os.path.join("W", rel)


def command_line() -> str:
  """This run's command with --workdir=W and the paths under it as W/...."""
  args = [a.replace(os.path.abspath(FLAGS.workdir), "W").replace(FLAGS.workdir.rstrip("/"), "W")
          for a in sys.argv[1:]]
  return " ".join(["python", "experiments/studies/bench_speculative.py"] + args)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  check_flags()
  report_dir = FLAGS.report_dir or tempfile.mkdtemp(prefix="bench_speculative-")
  os.makedirs(report_dir, exist_ok=True)
  drafter, verifier, data, tok, prompt_len, response_len, paths = load_pair()
  result = dict(command=command_line(), drafter=in_workdir(paths["drafter"]),
                verifier=in_workdir(paths["verifier"]), split=FLAGS.split,
                users=len(data), batch_size=FLAGS.batch_size, prompt_len=prompt_len,
                response_len=response_len, block_size=drafter.config.block_size)

  def save():
    with open(os.path.join(report_dir, "bench_speculative.json"), "w") as f:
      json.dump(result, f, indent=1, default=float)
    with open(os.path.join(report_dir, "bench_speculative.md"), "w") as f:
      f.write(markdown(result))

  if "grid" in FLAGS.sections:
    result["grid"] = run_grid(drafter, verifier, data, tok, prompt_len, response_len)
    plot(result["grid"], os.path.join(report_dir, "acceptance.png"))
    save()
  if "speed" in FLAGS.sections:
    result["speed"] = run_speed(drafter, verifier, data, prompt_len, response_len)
    save()
  if "roofline" in FLAGS.sections:
    grid = result.get("grid") or json.load(open(FLAGS.grid_json or os.path.join(
      report_dir, "bench_speculative.json")))["grid"]
    result["roofline"] = run_roofline(grid["rows"])
    save()
  print(markdown(result))
  print(f"[bench_speculative] wrote {report_dir}")


if __name__ == "__main__":
  cli.run(main)
