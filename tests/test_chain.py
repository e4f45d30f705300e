"""The GPU-box path on CPU: `table2.py` with an HF recipe on a random-weight Qwen3 checkpoint in the
real HF layout (tests/hf_layout.py), end to end through experiments/run.py -- tokenizer extension,
conversion with the project's tokens, the data build with the paper's prompt, SFT -> AR RL ->
CFT -> OPD -> RL, every Table 2 row, Table 3, Table 4 and Figure 6 -- with two steps per stage,
the first 600 users' data build, 3 history items shown (the paper's 20 make 1,600-token prompts
with this tiny tokenizer) and 16 evaluated users (the smoke's rollout sizes and Figure 6 sweep:
gr2jax/recipes.py `_smoke`); then a single stage checks or runs its upstream, the teacher step
runs and extends its sample, and on that workdir a rerun with other settings is refused touching
nothing, a copy spelt relative reuses every step, a broken step is named, restart moves a run
aside. Those are integration tests (CI runs them after the default tests); the digests' tests,
on recipes and hand-written step records only, run by default: the same digests wherever the
workdir or the checkout lives, and a step recorded before paths inside the checkout were written
"{checkout}/..." reused in place."""

import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

import pytest

from tests.hf_layout import save_qwen3_dir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = os.path.join(REPO, "experiments", "run.py")
SIDS = os.path.join(REPO, "results", "sids_table2.npy")  # skips the RQ-VAE (the tiny run's SIDs)


HF_SMOKE = [f"--config.data.sids_file={SIDS}", "--config.data.users=600",
            "--config.data.eval_subset_size=48", "--config.data.prompt.history_items=3",
            "--config.eval.limit=16", "--config.eval.batch_size=8"]


def _run(workdir, *args, config="table2.py", cwd=REPO):
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device, as a box
  env["GR2JAX_PROGRESS"] = "0"
  return subprocess.run(
    [sys.executable, RUN, f"--config={config}:qwen3_0_6b,smoke", f"--workdir={workdir}",
     *HF_SMOKE, *args],
    capture_output=True, text=True, cwd=cwd, timeout=3600, env=env)  # a loaded shared box


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


@pytest.mark.integration
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
  expected = {"floor", "teacher", "ar_sft", "ar_gr2", "naive", "cft", "opd", "rl", "constrained",
              "lossless"}
  assert rows == {(name, "test_1615") for name in expected}
  by_row = {r["row"]: r for r in table["rows"]}  # the lossless mode answers as AR GR2 does
  assert all(by_row["lossless"][k] == by_row["ar_gr2"][k] for k in ("R@1", "R@3", "valid_rate"))
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_llm_teacher_step_of_the_hf_recipe(hf_run):
  """With --config.teacher.hf_dir a stage names the teacher step as missing upstream, and
  teacher.py runs the smoke teacher through the chain (the HF-layout model as the teacher, GR2's
  chat prompt, a few tokens, batches of 4): 4 users, then the smoke's 8, which extends the sample
  (the first batch's file untouched). The random model accepts nobody: each run ends with its
  summary and one line naming that, after writing its files."""
  hf_dir, workdir, _, _ = hf_run
  teacher = [f"--config.hf_dir={hf_dir}", f"--config.teacher.hf_dir={hf_dir}",
             "--config.teacher.attempts=1", "--config.teacher.max_new_tokens=8",
             "--config.teacher.batch_size=4"]
  result = _run(workdir, *teacher, config="sft.py")
  assert result.returncode != 0 and "Traceback" not in result.stderr
  assert any(" needs teacher" in line for line in result.stderr.splitlines()), result.stderr[-2000:]
  attempts = os.path.join(workdir, "teacher", "attempts")
  for users, batches in ((4, 1), (8, 2)):
    result = _run(workdir, *teacher, *([f"--config.teacher.num_users={users}"] * (users == 4)),
                  config="teacher.py")
    assert "Traceback" not in result.stderr, result.stderr[-4000:]
    assert f"[teacher] {users}/{users} users finished, {users} attempts" in result.stdout
    summary = json.load(open(os.path.join(workdir, "teacher", "summary.json")))
    assert summary["finished"] == users and os.path.exists(summary["traces"])
    if summary["accepted"]:
      assert result.returncode == 0 and os.path.exists(os.path.join(workdir, "teacher",
                                                                    "done.json"))
    else:
      assert result.returncode != 0 and f"the teacher accepted none of {users} users" in (
        result.stderr)
    assert sorted(os.listdir(attempts)) == [f"{b:06d}.jsonl" for b in range(batches)]
    if users == 4:
      first = open(os.path.join(attempts, "000000.jsonl"), "rb").read()
  assert "absorbing the change" in result.stdout
  assert open(os.path.join(attempts, "000000.jsonl"), "rb").read() == first
  new = [json.loads(line)["user"] for line in open(os.path.join(attempts, "000001.jsonl"))]
  assert len(new) == 4 and not set(new) & {json.loads(line)["user"]
                                          for line in first.decode().splitlines()}


def readme_snippet() -> str:
  """The Python block of README.md's "From a notebook" section, verbatim."""
  text = open(os.path.join(REPO, "README.md")).read()
  section = text.split("## From a notebook", 1)[1]
  return section.split("```python\n", 1)[1].split("```", 1)[0]


@pytest.mark.integration
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


# ------------------------------------------------------------------------------ reruns (CLI)
# On the HF-layout run's finished workdir (no second run to build), after the tests above: a
# refused change, a copied workdir, a broken step, a restart (last: it moves SFT aside). The
# teacher's rerun with more users is test_llm_teacher_step_of_the_hf_recipe.


def _files(workdir) -> dict[str, str]:
  """{relative path: sha256} of every file under workdir."""
  from gr2jax import files

  return {os.path.relpath(os.path.join(root, n), workdir): files.file_sha256(os.path.join(root, n))
          for root, _, names in os.walk(workdir) for n in names}


def _recipe(hf_dir, *overrides):
  """The typed recipe of `sft.py:qwen3_0_6b,smoke` + the run's settings + overrides (as run.py
  builds it)."""
  from gr2jax import recipe, recipes

  c = recipes.config("qwen3_0_6b,smoke", "sft")
  for arg in (*HF_SMOKE, f"--config.hf_dir={hf_dir}", *overrides):
    path, value = arg[len("--config."):].split("=", 1)
    *parents, field = path.split(".")
    node = c
    for part in parents:
      node = node[part]
    node[field] = value == "True" if isinstance(node[field], bool) else type(node[field])(value)
  return recipe.from_config(c)


@pytest.mark.integration
def test_rerun_with_another_learning_rate_is_refused_and_touches_nothing(hf_run):
  hf_dir, workdir, _, _ = hf_run
  before = _files(workdir)
  lr = _recipe(hf_dir).stages["sft"].optimizer.learning_rate
  result = _run(workdir, f"--config.hf_dir={hf_dir}",
                "--config.stages.sft.optimizer.learning_rate=0.001", config="sft.py")
  assert result.returncode != 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
  assert f"[chain] sft: {workdir}/sft holds a run made with other settings" in result.stderr
  assert f"optimizer.learning_rate: {lr!r} -> 0.001" in result.stderr
  assert "--config.stages.sft.train.restart=True" in result.stderr and "new --workdir" in (
    result.stderr)
  assert _files(workdir) == before  # every file of the first run, byte for byte


@pytest.mark.integration
def test_copied_workdir_spelt_relative_from_another_directory_reuses_every_step(hf_run,
                                                                              tmp_path):
  hf_dir, workdir, _, _ = hf_run
  copy = tmp_path / "copy"
  shutil.copytree(workdir, copy)
  cwd = tmp_path / "elsewhere"
  cwd.mkdir()
  result = _run(os.path.relpath(copy, cwd), f"--config.hf_dir={hf_dir}", config="sft.py", cwd=cwd)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "[chain 1/2] convert: reusing" in result.stdout
  assert "[chain 2/2] sft: reusing" in result.stdout and "running" not in result.stdout


@pytest.mark.integration
def test_a_broken_done_step_is_named_with_the_command_that_redoes_it(hf_run, tmp_path):
  """An export that lost its manifest is not trusted: ar_rl.py names sft, what is wrong and the
  command; the chain itself redoes sft (its export moved aside, re-exported from its last
  checkpoint)."""
  from gr2jax import chain

  hf_dir, workdir, _, _ = hf_run
  copy = str(tmp_path / "broken")
  shutil.copytree(workdir, copy)
  os.remove(os.path.join(copy, "sft", "export", "params", "manifest.json"))
  recipe = _recipe(hf_dir)
  missing = chain.missing_upstream(recipe, "ar_rl", copy)
  assert list(missing) == ["sft"] and "manifest.json is missing" in missing["sft"]
  with pytest.raises(chain.UpstreamMissing, match="ar_rl needs sft done first .*sft: its done "
                                                  "run is broken: .*manifest.json is missing"):
    chain.run_step(recipe, "ar_rl", copy)
  plans = chain.plan_chain(recipe, copy, ("convert", "sft"))
  assert [p.action for p in plans] == ["reuse", "redo"] and "manifest.json" in plans[1].note


def test_step_digests_do_not_depend_on_where_the_workdir_lives(tmp_path, monkeypatch):
  """Table 2's whole chain (with an LLM teacher trained in the workdir itself): the same digests
  for the workdir spelt absolute or relative, from another directory, or a copy of it."""
  from gr2jax import recipe, recipes, run_identity

  def digests(workdir, teacher):
    c = recipes.config("smoke", "table2")
    c.teacher.hf_dir = teacher
    return run_identity.step_digests(recipe.from_config(c), workdir)

  (tmp_path / "W").mkdir()
  monkeypatch.chdir(tmp_path)
  absolute = digests(str(tmp_path / "W"), str(tmp_path / "W" / "sft" / "export"))
  assert list(absolute) == ["teacher", "sft", "ar_rl", "cft", "opd", "rl"]
  assert digests("W", "W/sft/export") == absolute
  monkeypatch.chdir(tmp_path / "W")
  assert digests(".", "sft/export") == absolute
  assert digests(str(tmp_path / "copy"), str(tmp_path / "copy" / "sft" / "export")) == absolute
  assert digests(".", "../elsewhere/export") != absolute  # another teacher model


def _at_checkout(monkeypatch, root):
  """The tiny recipe's SFT config of gr2jax as if imported from a checkout at `root` (its
  shipped data under it, the data block's default data_dir)."""
  from gr2jax import recipes
  from gr2jax import workdir as workdir_lib

  monkeypatch.setattr(workdir_lib, "CHECKOUT_DIR", str(root))
  c = recipes.config("", "sft")
  c.data.data_dir = str(root / "data" / "amazon_beauty")
  return c


def _done_sft(workdir: str, digest: str, upstream: str, view: dict) -> None:
  """W/sft as the chain leaves a finished step: a complete export and done.json."""
  from gr2jax.data import pipeline

  export = os.path.join(workdir, "sft", "export")
  os.makedirs(export)
  with open(os.path.join(export, "params.bin"), "w") as f:
    f.write("p")
  pipeline.mark_complete(export)
  with open(os.path.join(workdir, "sft", "done.json"), "w") as f:
    json.dump({"digest": digest, "upstream": upstream, "view": view, "seconds": 1.0}, f)


def test_a_moved_or_cloned_checkout_reuses_its_workdirs_steps(tmp_path, monkeypatch):
  """A workdir made with the shipped data of a checkout at one path: the checkout moved (or
  another clone) reuses its steps; another data_dir is refused naming data.data_dir."""
  from gr2jax import chain, recipe, recipes, run_identity

  workdir = str(tmp_path / "W")
  made = recipe.from_config(_at_checkout(monkeypatch, tmp_path / "clone_a"))
  keys = run_identity.step_digests(made, workdir)
  _done_sft(workdir, keys["sft"], run_identity.data_digest(made, workdir),
            run_identity.step_view(made, "sft", workdir))
  assert run_identity.step_view(made, "sft", workdir)["config"]["data"]["data_dir"] == (
    "{checkout}/data/amazon_beauty")

  moved = recipe.from_config(_at_checkout(monkeypatch, tmp_path / "clone_b"))
  assert run_identity.step_digests(moved, workdir) == keys
  assert [(p.step, p.action) for p in chain.plan_chain(moved, workdir, ("sft",))] == [
    ("sft", "reuse")]
  assert "sft" not in chain.missing_upstream(moved, "ar_rl", workdir)

  c = recipes.config("", "sft")
  c.data.data_dir = str(tmp_path / "my_data")
  other = recipe.from_config(c)
  with pytest.raises(chain.StepChanged, match=r"(?s)sft: .* other settings .*data\.data_dir: "
                     r"'\{checkout\}/data/amazon_beauty' -> '" + str(tmp_path / "my_data")):
    chain.plan_chain(other, workdir, ("sft",))


def test_a_moved_checkout_reuses_the_data_build(tmp_path):
  """The data build keys the raw files by content, not by data_dir: the same files at the
  moved checkout's path rebuild nothing (tests/data/test_pipeline.py's small synthetic build)."""
  from gr2jax.data import pipeline
  from tests.data.test_pipeline import _config, write_dataset_with_sids

  first = tmp_path / "clone_a" / "data"
  first.mkdir(parents=True)
  write_dataset_with_sids(first)
  moved = tmp_path / "clone_b" / "data"
  shutil.copytree(first, moved)
  workdir = str(tmp_path / "W")
  assert not any(pipeline.run(_config(first, first / "sids.npy"), workdir)["cached"].values())
  assert all(pipeline.run(_config(moved, moved / "sids.npy"), workdir)["cached"].values())


def test_a_step_recorded_with_the_checkouts_absolute_path_is_reused_and_rewritten(tmp_path,
                                                                                monkeypatch):
  """A done step recorded before "{checkout}/..." (the shipped data's absolute path, the checkout
  where it was): reused, and its done.json rewritten the current way, so it then survives a move
  of the checkout."""
  from gr2jax import chain, recipe, run_identity

  workdir = str(tmp_path / "W")
  r = recipe.from_config(_at_checkout(monkeypatch, tmp_path / "clone_a"))
  old = run_identity.step_digests(r, workdir, checkout=False)
  assert old != run_identity.step_digests(r, workdir)
  view = run_identity.step_view(r, "sft", workdir, checkout=False)
  assert view["config"]["data"]["data_dir"] == str(tmp_path / "clone_a" / "data" / "amazon_beauty")
  _done_sft(workdir, old["sft"], run_identity.data_digest(r, workdir, checkout=False), view)
  assert [p.action for p in chain.plan_chain(r, workdir, ("sft",))] == ["reuse"]
  chain.run_chain(r, workdir, upto="sft")
  done = json.load(open(os.path.join(workdir, "sft", "done.json")))
  assert done["digest"] == run_identity.step_digests(r, workdir)["sft"] and done["seconds"] == 1.0
  assert [p.action for p in chain.plan_chain(
    recipe.from_config(_at_checkout(monkeypatch, tmp_path / "clone_b")), workdir,
    ("sft",))] == ["reuse"]


def _done_stage_export(workdir: str, recipe) -> str:
  """W/sft as a finished training stage leaves it (the chain's digest and completion record): an
  export whose metadata records its data_config and params digest, with its inference bundle
  (decoding/bundle.py's files, stand-ins here); returns the export."""
  from gr2jax import exports, run_identity
  from gr2jax.data import pipeline

  export = os.path.join(workdir, "sft", "export")
  os.makedirs(os.path.join(export, "params", "embed"))
  os.makedirs(os.path.join(export, "inference"))
  for name, text in [("params/embed/value", "p"), (exports.CONFIG_FILE, "{}"),
                     ("tokenizer.json", "{}"), ("tokenizer_config.json", "{}"),
                     ("inference/bundle.json", '{"format": 2}'), ("inference/sids.npy", "s"),
                     (exports.METADATA_FILE, json.dumps({"params_sha256": "d" * 64,
                                                         "data_config": {"users": 0}}))]:
    with open(os.path.join(export, name), "w") as f:
      f.write(text)
  pipeline.mark_complete(export)
  with open(os.path.join(workdir, "sft", "done.json"), "w") as f:
    json.dump({"digest": run_identity.step_digests(recipe, workdir)["sft"],
               "upstream": run_identity.data_digest(recipe, workdir),
               "view": run_identity.step_view(recipe, "sft", workdir), "seconds": 1.0,
               "params_sha256": "d" * 64}, f)
  return export


@pytest.mark.parametrize("lost", [["inference/bundle.json"], ["tokenizer.json"],
                                  ["inference/bundle.json", "inference/sids.npy"]])
def test_an_upstream_export_that_lost_only_its_bundle_names_add_bundle(tmp_path, lost):
  """A stage export that lost only files of its inference bundle (params intact) is not sent
  back to training (AR RL is the longest stage at 8B): the next stage, and the chain reusing
  the step itself, name weights_conversion/add_bundle.py's command line, which repairs it in
  seconds; any other damage still redoes the step."""
  from gr2jax import chain, recipe, recipes

  r = recipe.from_config(recipes.config("", "sft"))
  workdir = str(tmp_path / "W")
  export = _done_stage_export(workdir, r)
  for name in lost:
    os.remove(os.path.join(export, name))
  command = (rf"`python weights_conversion/add_bundle\.py --export={re.escape(export)} "
             rf"--workdir={re.escape(workdir)}`, then rerun this command$")
  with pytest.raises(chain.StepError, match=rf"^\[chain\] ar_rl: its upstream sft's export "
                     rf"{re.escape(export)} lost only files of its inference bundle \("
                     rf"{re.escape(os.path.join(export, lost[0]))} is missing.*\); its params "
                     rf"are intact, so sft needs no retraining: write the bundle again with "
                     + command) as info:
    chain.run_step(r, "ar_rl", workdir)
  assert "\n" not in str(info.value)
  with pytest.raises(chain.StepError, match=r"^\[chain\] sft: its export .* lost only files of "
                                            r"its inference bundle .*" + command):
    chain.plan_chain(r, workdir, ("sft",))
  os.remove(os.path.join(export, "params", "embed", "value"))  # params damaged too: redone
  assert "sft" in chain.missing_upstream(r, "ar_rl", workdir)
  assert [p.action for p in chain.plan_chain(r, workdir, ("sft",))] == ["redo"]


def test_an_upstream_made_with_another_data_dir_names_the_field_and_a_working_command(
    tmp_path, monkeypatch):
  """cft.py with another data.data_dir than W's steps: one line naming data.data_dir (recorded
  -> this run) and the flag that sets it back, not "made with other settings" and an upstream
  command that was refused in turn; the flag it names makes the upstream count as done."""
  from gr2jax import chain, recipe, recipes, run_identity

  workdir = str(tmp_path / "W")
  made = recipe.from_config(_at_checkout(monkeypatch, tmp_path / "clone_a"))
  _done_sft(workdir, run_identity.step_digests(made, workdir)["sft"],
            run_identity.data_digest(made, workdir), run_identity.step_view(made, "sft", workdir))
  c = recipes.config("", "sft")
  c.data.data_dir = str(tmp_path / "my_data")
  shipped = str(tmp_path / "clone_a" / "data" / "amazon_beauty")
  with pytest.raises(chain.StepChanged) as info:
    chain.run_step(recipe.from_config(c), "ar_rl", workdir)
  assert str(info.value) == (
    f"[chain] ar_rl: its upstream sft ({workdir}/sft) was made with other settings (recorded -> "
    f"this run: data.data_dir: '{{checkout}}/data/amazon_beauty' -> '{tmp_path}/my_data'). "
    f"Nothing was changed. To go on: rerun with its settings (--config.data.data_dir={shipped}), "
    "or run every step with these settings in a new workdir (--workdir=<a new directory> "
    "--config.upstream=run)")
  c.data.data_dir = shipped  # the flag it names
  assert "sft" not in chain.missing_upstream(recipe.from_config(c), "ar_rl", workdir)


@pytest.mark.integration
def test_reference_rows_are_on_the_model_rows_users_with_their_n(hf_run, tmp_path):
  """With eval.limit the floor and rule-teacher rows are computed on the same first users as the
  model rows (recomputed from the records, equal to the build's own numbers on the whole
  split), every row carries its n, and the stage times say reused or run."""
  from gr2jax import recipe
  from gr2jax.apps import table2
  from gr2jax.data import pipeline

  hf_dir, workdir, _, _ = hf_run
  summary = pipeline.run(recipe.data_config(_recipe(hf_dir)), workdir)
  whole = table2.reference_rows(summary, ("test_1615",))
  assert [(r["row"], r["num"]) for r in whole] == [("floor", 48), ("teacher", 48)]
  recomputed = table2._reference_metrics(summary, "test_1615", 48)
  for row in whole:
    assert recomputed[row["row"]] == pytest.approx({k: row[k] for k in ("R@1", "R@3", "N@3")})
  first = table2.reference_rows(summary, ("test_1615",), limit=16)
  assert [r["num"] for r in first] == [16, 16]
  assert first[0]["R@1"] == table2._reference_metrics(summary, "test_1615", 16)["floor"]["R@1"]
  table = json.load(open(os.path.join(workdir, "results", "table2.json")))
  assert {r["num"] for r in table["rows"]} == {16}  # the HF-layout run's table: one n per split
  timings = {"data": {"seconds": 3.2, "how": "cached"}, "sft": {"seconds": 61.0, "how": "reused"},
             "total": {"seconds": 9.0, "how": "this run"}}
  model = {"row": "ar_sft", "label": "AR GR2 (SFT)", "split": "test_1615", "num": 16, "R@1": 0.25}
  md = table2.write_tables(first + [model], timings, {"recipe": "tiny"}, str(tmp_path))
  assert md.splitlines()[0].startswith("| split | row | num | R@1 |")
  assert all(line.split(" | ")[2] == "16" for line in md.splitlines()[2:5])
  assert "data 3 (cached), sft 61 (reused), total 9 (this run)" in md


@pytest.mark.integration
def test_restart_moves_the_run_aside_and_its_settings_move_it_back(hf_run, tmp_path,
                                                                  monkeypatch):
  """run_chain with restart=True and another learning rate (on a copy; the loop stubbed: it
  leaves an export as a finished run does): the first run is moved whole and byte-identical to
  W/sft.<its digest>; the first settings then move it back and reuse it, training nothing, and
  the second run is kept aside in its turn. The command-line run is the slow test below."""
  from gr2jax import chain
  from gr2jax.train import loop

  hf_dir, workdir, _, _ = hf_run
  copy = str(tmp_path / "W")
  shutil.copytree(workdir, copy)
  before = _files(os.path.join(copy, "sft"))
  first = json.load(open(os.path.join(copy, "sft", "done.json")))["digest"]
  aside = os.path.join(copy, f"sft.{first}")
  trained = []

  def train(config, workdir, stage, ctx):
    trained.append(config.optimizer.learning_rate)
    assert not config.train.restart  # the chain moved the run aside itself
    shutil.copytree(os.path.join(aside, "export"), os.path.join(workdir, "sft", "export"))

  monkeypatch.setattr(loop, "train", train)
  monkeypatch.setattr(loop, "load_context", lambda config, workdir: loop.Context(
    config, None, None, None, None, 0, 0, None, workdir))
  changed = _recipe(hf_dir, "--config.stages.sft.optimizer.learning_rate=0.001",
                    "--config.stages.sft.train.restart=True")
  assert chain.run_chain(changed, copy, upto="sft")["sft"]["how"] == "run" and trained == [0.001]
  assert _files(aside) == before
  second = json.load(open(os.path.join(copy, "sft", "done.json")))["digest"]
  assert chain.run_chain(_recipe(hf_dir), copy, upto="sft")["sft"]["how"] == "reused"
  assert trained == [0.001]
  assert _files(os.path.join(copy, "sft")) == before
  assert os.path.isfile(os.path.join(copy, f"sft.{second}", "done.json"))


@pytest.mark.integration
@pytest.mark.slow  # a second SFT, on the command line
def test_restart_on_the_command_line_moves_the_run_aside(hf_run):
  """restart=True with another learning rate: the first run is moved, whole and byte-identical,
  to W/sft.<its digest>, and a new one trained; the first settings would move it back."""
  from gr2jax import chain

  hf_dir, workdir, _, _ = hf_run
  before = _files(os.path.join(workdir, "sft"))
  digest = json.load(open(os.path.join(workdir, "sft", "done.json")))["digest"]
  result = _run(workdir, f"--config.hf_dir={hf_dir}", "--config.stages.sft.train.restart=True",
                "--config.stages.sft.optimizer.learning_rate=0.001", config="sft.py")
  assert result.returncode == 0, result.stderr[-3000:]
  aside = os.path.join(workdir, f"sft.{digest}")
  assert f"moved the previous run to {aside}" in result.stdout
  assert _files(aside) == before
  assert chain.plan_chain(_recipe(hf_dir), workdir, ("sft",))[0].action == "swap"
