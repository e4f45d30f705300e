"""Tests for gr2jax/data/llm_teacher.py: the rejection rule, a scripted teacher (fixed texts
through the real sample_fn seam) checked against the exact JSONL, the real path on a random-weight
Qwen3 in the HF layout, resume after SIGKILL, the lock, and the data build reading the traces.

Run as a script (`python tests/data/test_llm_teacher.py OUT_DIR WORKDIR DATA_DIR`) it is the
teacher process the kill-and-rerun test kills: a scripted, slow teacher on the toy build.
"""

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
if REPO not in sys.path:
  sys.path.insert(0, REPO)

from gr2jax import (  # noqa: E402
  files,
  recipes,  # noqa: E402
  workdir,
)
from gr2jax import recipe as recipe_lib  # noqa: E402
from gr2jax.apps import table2  # noqa: E402
from gr2jax.data import llm_teacher, pipeline, prompts, rqvae, teacher  # noqa: E402
from gr2jax.data import tokenizer as tokenizer_lib  # noqa: E402
from gr2jax.train import teacher_stage  # noqa: E402
from tests.data.test_pipeline import _config, _write_dataset  # noqa: E402

TINY = recipe_lib.teacher_spec(recipe_lib.from_config(recipes.config("", "teacher")))


def _spec(**fields) -> llm_teacher.TeacherSpec:
  """The tiny recipe's teacher spec with `fields` replaced (checked like any spec)."""
  return dataclasses.replace(TINY, **fields)

N = 10
SLOTS = [prompts.slot_token(s) for s in range(N)]


def _answer(slots, reasoning="because"):
  """A 'data'-format response (the build's answer format: slot labels)."""
  return (f"<think>\n{reasoning}\n</think>\n\n"
          + json.dumps({"ranking": [SLOTS[s] for s in slots]}, separators=(",", ":"))
          + prompts.IM_END)


def _first(target):
  """A valid ranking with the target first."""
  return [target] + [s for s in range(N) if s != target]


def _wrong(target):
  """A valid ranking with another candidate first."""
  other = (target + 1) % N
  return [other] + [s for s in range(N) if s != other]


def _duplicate(target):
  return [target] * 2 + [s for s in range(N) if s != target][:N - 2]


@pytest.fixture(scope="module")
def build(tmp_path_factory):
  """(data config, workdir) of a built toy data build (test_pipeline's dataset)."""
  data_dir = tmp_path_factory.mktemp("beauty")
  _write_dataset(data_dir)
  codes = np.random.default_rng(0).integers(0, 16, size=(300, 3))
  rqvae.save_sids(data_dir / "sids.npy", rqvae.semantic_ids(codes))
  config = _config(data_dir, data_dir / "sids.npy")
  work = str(tmp_path_factory.mktemp("work"))
  pipeline.run(config, work)
  return config, work


def _users(config, work, spec):
  """The selected users' examples in processing order, their prompts (ids) and the tokenizer."""
  summary = pipeline.run(config, work)
  catalog, examples = pipeline.training_lists(config, work)
  chosen = [examples[i] for i in llm_teacher.select_users(len(examples), spec.num_users,
                                                          spec.seed)]
  tok = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  sids = rqvae.load_sids(summary["paths"]["sids"], catalog.num_items)
  ids = llm_teacher.encode_prompts(chosen, catalog, sids, prompts.prompt_config(config), tok,
                                   "data", config.max_history)
  return chosen, ids, tok


class Scripted:
  """A stand-in teacher: attempt j of a user answers script[user][j - 1](target) (a function of
  the user's target slot); the user is recognised by its prompt, which is all the model sees."""

  def __init__(self, chosen, ids, script, delay=0.0):
    self.by_prompt = {tuple(p.tolist()): e for p, e in zip(ids, chosen, strict=True)}
    self.script, self.delay = script, delay
    self.calls, self.batches = {}, []

  def __call__(self, prompt_ids, key):
    assert key is not None
    time.sleep(self.delay)
    texts, users = [], []
    for p in prompt_ids:
      example = self.by_prompt[tuple(p.tolist())]
      j = self.calls[example.user] = self.calls.get(example.user, 0) + 1
      texts.append(self.script[example.user][(j - 1) % len(self.script[example.user])](
        example.target_position))
      users.append(example.user)
    self.batches.append(users)
    return texts, np.asarray([len(t) for t in texts])


def test_judge_applies_the_rejection_rule():
  labels = tuple(SLOTS)
  judge = llm_teacher.judge
  assert judge(_answer(_first(3)), labels, 3, "data").kind == "accepted"
  assert judge(_answer(_first(3), "x"), labels, 3, "data").reasoning == "x"
  assert judge(_answer(_wrong(3)), labels, 3, "data").kind == "wrong_top1"
  assert judge(_answer(_duplicate(3)), labels, 3, "data").kind == "duplicate"
  assert judge("<think>\nhm\n</think>\n\n{oops", labels, 3, "data").kind == "truncated"
  assert judge("<think>\nhm\n</think>\n\nno json", labels, 3, "data").kind == "malformed_json"
  no_think = json.dumps({"ranking": [SLOTS[s] for s in _first(3)]})
  assert judge(no_think, labels, 3, "data").kind == "no_reasoning"
  chat = json.dumps({"reasoning": "H2 shares the brand", "ranking": [SLOTS[s] for s in _first(3)]})
  verdict = judge(chat + prompts.IM_END, labels, 3, "chat")
  assert verdict.kind == "accepted" and verdict.reasoning == "H2 shares the brand"
  assert verdict.ranking.tolist() == _first(3)
  blank = json.dumps({"reasoning": " ", "ranking": [SLOTS[s] for s in _first(3)]})
  assert judge(blank, labels, 3, "chat").kind == "no_reasoning"
  assert judge(no_think, labels, 3, "chat").kind == "no_reasoning"


def test_spec_checks_its_fields():
  with pytest.raises(ValueError, match="prompt"):
    _spec(prompt="free")
  with pytest.raises(ValueError, match="greedy"):
    _spec(temperature=0.0, attempts=2)
  with pytest.raises(ValueError, match="attempts"):
    _spec(attempts=0)


def test_scripted_teacher_acceptance_attempts_and_exact_jsonl(build, tmp_path):
  config, work = build
  spec = _spec(prompt="data", attempts=3, batch_size=2, num_users=4, temperature=1.0)
  out = tmp_path / "teacher"
  chosen, ids, _ = _users(config, work, spec)
  u = [e.user for e in chosen]
  ok = lambda t: _answer(_first(t), f"trace for slot {t}")
  script = {u[0]: [ok],
            u[1]: [lambda t: _answer(_wrong(t)), ok],
            u[2]: [lambda t: "<think>\nx\n</think>\n\n{\"ranking\": 3}" + prompts.IM_END,
                   lambda t: _answer(_duplicate(t)), lambda t: _answer(_wrong(t))],
            u[3]: [lambda t: _answer(_duplicate(t)), ok]}
  scripted = Scripted(chosen, ids, script)
  assert len(scripted.by_prompt) == len(chosen)  # the stand-in tells the users apart
  summary = teacher_stage.run(spec, config, work, sample_fn=scripted, out_dir=str(out))

  # retries first, then new users; every batch full but the last
  assert scripted.batches == [[u[0], u[1]], [u[1], u[2]], [u[2], u[3]], [u[2], u[3]]]
  rows = [json.loads(line) for f in sorted(os.listdir(out / "attempts"))
          for line in open(out / "attempts" / f)]
  assert sorted(os.listdir(out / "attempts")) == [f"{i:06d}.jsonl" for i in range(4)]
  assert [(r["user"], r["attempt"], r["kind"]) for r in rows] == [
    (u[0], 1, "accepted"), (u[1], 1, "wrong_top1"), (u[1], 2, "accepted"),
    (u[2], 1, "malformed_json"), (u[2], 2, "duplicate"), (u[3], 1, "duplicate"),
    (u[2], 3, "wrong_top1"), (u[3], 2, "accepted")]
  digest = summary["teacher"]
  by_user = {e.user: e for e in chosen}
  expected = [{"user": user, "reasoning": f"trace for slot {by_user[user].target_position}",
               "ranking": _first(by_user[user].target_position), "attempts": attempts,
               "teacher": digest} for user, attempts in sorted([(u[0], 1), (u[1], 2), (u[3], 2)])]
  assert (out / "traces.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in expected)
  assert summary["acceptance_at_attempt"] == {"1": 0.25, "2": 0.75, "3": 0.75}
  assert summary["accepted_at_attempt"] == {"1": 1, "2": 2, "3": 0}
  assert summary["failures"] == {"wrong_top1": 2, "no_reasoning": 0, "malformed_json": 1,
                                 "duplicate": 2, "omitted": 0, "out_of_set": 0, "truncated": 0}
  assert summary["attempts"] == 8 and summary["accepted"] == 3 and summary["finished"] == 4
  assert summary["first_attempt_top1_hit"] == pytest.approx(
    np.mean([1] + [by_user[x].target_position == 0 for x in u[1:]]))
  assert json.loads((out / "summary.json").read_text())["traces_sha256"] == \
    files.file_sha256(str(out / "traces.jsonl"))

  # a rerun of the same command has nothing left to sample
  def never(prompt_ids, key):
    raise AssertionError("a finished run sampled again")

  assert teacher_stage.run(spec, config, work, sample_fn=never, out_dir=str(out))["accepted"] == 3
  # another setting on the same output is refused, naming the ways on
  with pytest.raises(ValueError, match="written by teacher .*teacher.restart=True"):
    teacher_stage.run(_spec(**{**spec.__dict__, "temperature": 0.5}), config,
                      work, sample_fn=never, out_dir=str(out))

  # the loader reads the output, and the data build trains on exactly the traced users
  _, examples = pipeline.training_lists(config, work)
  traces, stats = teacher.load_traces(out / "traces.jsonl", examples, strict=True)
  assert [t.example.user for t in traces] == [r["user"] for r in expected]
  assert stats["teachers"] == [digest] and stats["acceptance"] == 1.0
  traced = config.copy_and_resolve_references()
  traced.teacher_traces = str(out / "traces.jsonl")
  built = pipeline.run(traced, str(tmp_path / "student"))
  assert built["splits"]["train"] == 3  # only the LLM-traced users, not the rule teacher's
  assert built["teacher_traces"] == {"file": str(out / "traces.jsonl"),
                                     "sha256": files.file_sha256(traced.teacher_traces),
                                     "teachers": [digest]}
  from gr2jax.data import tfds_builder

  source = tfds_builder.data_source(built["paths"]["tfds"], "train")
  records = [tfds_builder.decode_record(source[i]) for i in range(len(source))]
  assert sorted(r["user"] for r in records) == [r["user"] for r in expected]
  record = next(r for r in records if r["user"] == expected[0]["user"])
  assert record["reasoning"] == prompts.think_block(expected[0]["reasoning"])
  provenance = table2.provenance(built, str(tmp_path / "student"))
  assert provenance["sids_file"].startswith("{workdir}/")  # no path of this machine
  assert provenance["teacher_traces_sha256"] == built["teacher_traces"]["sha256"][:16]
  assert provenance["teacher_digests"] == digest


def test_a_teacher_that_accepts_nobody_says_so_and_fails(build, tmp_path, capsys):
  """The run ends with its own summary line; with nobody accepted it fails after writing its
  files (the empty traces would give the data build no training example)."""
  config, work = build
  spec = _spec(prompt="data", attempts=2, batch_size=4, num_users=3)
  chosen, ids, _ = _users(config, work, spec)
  wrong = Scripted(chosen, ids, {e.user: [lambda t: _answer(_wrong(t))] for e in chosen})
  out = tmp_path / "teacher"
  with pytest.raises(llm_teacher.NoTracesError, match=r"accepted none of 3 users \(6 attempts, "
                                                       r"up to 2 each; failures: wrong_top1 6\)"):
    teacher_stage.run(spec, config, work, sample_fn=wrong, out_dir=str(out))
  assert "[teacher] 3/3 users finished, 6 attempts, accepted 0 (acceptance 0.000); failures: " \
    f"wrong_top1=6; traces: {out / 'traces.jsonl'}" in capsys.readouterr().out
  assert (out / "traces.jsonl").read_text() == "" and (out / "summary.json").exists()


def test_two_runs_on_one_output_are_refused(build, tmp_path):
  from tests.test_workdir import _holder

  config, work = build
  out = tmp_path / "teacher"
  holder = _holder(str(out))
  try:
    with pytest.raises(workdir.InUseError, match=f"in use by pid {holder.pid}"):
      teacher_stage.run(_spec(prompt="data"), config, work,
                        sample_fn=lambda p, k: ([], np.zeros(0)), out_dir=str(out))
  finally:
    holder.kill()
    holder.wait()


@pytest.mark.integration
def test_real_path_on_a_random_qwen3_in_the_hf_layout(build, tmp_path):
  """The default sampler: load_model of an HF dir, sharded params, generate in static batches
  (the last padded), the chat template with thinking off."""
  from tests.hf_layout import save_qwen3_dir

  config, work = build
  hf_dir = save_qwen3_dir(tmp_path / "Qwen3-tiny")
  spec = _spec(hf_dir=hf_dir, prompt="chat", attempts=2, batch_size=4,
                 num_users=5, max_new_tokens=12, temperature=1.0, top_p=0.9, mesh=(1, 4, 2))
  try:
    summary = teacher_stage.run(spec, config, work, out_dir=str(tmp_path / "teacher"))
  except llm_teacher.NoTracesError:  # 12 random tokens: nobody accepted (the files are written)
    summary = json.load(open(tmp_path / "teacher" / "summary.json"))
  rows = [json.loads(line) for f in sorted(os.listdir(tmp_path / "teacher" / "attempts"))
          for line in open(tmp_path / "teacher" / "attempts" / f)]
  # 4 users, their retries, then the fifth user and its retry (one row each, padded to 4)
  assert [r["user"] for r in rows[:4]] == [r["user"] for r in rows[4:8]]
  assert len(os.listdir(tmp_path / "teacher" / "attempts")) == 4
  assert summary["finished"] == 5 and summary["attempts"] == 10 == len(rows)
  assert {r["kind"] for r in rows} <= set(llm_teacher.KINDS)
  assert all(0 < r["tokens"] <= 12 for r in rows)
  assert summary["tokens_per_s"] > 0 and summary["teacher"] == rows[0]["teacher"]
  # the prompt: the tokenizer's own chat template, thinking off, every candidate, no target
  tok = tokenizer_lib.load_tokenizer(hf_dir)
  catalog, examples = pipeline.training_lists(config, work)
  example = examples[llm_teacher.select_users(len(examples), 5, 0)[0]]
  sids = rqvae.load_sids(pipeline.run(config, work)["paths"]["sids"], catalog.num_items)
  (ids,) = llm_teacher.encode_prompts([example], catalog, sids, prompts.prompt_config(config),
                                      tok, "chat", config.max_history)
  text = tok.decode(ids.tolist())
  assert text.startswith("<|im_start|>system\n" + prompts.REJECTION_SYSTEM)
  assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
  assert all(s in text for s in SLOTS) and "target" not in text.lower()
  assert text.count("\nH") >= len(example.history)


def _script_for(examples):
  """The kill test's deterministic teacher: a user is accepted at attempt (user % 3) + 1."""
  def reply(user):
    return [lambda t: _answer(_wrong(t))] * (user % 3) + [lambda t: _answer(_first(t))]
  return {e.user: reply(e.user) for e in examples}


KILL_SPEC = dict(prompt="data", attempts=2, batch_size=8, temperature=1.0, num_users=120)


def _kill_target(out_dir, work, data_dir):
  """The process the kill test kills: a slow scripted teacher on the toy build."""
  config = _config(data_dir, os.path.join(data_dir, "sids.npy"))
  spec = _spec(**KILL_SPEC)
  chosen, ids, _ = _users(config, work, spec)
  teacher_stage.run(spec, config, work, sample_fn=Scripted(chosen, ids, _script_for(chosen),
                                                           delay=0.3), out_dir=out_dir)


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_loses_and_duplicates_no_user(build, tmp_path):
  config, work = build
  out = tmp_path / "teacher"
  proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), str(out), work,
                           config.data_dir], cwd=REPO, env={**os.environ, "GR2JAX_PROGRESS": "0"})
  try:
    deadline = time.time() + 120
    while not (out / "attempts").is_dir() or len(os.listdir(out / "attempts")) < 4:
      assert proc.poll() is None and time.time() < deadline, "the teacher process did not start"
      time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
  finally:
    proc.kill()
    proc.wait()
  assert not (out / "traces.jsonl").exists()
  for name in os.listdir(out / "attempts"):  # finished batches only, each wholly readable
    if name.endswith(".jsonl"):
      assert all(json.loads(line) for line in open(out / "attempts" / name))
  killed = [json.loads(line) for f in sorted(os.listdir(out / "attempts")) if
            f.endswith(".jsonl") for line in open(out / "attempts" / f)]

  spec = _spec(**KILL_SPEC)
  chosen, ids, _ = _users(config, work, spec)
  summary = teacher_stage.run(spec, config, work, sample_fn=Scripted(chosen, ids,
                                                                     _script_for(chosen)),
                              out_dir=str(out))
  rows = [json.loads(line) for f in sorted(os.listdir(out / "attempts"))
          for line in open(out / "attempts" / f)]
  assert rows[:len(killed)] == killed and len(killed) < len(rows)
  attempts = {}
  for r in rows:  # every user's attempts numbered 1, 2, ... exactly once
    assert r["attempt"] == attempts.get(r["user"], 0) + 1
    attempts[r["user"]] = r["attempt"]
  assert sorted(attempts) == sorted(e.user for e in chosen)  # no user lost
  traces = [json.loads(line) for line in open(out / "traces.jsonl")]
  users = [t["user"] for t in traces]
  assert users == sorted(set(users))  # none twice
  accepted = {r["user"] for r in rows if r["kind"] == "accepted"}
  assert set(users) == accepted and summary["accepted"] == len(accepted)
  assert summary["finished"] == KILL_SPEC["num_users"]


MULTI_SPEC = dict(prompt="chat", attempts=2, batch_size=2, num_users=3, max_new_tokens=6,
                  temperature=1.0, mesh=(1, 2, 2))


def _multihost_worker(process_id, num_processes, port, hf_dir, work, out_dir, data_dir):
  """One process of the multi-process teacher job (2 CPU devices each; a 4-device mesh)."""
  import jax

  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  if num_processes > 1:
    jax.distributed.initialize(f"localhost:{port}", num_processes, process_id)
  config = _config(data_dir, os.path.join(data_dir, "sids.npy"))
  spec = _spec(**MULTI_SPEC, hf_dir=hf_dir, out_dir=out_dir)
  summary = teacher_stage.run(spec, config, work)
  with open(os.path.join(os.path.dirname(out_dir), f"summary_{process_id}.json"), "w") as f:
    json.dump({k: v for k, v in summary.items() if k not in ("spec", "traces_sha256")}, f)
  if num_processes > 1:
    jax.distributed.shutdown()


@pytest.mark.slow
def test_two_processes_write_one_output_equal_to_one_process(build, tmp_path):
  """Multi-host on one machine: 2 processes x 2 CPU devices (gloo) sample the same batches over
  one 4-device mesh, each placing its own rows; process 0 alone writes, and the output equals a
  single process's on a 4-device mesh of the same shape."""
  import shutil

  from tests.hf_layout import save_qwen3_dir
  from tests.train.test_multiprocess import _free_port

  config, work = build
  hf_dir = save_qwen3_dir(tmp_path / "Qwen3-tiny")
  env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": REPO, "GR2JAX_PROGRESS": "0",
         "XLA_FLAGS": "--xla_force_host_platform_device_count=2"}

  def launch(name, num_processes, devices):
    os.makedirs(tmp_path / name)
    port = _free_port()
    procs = []
    for i in range(num_processes):
      copy = str(tmp_path / name / f"work{i}")  # per-process data build (one lock per host)
      shutil.copytree(work, copy)
      procs.append(subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "multihost", str(i), str(num_processes),
         str(port), hf_dir, copy, str(tmp_path / name / "teacher"), config.data_dir],
        env={**env, "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for p in procs:
      out = p.communicate(timeout=600)[0]
      assert p.returncode == 0, out[-4000:]
    return tmp_path / name

  multi, single = launch("multi", 2, 2), launch("single", 1, 4)
  read = lambda d, f: [json.loads(line) for line in open(d / "teacher" / "attempts" / f)]
  files = sorted(os.listdir(multi / "teacher" / "attempts"))
  assert files == sorted(os.listdir(single / "teacher" / "attempts")) and files
  for f in files:  # the same users, attempts and sampled texts
    assert read(multi, f) == read(single, f)
  assert (multi / "teacher" / "traces.jsonl").read_text() == \
    (single / "teacher" / "traces.jsonl").read_text()
  summaries = [json.loads((multi / f"summary_{i}.json").read_text()) for i in range(2)]
  assert summaries[0]["finished"] == summaries[1]["finished"] == 3  # every process ran it all
  assert not os.path.exists(multi / "work1" / "teacher")  # nothing written by process 1


if __name__ == "__main__":
  if sys.argv[1] == "multihost":
    _multihost_worker(int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:9])
  else:
    _kill_target(*sys.argv[1:4])
