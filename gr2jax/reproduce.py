"""The Table 2 driver: every stage in order, reusing finished ones, then every row evaluated.

  python experiments/run.py --config=table2.py --workdir=W          (tiny default)
  python experiments/run.py --config=table2.py:smoke --workdir=W    (a few steps each; CI)

Stages (each a run of gr2jax/train/loop.py under W/<stage>/): sft -> ar_rl -> cft -> opd -> rl.
A stage is reused when W/<stage>/done.json holds the digest of its config and of every stage
before it; a changed config re-runs that stage and the ones after it (their directories are
wiped first), an interrupted stage resumes from its own checkpoints. Rows (research/papers.md §2
Table 2): pre-rank floor and rule teacher (from the data build), AR GR2 after SFT and after
SFT + RL, Diffusion naive (the AR GR2 converted, untrained), + CFT, + CFT + OPD, + CFT + OPD -> RL
and the constrained-decoding ablation of the last. Each model row is evaluated by the one
evaluation (train/evaluation.py) on every split of `table.splits`, cached by model digest.
Writes <results>/table2.{md,csv,json} with the paper's numbers alongside and a stage timing log.
"""

import csv
import dataclasses
import hashlib
import json
import os
import shutil
import time

import jax

from gr2jax import checkpoint as model_checkpoint
from gr2jax.data import pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.train import evaluation, inputs, loop, stages

STAGE_ORDER = ("sft", "ar_rl", "cft", "opd", "rl")
PAPER = {  # Diffusion-GR2 Table 2 (Amazon Beauty, Qwen3-8B, tau = 1.0), research/papers.md §2
  "floor": (0.2811, 0.5591, 0.4401), "teacher": None, "ar_sft": None,
  "ar_gr2": (0.2960, 0.5651, 0.4497), "naive": (0.2811, 0.5591, 0.4401),
  "cft": (0.2930, 0.5651, 0.4497), "opd": (0.2944, 0.5658, 0.4497),
  "rl": (0.2951, 0.5671, 0.4517), "constrained": None,
}
ROWS = (  # name, label, stage whose export is evaluated, decode with the answer constraint
  ("ar_sft", "AR GR2 (SFT)", "sft", False), ("ar_gr2", "AR GR2 (SFT + RL)", "ar_rl", False),
  ("naive", "Diffusion naive", "ar_rl", False), ("cft", "+ CFT", "cft", False),
  ("opd", "+ CFT + OPD", "opd", False), ("rl", "+ CFT + OPD -> RL", "rl", False),
  ("constrained", "+ CFT + OPD -> RL, constrained answers", "rl", True),
)
DIFFUSION_ROWS = ("naive", "cft", "opd", "rl", "constrained")  # decoded by block diffusion


def digest(obj) -> str:
  return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:16]


def stage_config(table, name: str, workdir: str):
  """The stage's config file (experiments/configs/<name>.py) with the table's overrides."""
  import importlib
  module = importlib.import_module(name)
  config = module.get_config()
  config.data = table.data
  config.eval = table.eval
  config.mesh = table.mesh
  config.train.update(table.stages[name].to_dict())  # e.g. steps, batch_size, limit
  if "block_size" in config:
    config.block_size = table.block_size
    config.diffusion.max_steps_per_block = table.rollout_max_steps_per_block
  loop.resolve_workdir_paths(config, workdir)
  return config


def run_stages(table, workdir: str) -> dict:
  """Runs every stage not already done with the same config chain; returns {stage: seconds}."""
  timings, upstream, contexts = {}, digest(table.data.to_dict()), {}
  for name in STAGE_ORDER:
    config = stage_config(table, name, workdir)
    key = digest([upstream, config.to_dict()])
    stage_dir = os.path.join(workdir, name)
    done_file = os.path.join(stage_dir, "done.json")
    started_file = os.path.join(stage_dir, "started.json")
    if os.path.exists(done_file) and json.load(open(done_file))["digest"] == key:
      print(f"[table2] {name}: reusing {stage_dir}", flush=True)
      timings[name] = json.load(open(done_file))["seconds"]
    else:
      if os.path.exists(started_file) and json.load(open(started_file))["digest"] != key:
        print(f"[table2] {name}: config changed, re-running from scratch", flush=True)
        shutil.rmtree(stage_dir)
      elif os.path.exists(done_file):
        shutil.rmtree(stage_dir)
      os.makedirs(stage_dir, exist_ok=True)
      json.dump({"digest": key}, open(started_file, "w"))
      start = time.perf_counter()
      data_key = digest([config.train.limit, config.eval.to_dict()])  # same data build for all
      if data_key not in contexts:
        contexts[data_key] = loop.load_context(config, workdir)
      ctx = dataclasses.replace(contexts[data_key], config=config)
      loop.train(config, workdir, stages.STAGES[name], ctx)
      timings[name] = time.perf_counter() - start
      json.dump({"digest": key, "seconds": timings[name]}, open(done_file, "w"))
    upstream = key
  return timings


def evaluate_rows(table, workdir: str, summary: dict) -> list[dict]:
  """Every model row on every split of table.splits, the diffusion rows (naive and after) only on
  those of table.diffusion_splits; each cached by the model's done digest."""
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  train = inputs.load_split(summary["paths"]["tfds"], "train", tok)
  out_dir = os.path.join(workdir, "table2")
  os.makedirs(out_dir, exist_ok=True)
  rows = []
  for split in table.splits:
    data = inputs.load_split(summary["paths"]["tfds"], split, tok, limit=table.eval.limit)
    p, r = inputs.static_lengths([train, data])
    for name, label, stage, constrained in ROWS:
      if name in DIFFUSION_ROWS and split not in table.diffusion_splits:
        continue
      export = os.path.join(workdir, stage, "export")
      done = json.load(open(os.path.join(workdir, stage, "done.json")))["digest"]
      key = digest([done, name, split, table.eval.to_dict(), table.block_size])
      cache = os.path.join(out_dir, f"{name}_{split}.json")
      if os.path.exists(cache) and json.load(open(cache)).get("key") == key:
        result = json.load(open(cache))
      else:
        config, params = model_checkpoint.load_model(export)
        if name == "naive":
          config, params = loop.model_from_init(export, tok, None, table.block_size)
        result = evaluation.evaluate(
          params, config, data, tok, batch_size=table.eval.batch_size, prompt_len=p,
          max_new_tokens=r, tau=table.eval.tau,
          max_steps_per_block=table.eval.max_steps_per_block,
          out_path=os.path.join(out_dir, f"{name}_{split}.jsonl"), desc=f"{name} {split}",
          constrained=constrained)
        result["key"] = key
        json.dump(result, open(cache, "w"), indent=1)
      print(evaluation.format_result(f"[table2] {label} / {split}", result), flush=True)
      rows.append({"row": name, "label": label, "split": split, **result})
  return rows


def reference_rows(summary: dict, splits) -> list[dict]:
  """Floor and rule teacher from the data build's summary."""
  names = {"test_1615": "test_subset", "test": "test", "validation": "validation"}
  out = []
  for split in splits:
    ex = summary["examples"]
    for name, label, key in (("floor", "Pre-rank floor", "floor"),
                             ("teacher", "Rule teacher", "teacher")):
      m = ex[key][names[split]]
      out.append({"row": name, "label": label, "split": split, "R@1": m["R@1"],
                  "R@3": m["R@3"], "N@3": m["N@3"], "valid_rate": 1.0})
  return out


COLUMNS = ("R@1", "R@1_se", "R@3", "N@3", "valid_rate", "duplicate", "omitted", "out_of_set",
           "truncated", "malformed_json", "top1_is_D_first", "top1_is_teacher", "nfe_per_token",
           "paper_nfe_per_token", "tokens_per_s")


def _cell(row, col):
  value = row.get(col, row.get("counts", {}).get(col))
  if value is None:
    return ""
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_tables(rows: list[dict], timings: dict, provenance: dict, results_dir: str) -> str:
  """results/table2.{md,csv,json}; returns the markdown."""
  os.makedirs(results_dir, exist_ok=True)
  order = ["floor", "teacher"] + [r[0] for r in ROWS]
  rows = sorted(rows, key=lambda r: (r["split"] != "test_1615", order.index(r["row"])))
  header = ["split", "row", *COLUMNS, "paper R@1 / R@3 / N@3"]
  lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
  table_rows = []
  for row in rows:
    paper = PAPER.get(row["row"])
    cells = [row["split"], row["label"], *(_cell(row, c) for c in COLUMNS),
             " / ".join(f"{x:.4f}" for x in paper) if paper else ""]
    table_rows.append(cells)
    lines.append("| " + " | ".join(cells) + " |")
  lines.append("")
  lines.append("Stage wall time (s): " + ", ".join(f"{k} {v:.0f}" for k, v in timings.items()))
  lines.append("Provenance: " + ", ".join(f"{k} {v}" for k, v in provenance.items()))
  md = "\n".join(lines) + "\n"
  with open(os.path.join(results_dir, "table2.md"), "w") as f:
    f.write(md)
  with open(os.path.join(results_dir, "table2.csv"), "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(header)
    w.writerows(table_rows)
  with open(os.path.join(results_dir, "table2.json"), "w") as f:
    json.dump({"rows": rows, "timings": timings, "provenance": provenance, "paper": PAPER}, f,
              indent=1, default=str)
  return md


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.file_digest(f, "sha256").hexdigest()[:16]


def provenance(summary: dict) -> dict:
  """Digests of what every number depends on: the tokenizer and the SIDs file the prompts were
  rendered with (pin it on another machine with --config.data.sids_file=<that file>) and, when
  the SFT data are LLM traces (data.teacher_traces), that file and the teachers that wrote it."""
  paths, sids = summary["paths"], summary["sids"]
  traces = summary.get("teacher_traces") or {}
  return {"tokenizer_sha256": _sha256(os.path.join(paths["tokenizer"], "tokenizer.json")),
          "sids_sha256": _sha256(paths["sids"]), "sids_file": paths["sids"],
          "sids_collision_rate": sids["collision_rate"],
          "sids_max_collisions": sids["max_collisions"],
          "teacher_traces_sha256": traces.get("sha256", "")[:16] or "rule teacher",
          "teacher_digests": ",".join(traces.get("teachers", ())) or "-",
          "devices": str(jax.devices())}


def run(table, workdir: str) -> str:
  """Stages, rows, tables (module docstring); returns the markdown table."""
  start = time.perf_counter()
  summary = pipeline.run(table.data, workdir)
  timings = {"data": time.perf_counter() - start, **run_stages(table, workdir)}
  rows = reference_rows(summary, table.splits) + evaluate_rows(table, workdir, summary)
  timings["total"] = time.perf_counter() - start
  results_dir = table.results_dir.format(workdir=workdir)
  md = write_tables(rows, timings, provenance(summary), results_dir)
  print(md, flush=True)
  return md
