"""Table 2 of Diffusion-GR2 (arXiv 2607.01170): the chain's steps (gr2jax/chain.py), then
every row, written with the paper's numbers alongside.

  python experiments/run.py --config=table2.py --workdir=W          (tiny default)
  python experiments/run.py --config=table2.py:smoke --workdir=W    (a few steps each; CI)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=DIR --workdir=W

Rows: pre-rank floor and rule teacher (from the data build), AR GR2 after SFT and after SFT + RL,
Diffusion naive (the AR GR2 converted, untrained), + CFT, + CFT + OPD, + CFT + OPD -> RL, the
constrained-decoding ablation of the last, and the lossless mode (the last drafts, AR GR2
verifies: AR GR2's own output, so its numbers). Each model row is evaluated by the one evaluation
(decoding/evaluation.py) on every split of `table.splits` (the diffusion rows on
`table.diffusion_splits`), through the workdir's evaluation cache (a stage's final evaluation of
the same split is reused). Every row but AR GR2's carries its paired difference to AR GR2 on
the same split and users, R@1 and N@3 with a 95% interval (`metrics.versus`). Writes
<results>/table2.{md,csv,json} with the paper's numbers alongside, the step timings and the stamp
(apps/report.py: the recipe digest, the commit); experiments/run.py then runs the recipe's
`table.then` tables (gr2jax/apps/tables.py).
"""

import csv
import dataclasses
import json
import os
import time

import jax
import numpy as np

from gr2jax import chain, exports, files
from gr2jax import metrics as metrics_lib
from gr2jax import recipe as recipe_lib
from gr2jax import workdir as workdir_lib
from gr2jax.apps import report
from gr2jax.data import build_rendering, pipeline, tfds_builder
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import requests as requests_lib
from gr2jax.data import teacher as teacher_lib
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.decoding import evaluation, prompt_io
from gr2jax.decoding import policy as policy_lib
from gr2jax.diffusion import convert

PAPER = {  # Diffusion-GR2 (arXiv 2607.01170) Table 2: Amazon Beauty, Qwen3-8B, tau = 1.0
  "floor": (0.2811, 0.5591, 0.4401), "teacher": None, "ar_sft": None,
  "ar_gr2": (0.2960, 0.5651, 0.4497), "naive": (0.2811, 0.5591, 0.4401),
  "cft": (0.2930, 0.5651, 0.4497), "opd": (0.2944, 0.5658, 0.4497),
  "rl": (0.2951, 0.5671, 0.4517), "constrained": None, "lossless": None,
}
ROWS = (  # name, label, stage whose export is evaluated (row_policy: how it decodes)
  ("ar_sft", "AR GR2 (SFT)", "sft"), ("ar_gr2", "AR GR2 (SFT + RL)", "ar_rl"),
  ("naive", "Diffusion naive", "ar_rl"), ("cft", "+ CFT", "cft"),
  ("opd", "+ CFT + OPD", "opd"), ("rl", "+ CFT + OPD -> RL", "rl"),
  ("constrained", "+ CFT + OPD -> RL, constrained answers", "rl"),
  ("lossless", "Diffusion draft + AR verify (lossless)", "rl"),
)
LOSSLESS_VERIFIER = "ar_rl"  # the lossless row: the final diffusion model drafts, AR GR2 verifies
DIFFUSION_ROWS = ("naive", "cft", "opd", "rl", "constrained")  # decoded by block diffusion


def row_policy(recipe: recipe_lib.Recipe, workdir: str, name: str, tokenizer,
               response_len: int) -> tuple[str | dict, policy_lib.Policy]:
  """(export, policy) of a Table 2 model row: its stage's export under the recipe's decode
  spec; the naive row converts the AR GR2 to block diffusion (weights unchanged), the
  constrained row decodes with the answer constraint, the lossless row drafts with the stage's
  export and verifies with AR GR2's (its output is AR GR2's own: the same numbers)."""
  stage = {row: stage for row, _, stage in ROWS}[name]
  export = recipe_lib.export(workdir, stage)
  config, spec = exports.load_config(export), recipe.decode
  if name == "naive":
    config = convert.to_diffusion(config, spec.block_size,
                                  tokenizer_lib.mask_token_id(tokenizer))
  if name == "constrained":
    spec = dataclasses.replace(spec, constrained=True)
  if name == "lossless":
    verifier = recipe_lib.export(workdir, LOSSLESS_VERIFIER)
    return ({"drafter": export, "verifier": verifier},
            policy_lib.make_policy(config, spec, response_len,
                                   verifier_config=exports.load_config(verifier)))
  return export, policy_lib.make_policy(config, spec, response_len)


def evaluate_rows(recipe: recipe_lib.Recipe, workdir: str, summary: dict) -> list[dict]:
  """Every model row on every split of table.splits, the diffusion rows (naive and after) only on
  those of table.diffusion_splits; each through the workdir's evaluation cache (a stage's final
  evaluation of the same split is reused), with its 'per_user' metrics.PerUser read from the
  evaluation's per-user rows (evaluation.per_user)."""
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  p, r = lengths_lib.static_lengths(summary)
  rows = []
  for split in recipe.table.splits:
    data = prompt_io.load_split(summary["paths"]["tfds"], split, tok, limit=recipe.eval.limit)
    for name, label, _ in ROWS:
      if name in DIFFUSION_ROWS and split not in recipe.table.diffusion_splits:
        continue
      export, policy = row_policy(recipe, workdir, name, tok, r)
      result, per_user = evaluation.evaluate_export(
        export, policy, data, tok, batch_size=recipe.eval.batch_size, prompt_len=p,
        cache_dir=evaluation.cache_dir(workdir), name=f"{name}_{split}")
      print(evaluation.format_result(f"[table2] {label} / {split}", result), flush=True)
      rows.append({"row": name, "label": label, "split": split, **result,
                   "per_user": evaluation.per_user(per_user)})
  return rows


_SUMMARY_SPLITS = {"test_1615": "test_subset", "test": "test", "validation": "validation"}
REFERENCE_ROWS = (("floor", "Pre-rank floor"), ("teacher", "Rule teacher"))


def _reference_ranks(summary: dict, split: str,
                     limit: int) -> dict[str, metrics_lib.PerUser]:
  """{'floor' | 'teacher': metrics.PerUser} of the first `limit` users of `split`: the target's
  rank in D's order and in the rule teacher's ranking (data/teacher.py, the build's weights on
  the evidence levels of each user's kept history, as data/examples.py scores them)."""
  source = tfds_builder.data_source(summary["paths"]["tfds"], split)
  records = [source[i] for i in range(limit)]
  catalog, sids = build_rendering.build_sids(summary)
  cfg = summary["examples"]["config"]
  candidates = np.stack([np.asarray(r["candidates"]) for r in records])
  levels = requests_lib.evidence_levels(
    [r["history"] for r in records], candidates, requests_lib.Catalogue.make(catalog, sids),
    cfg["max_history"], cfg["evidence_decay"], cfg["evidence_window"])
  targets = np.asarray([int(r["target_position"]) for r in records])
  users = np.asarray([int(r["user"]) for r in records])
  weights = teacher_lib.TeacherWeights(**summary["examples"]["teacher_weights"])
  floor = np.tile(np.arange(candidates.shape[1]), (limit, 1))
  return {name: metrics_lib.PerUser(users, metrics_lib.target_ranks(ranking, targets))
          for name, ranking in (("floor", floor),
                                ("teacher", teacher_lib.rankings(levels, weights)))}


def _metrics(ranks: np.ndarray) -> dict[str, float]:
  """R@1, R@3, N@3 of [n] target ranks (as teacher_lib.ranking_metrics)."""
  return metrics_lib.ranking_metrics(ranks, ks=(1, 3))


def _reference_metrics(summary: dict, split: str, limit: int) -> dict[str, dict]:
  """{'floor' | 'teacher': R@1 / R@3 / N@3} recomputed on the first `limit` users of `split`
  (tests/test_chain.py checks the data build's own numbers of a whole split against them)."""
  return {name: _metrics(p.ranks) for name, p in _reference_ranks(summary, split, limit).items()}


def reference_rows(summary: dict, splits, limit: int = 0) -> list[dict]:
  """Floor and rule teacher on the users the model rows are evaluated on: the first `limit` of
  each split (0 = all: the data build's own numbers), each row with its number of users `num`
  (the evaluation's name for it) and its 'per_user' metrics.PerUser."""
  out = []
  for split in splits:
    size = summary["splits"][split]
    n = min(limit, size) if limit else size
    per_user = _reference_ranks(summary, split, n)
    for name, label in REFERENCE_ROWS:
      m = (summary["examples"][name][_SUMMARY_SPLITS[split]] if n == size
           else _metrics(per_user[name].ranks))
      out.append({"row": name, "label": label, "split": split, "num": n, "R@1": m["R@1"],
                  "R@3": m["R@3"], "N@3": m["N@3"], "valid_rate": 1.0,
                  "per_user": per_user[name]})
  return out


BASELINE = "ar_gr2"  # the row every other row is compared with, user by user
VERSUS = f"vs_{BASELINE}"  # a row's field holding that comparison (metrics.versus)


def with_versus(rows: list[dict]) -> list[dict]:
  """The rows without their 'per_user', each but the BASELINE's with VERSUS: metrics.versus the
  BASELINE row of its split (a split without one: none)."""
  base = {r["split"]: r["per_user"] for r in rows if r["row"] == BASELINE}
  out = []
  for row in rows:
    kept = {k: v for k, v in row.items() if k != "per_user"}
    if row["row"] != BASELINE and row["split"] in base:
      kept[VERSUS] = metrics_lib.versus(row["per_user"], base[row["split"]])
    out.append(kept)
  return out


COLUMNS = ("num", "R@1", "R@1_se", "R@3", "N@3", "valid_rate", *report.INVALID_KINDS,
           "top1_is_D_first", "top1_is_teacher", "nfe_per_token", "paper_nfe_per_token",
           "tokens_per_s")
VERSUS_COLUMNS = {report.interval_column(name): name
                  for name in metrics_lib.PER_USER}  # header -> metric of VERSUS


def _versus_cell(row: dict, metric: str) -> str:
  """The row's VERSUS difference in `metric` (report.interval); '' for a row without one."""
  return report.interval(row[VERSUS][metric]) if VERSUS in row else ""


def _timing(name: str, timing: dict) -> str:
  return f"{name} {timing['seconds']:.0f} ({timing['how']})"


def write_tables(rows: list[dict], timings: dict, provenance: dict, results_dir: str, *,
                 recipe_digest: str | None = None, commit: str | None = None) -> str:
  """results/table2.{md,csv,json}; returns the markdown.

  Args:
    rows: every row ('num' = the users it is computed on; VERSUS: with_versus's comparison).
    timings: {name: {'seconds', 'how'}} (run_chain's, plus 'total' of this run).
    provenance: {name: value}.
    results_dir: where the files go.
    recipe_digest, commit: the stamp (report.stamp): the JSON's top-level fields and the
      markdown's last line (None: left out).
  """
  stamp = report.stamp_of({"recipe_digest": recipe_digest, "commit": commit})
  os.makedirs(results_dir, exist_ok=True)
  order = ["floor", "teacher"] + [r[0] for r in ROWS]
  rows = sorted(rows, key=lambda r: (r["split"] != "test_1615", order.index(r["row"])))
  header = ["split", "row", *COLUMNS, *VERSUS_COLUMNS, "paper R@1 / R@3 / N@3"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  table_rows = []
  for row in rows:
    paper = PAPER.get(row["row"])
    cells = [row["split"], row["label"], *(report.cell(row, c, "") for c in COLUMNS),
             *(_versus_cell(row, m) for m in VERSUS_COLUMNS.values()),
             " / ".join(f"{x:.4f}" for x in paper) if paper else ""]
    table_rows.append(cells)
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines.append("Stage wall time (s; reused = the seconds of the run that made it): "
               + ", ".join(_timing(k, v) for k, v in timings.items()))
  lines.append("Provenance: " + ", ".join(f"{k} {v}" for k, v in provenance.items()))
  if stamp:
    lines.append(report.stamp_line(stamp))
  md = "\n".join(lines) + "\n"
  with open(os.path.join(results_dir, "table2.md"), "w") as f:
    f.write(md)
  with open(os.path.join(results_dir, "table2.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(table_rows)
  with open(os.path.join(results_dir, "table2.json"), "w") as f:
    json.dump({**stamp, "rows": rows, "timings": timings, "provenance": provenance,
               "paper": PAPER}, f, indent=1, default=str)
  return md


def provenance(summary: dict, workdir: str) -> dict:
  """Digests of what every number depends on: the tokenizer (`vocab_sha256`, the same digest
  every export of the build records: exports.data_build_record; `tokenizer_json_sha256`, of its
  tokenizer.json file), the SIDs file the prompts were rendered with (pin it on another machine
  with --config.data.sids_file=<that file>) and, when the SFT data are LLM traces
  (data.teacher_traces), that file and the teachers that wrote it. Paths inside the workdir are
  written relative to it ({workdir}/...)."""
  paths, sids = summary["paths"], summary["sids"]
  traces = summary.get("teacher_traces") or {}
  tokenizer = tokenizer_lib.load_tokenizer(paths["tokenizer"])
  return {"vocab_sha256": exports.vocab_digest(tokenizer)[:16],
          "tokenizer_json_sha256": files.file_sha256(
            os.path.join(paths["tokenizer"], "tokenizer.json"))[:16],
          "sids_sha256": files.file_sha256(paths["sids"])[:16],
          "sids_file": workdir_lib.portable(paths["sids"], workdir),
          "sids_collision_rate": sids["collision_rate"],
          "sids_max_collisions": sids["max_collisions"],
          "teacher_traces_sha256": traces.get("sha256", "")[:16] or "rule teacher",
          "teacher_digests": ",".join(traces.get("teachers", ())) or "-",
          "devices": str(jax.devices())}


def run(recipe: recipe_lib.Recipe, workdir: str) -> str:
  """Steps, rows and Table 2 (module docstring); returns the Table 2 markdown."""
  start = time.perf_counter()
  timings = chain.run_chain(recipe, workdir)  # the teacher first: its traces are the build's input
  summary = pipeline.run(recipe_lib.data_config(recipe), workdir)
  rows = with_versus(reference_rows(summary, recipe.table.splits, recipe.eval.limit)
                     + evaluate_rows(recipe, workdir, summary))
  timings["total"] = {"seconds": time.perf_counter() - start, "how": "this run"}
  results_dir = workdir_lib.fill_path(recipe.table.results_dir, workdir)
  md = write_tables(rows, timings, {"recipe": recipe.name, **provenance(summary, workdir)},
                    results_dir, **report.stamp(report.recipe_digest(recipe, workdir)))
  print(md, flush=True)
  return md
