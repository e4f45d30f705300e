r"""Batch-1 speed-up of block diffusion over AR on big random models, replaying a trained
Diffusion-GR2's commit schedule step for step (an emulation of the trained model's decode).

  # 1. record the trained tiny model's schedules (real prompts; writes --schedules)
  python experiments/studies/bench_speedup.py --record_ckpt=W/rl/export --record_workdir=W \
      --schedules=docs/results/benchmarks/speedup/schedules.json --runs=
  # 2. replay them on random weights of Qwen3 shapes (writes --report_dir)
  python experiments/studies/bench_speedup.py \
      --schedules=docs/results/benchmarks/speedup/schedules.json \
      --report_dir=docs/results/benchmarks/speedup
  # draft-and-verify too: record with the AR verifier, replay as above
  python experiments/studies/bench_speedup.py --record_ckpt=W/rl/export \
      --record_verifier=W/ar_rl/export \
      --record_workdir=W --schedules=docs/results/lossless/schedules.json --runs=

Recording: the trained diffusion checkpoint decodes the first --record_users prompts of
test_1615 (one batch, greedy, the eval's step cap) at every tau of --taus and block size of
--block_sizes (the checkpoint's weights under each B; it was trained at its own B). Each row's
schedule = the tokens committed at each of its denoising steps (emulate.schedule_from_trace).
Per (tau, B) the JSON keeps the valid rate, forwards / denoising steps per token and the
schedule of one representative user: among the rows of the most common output length L, the
one with the median forward count.

Draft-and-verify (--record_verifier, the AR export verifying the --record_ckpt drafter,
gr2jax/diffusion/speculative.py): the same prompts decoded greedily at each K of --spec_ks and
tau_d of --spec_taus (draft step cap 64, the drafter's block size); its output is the verifier's,
so one length L_s (the most common) serves every entry; each row's schedule = per verify step
(denoising steps of its draft, drafts accepted) (emulate.schedule_from_output), and the
representative user is the row of length L_s with the median forwards (draft + verify).

Replay (experiments/emulate.py `timed_replay`, which batch_curve.py's cpu section runs too): for
each --runs entry (shape/dtype) and prompt length of --prompt_lengths, random weights and a random
prompt [1, P] are prefilled once; then, timed with the prefill excluded
(the paper's decode tok/s):
  - AR: `generate.decode` writes L tokens (L - 1 one-token forwards after the prefill), once per
    length L of the entries;
  - diffusion at each (tau, B): `emulate.replay(schedule, prefilled=)` (the decoder's loop) with
    max_new_tokens = L and no stop token commits exactly the recorded number of tokens at each
    step, so it runs the recorded number of forwards (the LM head at all B queries with the
    default --head_buckets=1, as the evaluation decodes). Which positions commit differs (random
    weights), what a forward costs does not.
  - draft-and-verify at each (K, tau_d): `emulate.speculative_replay(prefilled=)` with the
    same random weights as drafter (at the trained block size, a mask token) and verifier runs
    the recorded drafter forwards and verify forwards and accepts the recorded drafts (its
    prefills, one per model, excluded like AR's); its speed-up is over AR at its own length.
Each configuration is compiled by a warm-up call, then --repeats rounds time every configuration
once per round (AR and diffusion interleaved, so load on the shared machine hits both), and the
fastest round of each is kept. Reported: tokens/s, forwards, the per-forward cost ratio
(diffusion seconds per forward over AR's) and speed-up = diffusion tokens/s over AR's.

The same run checks the AR path against transformers at batch 1 on the tiny preset
(--hf_check; experiments/bench_decode.py's functions and flags: prompt 256, --new_tokens).
--merge=DIR1,DIR2,... replays nothing and writes the outputs of several runs' reports as one.
Every flag is checked first (a tau / B / K with no recorded schedule, --repeats < 1: one line
naming the flag and the allowed values). Outputs (--report_dir, default a fresh directory):
bench_speedup.{json,md}, speedup_vs_size.png.
"""

import dataclasses
import json
import os
import tempfile

import jax
import numpy as np
from absl import app, flags, logging

from experiments import (
  bench_decode,  # its flags: --new_tokens, --torch_threads, --dtype
  emulate,
  export_reads,
)
from gr2jax import cli, exports, load
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import prompt_io
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.diffusion import decode
from gr2jax.diffusion import speculative as sp

FLAGS = flags.FLAGS


def define_flags() -> None:
  """The command line's flags: the replay flags (experiments/emulate.py define_replay_flags, shared
  with batch_curve.py) and the recording's, the report's and the merge's."""
  emulate.define_replay_flags()
  flags.adopt_module_key_flags(emulate)
  flags.DEFINE_string("record_ckpt", None, "A trained diffusion export: record its schedules.")
  flags.DEFINE_string("record_workdir", None, "The data build (workdir) the checkpoint's prompts "
                      "come from (read only: its summary.json paths).")
  flags.DEFINE_integer("record_users", 256, "test_1615 prompts decoded per (tau, B).",
                       lower_bound=1)
  flags.DEFINE_string("report_dir", None, "JSON, table and plot (default: a fresh directory).")
  flags.DEFINE_string("record_verifier", None, "An AR export: also record draft-and-verify "
                      "schedules with it verifying --record_ckpt.")
  flags.DEFINE_bool("hf_check", True, "Also time AR vs transformers generate (tiny, batch 1).")
  flags.DEFINE_list("merge", [], "Replay nothing: merge these report dirs' bench_speedup.json "
                    "(one schedules file, no configuration twice) into --report_dir's table, "
                    "best-block lines and plot (each row keeps its source dir).")


# ---- record -----------------------------------------------------------------------------------


def record_schedules() -> dict:
  """Decodes real prompts with the trained checkpoint at every (tau, B); the module doc."""
  summary_file = os.path.join(FLAGS.record_workdir, "summary.json")
  if not os.path.exists(summary_file):
    raise app.UsageError(f"--record_workdir: {summary_file} does not exist (no data build)")
  summary = pipeline.read_summary(FLAGS.record_workdir)
  paths = summary["paths"]
  tok = tokenizer_lib.load_tokenizer(paths["tokenizer"])
  export_reads.check_build(FLAGS.record_ckpt, summary, tok)  # eval.py's check, before loading
  config, params = load.load_model(FLAGS.record_ckpt)
  if config.mask_token_id is None:
    raise app.UsageError(f"--record_ckpt={FLAGS.record_ckpt} is not a diffusion model")
  data = prompt_io.load_split(paths["tfds"], "test_1615", tok, limit=FLAGS.record_users)
  prompt_len, response_len = lengths_lib.static_lengths(summary)
  prompts, lengths = prompt_io.prompt_arrays(data.encoded, len(data), prompt_len,
                                             config.pad_token_id)
  in_workdir = lambda path: os.path.join("W", os.path.relpath(path, FLAGS.record_workdir))
  out = {"ckpt": in_workdir(FLAGS.record_ckpt), "trained_block_size": config.block_size,
         "users": len(data), "max_new_tokens": response_len, "entries": []}
  decodes = []
  for b in map(int, FLAGS.block_sizes):
    cfg = dataclasses.replace(config, block_size=b)
    for tau in map(float, FLAGS.taus):
      res = decode.block_diffusion_generate(params, cfg, prompts, lengths, decode.BlockDecoding(
        threshold=tau, max_steps_per_block=64, max_new_tokens=response_len))
      n, forwards = np.asarray(res.lengths), np.asarray(res.nfe) - 1  # prefill excluded
      _, results = reranker_lib.read_answers(tok, np.asarray(res.tokens), n, data.labels)
      valid = np.mean([r.kind == "valid" for r in results])
      entry = dict(tau=tau, block=b, valid_rate=float(valid),
                   tokens_per_forward=float(n.sum() / forwards.sum()),
                   nfe_per_token=float((forwards.sum() + len(n)) / n.sum()),
                   paper_nfe_per_token=float(np.asarray(res.denoise_steps).sum() / n.sum()),
                   mean_length=float(n.mean()))
      decodes.append((n, forwards, emulate.schedule_from_trace(res.commit_step, n, b), entry))
  # One output length L for every replay: the most common over all decodes.
  length = int(np.bincount(np.concatenate([d[0] for d in decodes])).argmax())
  for n, forwards, rows, entry in decodes:
    same = np.flatnonzero(n == length)
    if not len(same):
      raise ValueError(f"record: no user of B={entry['block']} tau={entry['tau']} has the "
                       f"common length {length}")
    pick = int(same[np.argsort(forwards[same], kind="stable")[(len(same) - 1) // 2]])
    entry.update(length=length, users_of_length=len(same), user=int(data.users[pick]),
                 forwards=int(forwards[pick]), schedule=rows[pick])
    out["entries"].append(entry)
    print(f"[record] B={entry['block']} tau={entry['tau']}: valid {entry['valid_rate']:.3f}, "
          f"{entry['tokens_per_forward']:.2f} tokens/forward; user {entry['user']}: L={length} "
          f"in {entry['forwards']} forwards", flush=True)
  if FLAGS.record_verifier:
    out["verifier"] = in_workdir(FLAGS.record_verifier)
    out["spec_entries"] = record_spec_schedules(sp.Model(params, config), prompts, lengths,
                                                response_len, data)
  return out


def record_spec_schedules(drafter: sp.Model, prompts, lengths, response_len, data) -> list:
  """Draft-and-verify schedules of the trained pair at every (K, tau_d) (the module doc)."""
  exports.check_same_build(FLAGS.record_ckpt, FLAGS.record_verifier)
  config, params = load.load_model(FLAGS.record_verifier)
  verifier = sp.Model(params, config)
  decodes = []
  for k in map(int, FLAGS.spec_ks):
    for tau in map(float, FLAGS.spec_taus):
      spec = sp.DraftDecoding(max_new_tokens=response_len, k=k, draft_tau=tau, draft_steps=64)
      res = jax.device_get(sp.speculative_generate(drafter, verifier, prompts, lengths, spec))
      n = np.asarray(res.lengths)
      forwards = np.asarray(res.verify_forwards) + np.asarray(res.draft_forwards)
      entry = dict(k=k, tau=tau, block=drafter.config.block_size, draft_steps=64,
                   max_new_tokens=response_len,
                   tokens_per_verify=float((n.sum() - len(n)) / res.verify_forwards.sum()),
                   accepted_per_verify=float(res.accepted.sum() / res.verify_forwards.sum()),
                   forwards_per_token=float(forwards.sum() / n.sum()),
                   mean_length=float(n.mean()))
      decodes.append((n, forwards, emulate.schedule_from_output(res, drafter.config.block_size),
                      res, entry))
  length = int(np.bincount(decodes[0][0]).argmax())  # every decode is the verifier's output
  entries = []
  for n, forwards, rows, res, entry in decodes:
    same = np.flatnonzero(n == length)
    pick = int(same[np.argsort(forwards[same], kind="stable")[(len(same) - 1) // 2]])
    entry.update(length=length, users_of_length=len(same), user=int(data.users[pick]),
                 verify_forwards=int(res.verify_forwards[pick]),
                 draft_forwards=int(res.draft_forwards[pick]), schedule=rows[pick])
    entries.append(entry)
    print(f"[record] draft-and-verify K={entry['k']} tau_d={entry['tau']}: "
          f"{entry['tokens_per_verify']:.2f} tokens / verify, {entry['forwards_per_token']:.2f} "
          f"forwards / token; user {entry['user']}: L={length} in {entry['verify_forwards']} "
          f"verify + {entry['draft_forwards']} draft forwards", flush=True)
  return entries


def hf_check() -> dict:
  """AR gr2jax vs transformers generate, tiny, batch 1, prompt 256 (bench_decode.py's code)."""
  config, params, hf_model = bench_decode.build_models("tiny")
  prompts = np.random.default_rng(0).integers(0, config.vocab_size, (1, 256))
  ours = bench_decode.bench_gr2jax(config, params, prompts, FLAGS.new_tokens)
  row = {"preset": "tiny", "batch": 1, "prompt": 256, "new_tokens": FLAGS.new_tokens,
         "gr2jax_tok_s": ours["tok_s"]}
  row.update(bench_decode.compare_hf(hf_model, prompts, FLAGS.new_tokens, ours))
  print(json.dumps(row), flush=True)
  return row


# ---- report -----------------------------------------------------------------------------------

COLUMNS = ("shape", "dtype", "params", "prompt_len", "length", "method", "block", "tau", "k",
           "forwards", "tokens_per_s", "ms_per_forward", "cost_ratio", "speedup", "compile_s")


def best_speedups(rows: list[dict], run: str, prompt_len: int) -> dict:
  """{tau: (speed-up, block)} of the best block size of one run and prompt length."""
  shape, dtype = run.split("/")
  out = {}
  for r in rows:
    if (r["method"] == "diffusion" and r["shape"] == shape and r["dtype"] == dtype
        and r["prompt_len"] == prompt_len and r["speedup"] > out.get(r["tau"], (0, 0))[0]):
      out[r["tau"]] = (r["speedup"], r["block"])
  return out


def crossover(rows: list[dict], tau: float, prompt_len: int, dtype: str) -> list[dict]:
  """Per shape (by size), the best block's speed-up at tau: where diffusion starts to win."""
  shapes = sorted({(r["params"], r["shape"]) for r in rows if r["dtype"] == dtype})
  out = []
  for params, shape in shapes:
    best = best_speedups(rows, f"{shape}/{dtype}", prompt_len).get(tau)
    if best:
      out.append(dict(shape=shape, params=params, speedup=best[0], block=best[1]))
  return out


def plot(rows: list[dict], path: str) -> None:
  """Speed-up vs model size (one line per block size), a panel per tau; tau 0.9 and P = 256+."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  taus = sorted({r["tau"] for r in rows if r["method"] == "diffusion"}, reverse=True)
  prompts = sorted({r["prompt_len"] for r in rows})
  if not taus:  # only draft-and-verify rows: their table says it
    return
  fig, axes = plt.subplots(len(prompts), len(taus), figsize=(4 * len(taus), 3.2 * len(prompts)),
                           squeeze=False)
  for i, p in enumerate(prompts):
    for j, tau in enumerate(taus):
      ax = axes[i, j]
      panel = [r for r in rows if r["method"] == "diffusion" and r["tau"] == tau
               and r["prompt_len"] == p]
      if not panel:  # a (prompt, tau) no run measured: say so (a log axis of nothing fails)
        ax.set_title(f"tau={tau:g}, prompt {p}: not measured")
        ax.axis("off")
        continue
      for (b, dtype) in sorted({(r["block"], r["dtype"]) for r in panel}):
        rs = sorted((r for r in panel if r["block"] == b and r["dtype"] == dtype),
                    key=lambda r: r["params"])
        ax.plot([r["params"] for r in rs], [r["speedup"] for r in rs],
                "o-" if dtype == "float32" else "s--", label=f"B={b} {dtype}")
      ax.axhline(1.0, color="gray", lw=0.5)
      ax.set(xscale="log", xlabel="parameters", ylabel="speed-up over AR (batch 1)",
             title=f"tau={tau:g}, prompt {p}")
      ax.legend(fontsize=6)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def write_report(result: dict) -> None:
  os.makedirs(FLAGS.report_dir, exist_ok=True)
  rows = result["rows"]
  with open(os.path.join(FLAGS.report_dir, "bench_speedup.json"), "w") as f:
    json.dump(result, f, indent=1)
  fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else ("" if v is None else str(v))
  columns = COLUMNS + (("source",) if any("source" in r for r in rows) else ())  # --merge
  lines = [f"# bench_speedup: {result['device']}; schedules {result['schedules']}", "",
           "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
  lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
  for p in sorted({r["prompt_len"] for r in rows}):
    for dtype in sorted({r["dtype"] for r in rows}):
      lines += ["", f"Best block at tau 0.9, prompt {p}, {dtype}: "
                + ", ".join(f"{c['shape']} ({c['params'] / 1e6:.1f}M) {c['speedup']:.2f}x "
                            f"(B={c['block']})" for c in crossover(rows, 0.9, p, dtype))]
      spec = [r for r in rows if r["method"] == "draft_verify" and r["prompt_len"] == p
              and r["dtype"] == dtype]
      for shape in sorted({r["shape"] for r in spec}):
        best = max((r for r in spec if r["shape"] == shape), key=lambda r: r["speedup"])
        lines += ["", f"Best draft-and-verify, prompt {p}, {dtype}, {shape}: "
                  f"{best['speedup']:.2f}x (K={best['k']}, tau_d={best['tau']:g}; the recorded "
                  "decode's output is AR's)"]
  if result.get("hf_check"):
    h = result["hf_check"]
    lines += ["", f"AR vs transformers generate (tiny, batch 1, prompt 256, {h['new_tokens']} "
              f"tokens): gr2jax {h['gr2jax_tok_s']:.0f} tok/s, transformers {h['hf_tok_s']:.0f} "
              f"tok/s ({h['hf_threads']} threads): {h['speedup']:.2f}x"]
  with open(os.path.join(FLAGS.report_dir, "bench_speedup.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines))
  if rows:
    plot(rows, os.path.join(FLAGS.report_dir, "speedup_vs_size.png"))


def merged_result(report_dirs: list[str]) -> dict:
  """The rows of several runs' reports as one result (each row tagged with its `source` dir).

  Raises:
    app.UsageError: a report is missing, the reports replay other schedules or devices, or two
      hold the same diffusion configuration (shape, dtype, prompt, block, tau) or
      draft-and-verify configuration (the same + K). AR rows may repeat: each is the baseline of
      its own run's speed-ups.
  """
  rows, seen, heads = [], {}, set()
  for d in report_dirs:
    path = os.path.join(d, "bench_speedup.json")
    if not os.path.exists(path):
      raise app.UsageError(f"--merge: {path} does not exist (not a bench_speedup report dir)")
    report = json.load(open(path))
    heads.add((report["device"], report["schedules"]))
    for r in report["rows"]:
      key = tuple(r[k] for k in ("shape", "dtype", "prompt_len", "block", "tau"))
      key += (r["method"], r["k"]) if r["method"] == "draft_verify" else ()
      if r["method"] != "AR" and key in seen:
        raise app.UsageError(f"--merge: {key} is in both {seen[key]} and {d}")
      seen.setdefault(key, d)
      rows.append(dict(r, source=d))
  if len(heads) != 1:
    raise app.UsageError(f"--merge: the reports differ in (device, schedules): {sorted(heads)}")
  device, schedules = heads.pop()
  return dict(device=device, schedules=schedules, rows=rows)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)

  def fresh_report_dir():  # never the committed reports
    if FLAGS.report_dir is None:
      FLAGS.report_dir = tempfile.mkdtemp(prefix="bench_speedup-")
      print(f"[bench_speedup] writing {FLAGS.report_dir}", flush=True)

  if FLAGS.merge:
    fresh_report_dir()
    write_report(merged_result(FLAGS.merge))
    return
  if FLAGS.record_ckpt:
    recorded = record_schedules()
    os.makedirs(os.path.dirname(os.path.abspath(FLAGS.schedules)), exist_ok=True)
    with open(FLAGS.schedules, "w") as f:
      json.dump(recorded, f, indent=1)
  if not FLAGS.runs:
    return
  if not os.path.isfile(FLAGS.schedules):
    raise app.UsageError(f"--schedules={FLAGS.schedules} does not exist (record it with "
                         "--record_ckpt)")
  schedules = json.load(open(FLAGS.schedules))
  runs = [emulate.run_entries(schedules, run) for run in FLAGS.runs]  # every run checked first
  fresh_report_dir()
  result = dict(device=str(jax.devices()[0].device_kind), schedules=FLAGS.schedules, rows=[])
  if FLAGS.hf_check:
    result["hf_check"] = hf_check()
  for run, prompt_lens, chosen, spec_chosen in runs:
    config, params = emulate.random_model(*run.split("/"))
    for p in prompt_lens:
      result["rows"] += emulate.timed_replay(config, params, run, chosen, spec_chosen, p)
      write_report(result)  # after every run: a partial report survives an interruption
    del params  # else the next run's random weights are made beside these (1.7B fp32: 6.9 GB
    #             each: two of them and the replay's buffers were OOM-killed on 24 GB)


if __name__ == "__main__":
  define_flags()
  cli.run(main)
