"""The GPU-box path on CPU: `table2.py` with an HF recipe on a random-weight Qwen3 checkpoint in the
real HF layout (tests/hf_layout.py), end to end through experiments/run.py -- tokenizer extension,
conversion with the project's tokens, the data build with the paper's prompt, SFT -> AR RL ->
CFT -> OPD -> RL, every Table 2 row, Table 3, Table 4 and Figure 6 -- with two steps per stage,
the first 600 users' data build, 3 history items shown (the paper's 20 make 1,600-token prompts
with this tiny tokenizer) and 16 evaluated users (the smoke's rollout sizes and Figure 6 sweep:
gr2jax/recipes.py `_smoke`); then a single stage checks or runs its upstream."""

import json
import os
import resource
import subprocess
import sys
import time

import pytest

from tests.hf_layout import save_qwen3_dir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUN = os.path.join(REPO, "experiments", "run.py")
SIDS = os.path.join(REPO, "results", "sids_table2.npy")  # skips the RQ-VAE (the tiny run's SIDs)


def _run(workdir, *args, config="table2.py"):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a box
  env["GR2JAX_PROGRESS"] = "0"
  return subprocess.run(
    [sys.executable, RUN, f"--config={config}:qwen3_0_6b,smoke", f"--workdir={workdir}",
     f"--config.data.sids_file={SIDS}", "--config.data.users=600",
     "--config.data.eval_subset_size=48", "--config.data.prompt.history_items=3",
     "--config.eval.limit=16", "--config.eval.batch_size=8", *args],
    capture_output=True, text=True, cwd=REPO, timeout=3600, env=env)  # a loaded shared box


@pytest.fixture(scope="module")
def hf_run(tmp_path_factory):
  hf_dir = save_qwen3_dir(tmp_path_factory.mktemp("hf") / "Qwen3-tiny")
  workdir = str(tmp_path_factory.mktemp("table2"))
  start, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
  result = _run(workdir, f"--config.hf_dir={hf_dir}")
  after = resource.getrusage(resource.RUSAGE_CHILDREN)
  seconds = (time.perf_counter() - start,
             after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
  assert result.returncode == 0, result.stderr[-4000:]
  return hf_dir, workdir, result, seconds


def test_table2_hf_recipe_end_to_end(hf_run):
  hf_dir, workdir, result, (wall, cpu) = hf_run
  print(f"table2.py:qwen3_0_6b,smoke on the HF-layout checkpoint: {wall:.0f} s wall, "
        f"{cpu:.0f} s CPU")
  steps = ("convert", "sft", "ar_rl", "cft", "opd", "rl")
  for step in steps:  # every step ran, in order, and left its export
    assert f"] {step}: running into" in result.stdout, step
    assert os.path.isdir(os.path.join(workdir, step, "export")), step
  for step in ("ar_rl", "rl"):  # two GRPO steps each, on real rollouts
    metrics = [json.loads(line) for line in open(os.path.join(workdir, step, "logs",
                                                              "metrics.jsonl"))]
    trained = [m for m in metrics if "train/reward" in m]
    assert len(trained) == 2, (step, metrics)
    for m in trained:
      assert -1.0 <= m["train/reward"] <= 1.2 and 0 <= m["train/kept_groups"] <= 1, (step, m)
  added = json.load(open(os.path.join(workdir, "convert", "export", "added_token_ids.json")))
  assert "<|mask|>" in added and "<slot_0>" in added  # the project's tokens were added
  table = json.load(open(os.path.join(workdir, "results", "table2.json")))
  rows = {(r["row"], r["split"]) for r in table["rows"]}
  expected = {"floor", "teacher", "ar_sft", "ar_gr2", "naive", "cft", "opd", "rl", "constrained"}
  assert rows == {(name, "test_1615") for name in expected}
  assert table["provenance"]["recipe"] == "qwen3_0_6b"
  for name in ("table3.md", "table4.md", "fig6.json", "table3_frontier.png"):
    assert os.path.getsize(os.path.join(workdir, "results", name)) > 0, name
  fig6 = json.load(open(os.path.join(workdir, "results", "fig6.json")))
  assert [b["mean"] for b in fig6["by_forced_output_length"]] == [16.0], fig6  # the sweep ran
  # every step read the same data build: the paper's prompt, the HF tokenizer extended
  data = {json.load(open(os.path.join(workdir, s, "done.json")))["data"] for s in steps}
  assert len(data) == 1
  config = open(os.path.join(workdir, "sft", "logs", "config.txt")).read()
  assert "style: chat" in config and f"tokenizer_base: {hf_dir}" in config


def test_single_stage_checks_or_runs_its_upstream(hf_run):
  """rl.py on the finished workdir with OPD's completion record removed: 'check' names OPD and
  its command in one line; 'run' redoes OPD (resumed at its last step: export + evaluation) and
  reuses RL, whose digest chain is unchanged."""
  hf_dir, workdir, _, _ = hf_run
  os.remove(os.path.join(workdir, "opd", "done.json"))
  result = _run(workdir, f"--config.hf_dir={hf_dir}", config="rl.py")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  lines = [line for line in result.stderr.splitlines() if " needs " in line]
  assert len(lines) == 1 and lines[0].startswith("rl needs opd done first"), result.stderr[-2000:]
  assert "opd.py:qwen3_0_6b,smoke" in lines[0]
  result = _run(workdir, f"--config.hf_dir={hf_dir}", "--config.upstream=run", config="rl.py")
  assert result.returncode == 0, result.stderr[-2000:]
  assert "] opd: running into" in result.stdout and "] rl: reusing" in result.stdout
  assert "] sft: reusing" in result.stdout


def test_llm_teacher_step_of_the_hf_recipe(hf_run):
  """With --config.teacher.hf_dir a stage names the teacher step as missing upstream, and
  teacher.py runs it through the chain (the HF-layout model as the teacher, GR2's chat prompt,
  4 users): traces for the data build and the step's completion record."""
  hf_dir, workdir, _, _ = hf_run
  teacher = [f"--config.hf_dir={hf_dir}", f"--config.teacher.hf_dir={hf_dir}",
             "--config.teacher.num_users=4", "--config.teacher.attempts=1",
             "--config.teacher.max_new_tokens=8", "--config.teacher.batch_size=4"]
  result = _run(workdir, *teacher, config="sft.py")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert any(" needs teacher" in line for line in result.stderr.splitlines()), result.stderr[-2000:]
  result = _run(workdir, *teacher, config="teacher.py")
  assert result.returncode == 0, result.stderr[-4000:]
  summary = json.load(open(os.path.join(workdir, "teacher", "summary.json")))
  assert summary["finished"] == 4 and summary["attempts"] == 4
  assert os.path.exists(os.path.join(workdir, "teacher", "traces.jsonl"))
  assert os.path.exists(os.path.join(workdir, "teacher", "done.json"))


def readme_snippet() -> str:
  """The Python block of README.md's "From a notebook" section, verbatim."""
  text = open(os.path.join(REPO, "README.md")).read()
  section = text.split("## From a notebook", 1)[1]
  return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_notebook_snippet_runs_verbatim(hf_run, tmp_path):
  """The README's notebook code, run as written in a directory where W is a finished workdir
  (the HF-layout run's) and requests.jsonl holds requests: AR and block-diffusion decoding,
  and rerank on an export with no other argument (the export records its data build)."""
  _, workdir, _, _ = hf_run
  os.symlink(workdir, tmp_path / "W")
  history, candidates = list(range(3)), list(range(10, 20))
  (tmp_path / "requests.jsonl").write_text(json.dumps({"id": "r1", "history": history,
                                                       "candidates": candidates}) + "\n")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  env["GR2JAX_PROGRESS"] = "0"
  result = subprocess.run([sys.executable, "-c", readme_snippet()], capture_output=True,
                          text=True, cwd=tmp_path, timeout=1800, env=env)
  assert result.returncode == 0, result.stderr[-4000:]
  assert "(1, 32)" in result.stdout

