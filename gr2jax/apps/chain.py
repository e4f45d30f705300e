"""The chain driver: a recipe's steps in order, each reused by digest, then Table 2's rows.

  python experiments/run.py --config=table2.py --workdir=W          (tiny default)
  python experiments/run.py --config=table2.py:smoke --workdir=W    (a few steps each; CI)
  python experiments/run.py --config=table2.py:qwen3_8b --config.hf_dir=DIR --workdir=W

Steps (gr2jax/recipe.chain): [teacher: an LLM writes the SFT traces (teacher.hf_dir set; the
data build then trains on them)] -> [convert: the HF checkpoint with the project's tokens added]
-> sft -> ar_rl -> cft -> opd -> rl, each under W/<step>/, each on the recipe's data build
(built, or reused from W's cache, first). A step is reused when W/<step>/done.json holds its
digest: of its view of the recipe (recipe.stage_config; for convert, the HF directory and dtype;
for teacher, its spec and data build) and of every
step before it (the first: of the data build's config); a changed field re-runs that step and the
ones after it (their directories are wiped first); an interrupted step resumes from its own
checkpoints. A single stage run (`--config=cft.py`) is `run_step`: its upstream steps must be done
with the same recipe, else `UpstreamMissing` names them (or, with upstream='run', they run first).

Rows (research/papers.md §2 Table 2): pre-rank floor and rule teacher (from the data build), AR
GR2 after SFT and after SFT + RL, Diffusion naive (the AR GR2 converted, untrained), + CFT,
+ CFT + OPD, + CFT + OPD -> RL and the constrained-decoding ablation of the last. Each model row
is evaluated by the one evaluation (train/evaluation.py) on every split of `table.splits` (the
diffusion rows on `table.diffusion_splits`), cached by model digest. Writes
<results>/table2.{md,csv,json} with the paper's numbers alongside and the step timings
(experiments/run.py then runs the recipe's `table.then` tables, gr2jax/apps/tables.py).
"""

import csv
import dataclasses
import json
import os
import shutil
import time

import jax

from gr2jax import exports, files
from gr2jax import recipe as recipe_lib
from gr2jax.data import lengths as lengths_lib
from gr2jax.data import pipeline
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.diffusion import convert
from gr2jax.hf import convert as hf_convert
from gr2jax.train import evaluation, inputs, loop, stages, teacher_stage
from gr2jax.train import policy as policy_lib

PAPER = {  # Diffusion-GR2 Table 2 (Amazon Beauty, Qwen3-8B, tau = 1.0), research/papers.md §2
  "floor": (0.2811, 0.5591, 0.4401), "teacher": None, "ar_sft": None,
  "ar_gr2": (0.2960, 0.5651, 0.4497), "naive": (0.2811, 0.5591, 0.4401),
  "cft": (0.2930, 0.5651, 0.4497), "opd": (0.2944, 0.5658, 0.4497),
  "rl": (0.2951, 0.5671, 0.4517), "constrained": None,
}
ROWS = (  # name, label, stage whose export is evaluated (row_policy: how it decodes)
  ("ar_sft", "AR GR2 (SFT)", "sft"), ("ar_gr2", "AR GR2 (SFT + RL)", "ar_rl"),
  ("naive", "Diffusion naive", "ar_rl"), ("cft", "+ CFT", "cft"),
  ("opd", "+ CFT + OPD", "opd"), ("rl", "+ CFT + OPD -> RL", "rl"),
  ("constrained", "+ CFT + OPD -> RL, constrained answers", "rl"),
)
DIFFUSION_ROWS = ("naive", "cft", "opd", "rl", "constrained")  # decoded by block diffusion


class UpstreamMissing(Exception):
  """A step was asked for before the steps it reads were done with the same recipe.

  Attributes:
    step: the step asked for.
    missing: the upstream steps not done, in chain order.
  """

  def __init__(self, step: str, missing: list[str]):
    super().__init__(f"{step} needs {', '.join(missing)} done first with the same recipe")
    self.step, self.missing = step, missing


def _convert_inputs(recipe: recipe_lib.Recipe) -> dict:
  return {"hf_dir": os.path.abspath(recipe.model.hf_dir), "param_dtype": recipe.model.param_dtype}


def _teacher_inputs(recipe: recipe_lib.Recipe) -> dict:
  return {"spec": dataclasses.asdict(recipe_lib.teacher_spec(recipe)),
          "data": recipe_lib.data_config(recipe, traces=False).to_dict()}


def step_digests(recipe: recipe_lib.Recipe, workdir: str) -> dict[str, str]:
  """{step: digest} for the recipe's chain (module docstring). done.json also records the data
  build's digest (`data`), the same for every step of a recipe."""
  keys, upstream = {}, files.json_digest(recipe_lib.data_config(recipe).to_dict())
  for step in recipe_lib.chain(recipe):
    view = (_convert_inputs(recipe) if step == recipe_lib.CONVERT
            else _teacher_inputs(recipe) if step == recipe_lib.TEACHER
            else recipe_lib.stage_config(recipe, step, workdir).to_dict())
    upstream = keys[step] = files.json_digest([upstream, view])
  return keys


def _read_digest(path: str) -> str | None:
  return json.load(open(path))["digest"] if os.path.exists(path) else None


def missing_upstream(recipe: recipe_lib.Recipe, step: str, workdir: str) -> list[str]:
  """The steps before `step` that are not done with this recipe under workdir."""
  keys = step_digests(recipe, workdir)
  return [s for s in recipe_lib.upstream(recipe, step)
          if _read_digest(os.path.join(recipe_lib.stage_dir(workdir, s), "done.json")) != keys[s]]


def _convert(recipe: recipe_lib.Recipe, workdir: str) -> None:
  """The HF checkpoint converted with the data build's extended tokenizer's new tokens."""
  tok_dir = pipeline.run(recipe_lib.data_config(recipe), workdir)["paths"]["tokenizer"]
  hf_convert.convert(recipe.model.hf_dir, recipe_lib.export(workdir, recipe_lib.CONVERT),
                     recipe.model.param_dtype or None,
                     add_tokens_file=os.path.join(tok_dir, tokenizer_lib.ADDED_TOKENS_FILE),
                     tokenizer_dir=tok_dir)


def run_chain(recipe: recipe_lib.Recipe, workdir: str, upto: str | None = None) -> dict:
  """Runs every step (up to and including `upto`) not already done with the same digest chain;
  returns {step: seconds}."""
  steps = recipe_lib.chain(recipe)
  steps = steps[:steps.index(upto) + 1] if upto else steps
  keys, timings, contexts = step_digests(recipe, workdir), {}, {}
  data_key = files.json_digest(recipe_lib.data_config(recipe).to_dict())  # every step's build
  for i, name in enumerate(steps):
    key = keys[name]
    stage_dir = recipe_lib.stage_dir(workdir, name)
    done_file = os.path.join(stage_dir, "done.json")
    started_file = os.path.join(stage_dir, "started.json")
    if _read_digest(done_file) == key:
      print(f"[chain {i + 1}/{len(steps)}] {name}: reusing {stage_dir}", flush=True)
      timings[name] = json.load(open(done_file))["seconds"]
      continue
    if _read_digest(started_file) not in (None, key):
      print(f"[chain {i + 1}/{len(steps)}] {name}: config changed, re-running from scratch",
            flush=True)
      shutil.rmtree(stage_dir)
    elif os.path.exists(done_file):
      shutil.rmtree(stage_dir)
    print(f"[chain {i + 1}/{len(steps)}] {name}: running into {stage_dir}", flush=True)
    os.makedirs(stage_dir, exist_ok=True)
    json.dump({"digest": key}, open(started_file, "w"))
    start = time.perf_counter()
    if name == recipe_lib.CONVERT:
      _convert(recipe, workdir)
    elif name == recipe_lib.TEACHER:
      teacher_stage.run(recipe_lib.teacher_spec(recipe),
                      recipe_lib.data_config(recipe, traces=False), workdir)
    else:
      config = recipe_lib.stage_config(recipe, name, workdir)
      if config.train.limit not in contexts:  # one data build and eval split for all stages
        contexts[config.train.limit] = loop.load_context(config, workdir)
      ctx = dataclasses.replace(contexts[config.train.limit], config=config)
      loop.train(config, workdir, stages.STAGES[name], ctx)
    timings[name] = time.perf_counter() - start
    json.dump({"digest": key, "seconds": timings[name], "data": data_key}, open(done_file, "w"))
  return timings


def run_step(recipe: recipe_lib.Recipe, step: str, workdir: str, upstream: str = "check"
             ) -> float:
  """One step of the recipe (a single stage run); returns its seconds.

  Args:
    upstream: 'check' (a missing upstream step raises UpstreamMissing) or 'run' (run them).

  Raises:
    UpstreamMissing: upstream='check' and an upstream step is not done with this recipe.
    ValueError: upstream is neither.
  """
  if upstream not in ("check", "run"):
    raise ValueError(f"upstream={upstream!r}: expected 'check' or 'run'")
  missing = missing_upstream(recipe, step, workdir)
  if missing and upstream == "check":
    raise UpstreamMissing(step, missing)
  return run_chain(recipe, workdir, upto=step)[step]


def row_policy(recipe: recipe_lib.Recipe, workdir: str, name: str, tokenizer,
               response_len: int) -> tuple[str, policy_lib.Policy]:
  """(export, policy) of a Table 2 model row: its stage's export under the recipe's decode
  spec; the naive row converts the AR GR2 to block diffusion (weights unchanged), the
  constrained row decodes with the answer constraint."""
  stage = {row: stage for row, _, stage in ROWS}[name]
  export = recipe_lib.export(workdir, stage)
  config, spec = exports.load_config(export), recipe.decode
  if name == "naive":
    config = convert.to_diffusion(config, spec.block_size,
                                  tokenizer_lib.mask_token_id(tokenizer))
  if name == "constrained":
    spec = dataclasses.replace(spec, constrained=True)
  return export, policy_lib.make_policy(config, spec, response_len)


def evaluate_rows(recipe: recipe_lib.Recipe, workdir: str, summary: dict) -> list[dict]:
  """Every model row on every split of table.splits, the diffusion rows (naive and after) only on
  those of table.diffusion_splits; each through the workdir's evaluation cache (a stage's final
  evaluation of the same split is reused)."""
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  p, r = lengths_lib.static_lengths(summary)
  rows = []
  for split in recipe.table.splits:
    data = inputs.load_split(summary["paths"]["tfds"], split, tok, limit=recipe.eval.limit)
    for name, label, _ in ROWS:
      if name in DIFFUSION_ROWS and split not in recipe.table.diffusion_splits:
        continue
      export, policy = row_policy(recipe, workdir, name, tok, r)
      result, _ = evaluation.evaluate_export(
        export, policy, data, tok, batch_size=recipe.eval.batch_size, prompt_len=p,
        cache_dir=evaluation.cache_dir(workdir), name=f"{name}_{split}")
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


def provenance(summary: dict) -> dict:
  """Digests of what every number depends on: the tokenizer and the SIDs file the prompts were
  rendered with (pin it on another machine with --config.data.sids_file=<that file>) and, when
  the SFT data are LLM traces (data.teacher_traces), that file and the teachers that wrote it."""
  paths, sids = summary["paths"], summary["sids"]
  traces = summary.get("teacher_traces") or {}
  tokenizer_json = os.path.join(paths["tokenizer"], "tokenizer.json")
  return {"tokenizer_sha256": files.file_sha256(tokenizer_json)[:16],
          "sids_sha256": files.file_sha256(paths["sids"])[:16], "sids_file": paths["sids"],
          "sids_collision_rate": sids["collision_rate"],
          "sids_max_collisions": sids["max_collisions"],
          "teacher_traces_sha256": traces.get("sha256", "")[:16] or "rule teacher",
          "teacher_digests": ",".join(traces.get("teachers", ())) or "-",
          "devices": str(jax.devices())}


def run(recipe: recipe_lib.Recipe, workdir: str) -> str:
  """Steps, rows and Table 2 (module docstring); returns the Table 2 markdown."""
  start = time.perf_counter()
  timings = {}
  if recipe_lib.TEACHER in recipe_lib.chain(recipe):  # its traces are the data build's input
    timings.update(run_chain(recipe, workdir, upto=recipe_lib.TEACHER))
  summary = pipeline.run(recipe_lib.data_config(recipe), workdir)
  timings["data"] = time.perf_counter() - start - sum(timings.values())
  timings.update(run_chain(recipe, workdir))
  rows = (reference_rows(summary, recipe.table.splits)
          + evaluate_rows(recipe, workdir, summary))
  timings["total"] = time.perf_counter() - start
  results_dir = recipe.table.results_dir.format(workdir=workdir)
  md = write_tables(rows, timings, {"recipe": recipe.name, **provenance(summary)}, results_dir)
  print(md, flush=True)
  return md
