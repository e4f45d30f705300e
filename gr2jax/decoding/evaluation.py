"""The one evaluation: decode a split, validate every answer, score the rankings; and the one
evaluation cache.

Used by `--config=eval.py` on any checkpoint, by every training stage for its periodic and final
evaluation, by Table 2's rows and by Tables 3 / 4. A split is answered batch by batch by the
model's Reranker (reranker.py `Reranker.answer`, the offline tool's and the server's path too):
its policy decodes (AR greedy, block diffusion at the spec's eval tau and step cap, or the
lossless pair) and each response is parsed by gr2jax.data.answer.parse_answer; anything but a
valid permutation falls back to D's order (counted per failure kind), and the target's rank in
the resulting list gives R@1 / R@3 / N@3 (gr2jax.metrics).

`evaluate_cached` keys an evaluation by what decides its result (the model's params digest and
config, the data read, the decode spec, P, R, the batch size) and keeps it in a directory, so a
stage's final evaluation serves Table 2's row of the same model and Table 3's tau = 1.0 row
serves Table 4.
"""

import dataclasses
import glob
import json
import os
import time

import jax
import numpy as np

from gr2jax import exports, files, load
from gr2jax import metrics as metrics_lib
from gr2jax.data import answer
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import prompt_io
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.model import config as config_lib
from gr2jax.progress import progress


def score(results: list, data: prompt_io.SplitData) -> dict:
  """Ranking metrics, validity and agreement of parsed answers over a split.

  Args:
    results: [E] AnswerResults in the split's order.
    data: the split.

  Returns:
    R@1 / R@3 / N@3 / R@10, 'R@1_se' (binomial standard error), valid rate and per-kind counts,
    top-1 agreement with D's order and (where the split carries it) with the rule teacher.
  """
  rankings = np.stack([r.ranking for r in results])  # [E, N] slots, fallback = D's order
  ranks = metrics_lib.target_ranks(rankings, data.target_position[:len(results)])
  out = metrics_lib.ranking_metrics(ranks, ks=(1, 3, 10))
  r1 = out["R@1"]
  out["R@1_se"] = float(np.sqrt(r1 * (1 - r1) / len(results)))
  summary = answer.summarize(results)
  out["valid_rate"] = summary["valid_rate"]
  out["counts"] = summary["counts"]
  out["top1_is_D_first"] = float(np.mean(rankings[:, 0] == 0))
  teacher = data.teacher_top1[:len(results)]
  has = teacher >= 0
  out["top1_is_teacher"] = float(np.mean(rankings[has, 0] == teacher[has])) if has.any() else None
  out["num"] = len(results)
  return out


def evaluate(reranker: reranker_lib.Reranker, data: prompt_io.SplitData, *, batch_size: int,
             out_path: str | None = None, desc: str = "eval",
             given_reasoning: bool = False) -> dict:
  """Answers (Reranker.answer), validates and scores a split; optionally writes per-example JSONL.

  Args:
    reranker: the model's Reranker (its policy: the model, its decode spec, the response cap R;
      its params, tokenizer and static prompt width P; Reranker.of from in-memory parts).
    data: the split (prompt_io.load_split).
    batch_size: decode batch size (the last batch is padded, its extra rows dropped).
    out_path: JSONL with one row per example (user, response text, ranking, validity, target
      rank), or None.
    desc: progress-bar label.
    given_reasoning: give each example's own reasoning tokens (teacher forcing; the split must
      carry reasoning, e.g. 'train') and decode only the answer after them (diffusion only).

  Returns:
    score(...) plus 'mean_response_len', 'mean_nfe' and 'nfe_per_token' (forwards incl. prefill
    and commit forwards), 'paper_nfe_per_token' (denoising steps per token, the paper's count),
    'tokens_per_s' (after the first, compiling batch) and 'seconds'.
  """
  results, rows, lengths, nfes, steps = [], [], [], [], []
  decode_s, decoded_tokens = 0.0, 0
  start = time.perf_counter()
  bar = progress(len(data), desc=desc)
  for first in range(0, len(data), batch_size):
    chunk = data.encoded[first:first + batch_size]
    got = reranker.answer(chunk, data.labels[first:first + len(chunk)], rows=batch_size,
                          given_reasoning=given_reasoning)
    if first > 0:
      decode_s += got.seconds
      decoded_tokens += int(got.decoded.lengths.sum())
    for i, (text, result) in enumerate(zip(got.texts, got.results, strict=True)):
      index = first + i
      results.append(result)
      rows.append({"user": int(data.users[index]), "response": text, "kind": result.kind,
                   "ranking": result.ranking.tolist(),
                   "target_position": int(data.encoded[index].target_position)})
    lengths += got.decoded.lengths.tolist()
    nfes += got.decoded.nfe.tolist()
    steps += got.decoded.denoise_steps.tolist()
    bar.update(len(chunk))
  bar.close()
  out = score(results, data)
  out["mean_response_len"] = float(np.mean(lengths))
  out["mean_nfe"] = float(np.mean(nfes))
  out["nfe_per_token"] = float(np.sum(nfes) / max(np.sum(lengths), 1))
  out["paper_nfe_per_token"] = float(np.sum(steps) / max(np.sum(lengths), 1))
  out["tokens_per_s"] = decoded_tokens / decode_s if decode_s > 0 else None
  out["seconds"] = time.perf_counter() - start
  if out_path is not None and jax.process_index() == 0:
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    ranks = metrics_lib.target_ranks(np.stack([r.ranking for r in results]),
                                     data.target_position[:len(results)])
    files.atomic_write(out_path, "".join(json.dumps({**row, "target_rank": int(rank)}) + "\n"
                                         for row, rank in zip(rows, ranks, strict=True)))
  return out


def cache_key(model_id: str, policy: policy_lib.Policy, data: prompt_io.SplitData, *,
              batch_size: int, prompt_len: int, given_reasoning: bool = False) -> str:
  """What decides an evaluation's result: the model (its params digest `model_id` and config),
  the data read, the decode spec, P, R and the batch size. The config's and the spec's retired
  fields count at their retired value (model/config.py RETIRED_FIELDS, DecodeSpec.record), so a
  key stays the key it was."""
  if not data.source:
    raise ValueError("cache_key: the split has no source (prompt_io.load_split sets it)")
  config = {**config_lib.retired_defaults(), **dataclasses.asdict(policy.config)}
  return files.json_digest([model_id, config,
                            policy.spec.record(), policy.max_new_tokens, data.source,
                            prompt_len, batch_size, given_reasoning])


def cache_dir(workdir: str) -> str:
  """A workdir's evaluation cache directory (evaluate_cached)."""
  return os.path.join(workdir, "evaluations")


def evaluate_cached(cache_dir: str, name: str, key: str, evaluate_fn) -> tuple[dict, list[dict]]:
  """The evaluation `key` (cache_key) from cache_dir, else evaluate_fn(out_path) run and kept.

  Args:
    cache_dir: the cache directory (one per workdir: <workdir>/evaluations).
    name: a readable file-name stem (the model, the split); a result is found by its key alone
      (<cache_dir>/<any name>_<key>.json and .jsonl).
    key: cache_key(...).
    evaluate_fn: out_path -> result (an `evaluate` call writing its JSONL to out_path).

  Returns:
    (result, per-example rows of its JSONL); result['cache_key'] = key.
  """
  kept = [p[:-len(".json")] for p in glob.glob(os.path.join(glob.escape(cache_dir),
                                                            f"*_{key}.json"))]
  kept = [p for p in kept if os.path.isfile(p + ".jsonl")]
  stem = kept[0] if kept else os.path.join(cache_dir, f"{name}_{key}")
  if kept:
    with open(stem + ".json") as f:
      result = json.load(f)
  else:
    os.makedirs(cache_dir, exist_ok=True)
    result = {**evaluate_fn(stem + ".jsonl"), "cache_key": key}
    if jax.process_index() == 0:
      files.atomic_write(stem + ".json", json.dumps(result, indent=1))
  with open(stem + ".jsonl") as f:
    rows = [json.loads(line) for line in f]
  return result, rows


def per_user(rows: list[dict]) -> metrics_lib.PerUser:
  """The per-user outcome of an evaluation's per-example rows (its JSONL: 'user',
  'target_rank'), in their order: what metrics.versus pairs."""
  return metrics_lib.PerUser(np.asarray([r["user"] for r in rows]),
                             np.asarray([r["target_rank"] for r in rows]))


def export_id(export) -> str:
  """The identity of an export for the evaluation cache: its recorded params digest (read
  without the weights; exports.content_digest for a directory without one); of a
  {role: export} dict (the lossless pair), every role's."""
  if isinstance(export, dict):
    return files.json_digest({role: export_id(path) for role, path in sorted(export.items())})
  return exports.content_digest(export)


def evaluate_export(export, policy: policy_lib.Policy, data: prompt_io.SplitData, tokenizer,
                    *, batch_size: int, prompt_len: int, cache_dir: str,
                    name: str) -> tuple[dict, list[dict]]:
  """The cached evaluation (evaluate_cached) of an export's params under `policy`.

  Args:
    export: an export path, or {"drafter": path, "verifier": path} for a LosslessPolicy.

  The policy's config is the export's (exports.load_config) or its block-diffusion conversion
  (the naive row): the weights are the same, so they are loaded only on a cache miss.

  Returns:
    (result, per-example rows).
  """
  key = cache_key(export_id(export), policy, data, batch_size=batch_size, prompt_len=prompt_len)

  def run(out_path):
    params = ({role: load.load_model(path)[1] for role, path in export.items()}
              if isinstance(export, dict) else load.load_model(export)[1])
    return evaluate(reranker_lib.Reranker.of(policy, params, tokenizer, prompt_len), data,
                    batch_size=batch_size, out_path=out_path, desc=name)

  return evaluate_cached(cache_dir, name, key, run)


def format_result(name: str, result: dict) -> str:
  """One readable line of an evaluation result."""
  counts = " ".join(f"{k}={v}" for k, v in result["counts"].items() if k != "valid" and v)
  teacher = result["top1_is_teacher"]
  return (f"{name}: R@1 {result['R@1']:.4f} (se {result['R@1_se']:.4f}) R@3 {result['R@3']:.4f} "
          f"N@3 {result['N@3']:.4f} | valid {result['valid_rate']:.3f} {counts} | top1=D "
          f"{result['top1_is_D_first']:.3f}"
          + (f" top1=teacher {teacher:.3f}" if teacher is not None else "")
          + f" | len {result['mean_response_len']:.1f} fwd/tok {result['nfe_per_token']:.3f}"
          + f" steps/tok {result['paper_nfe_per_token']:.3f}"
          + (f" {result['tokens_per_s']:.0f} tok/s" if result["tokens_per_s"] else "")
          + f" | n={result['num']} {result['seconds']:.0f} s")
