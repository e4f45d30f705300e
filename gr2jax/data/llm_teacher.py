"""GR2's teacher stage: reasoning traces written by a local LLM, rejection-sampled (GR2, arXiv
2602.07774).

  python experiments/run.py --config=teacher.py --config.teacher.hf_dir=/models/Qwen3-32B \
      --workdir=W

The teacher writes, for each training user of the data build, a response to a prompt showing the
user's history and all N candidates, never the target. Which users: every training list of the
build (`pipeline.training_lists`: none dropped by the rule teacher, as a build that reads
`data.teacher_traces` keeps them), or a seeded sample of `num_users` of them. A response is parsed
by the project's answer parser (data/answer.py); rejection sampling (GR2) draws up to `attempts`
samples per user and keeps the FIRST VALID ATTEMPT WHOSE TOP-1 IS THE TARGET. That criterion is
our reading: the paper says only that the teacher's "predicted item" must equal the ground truth,
and gives no attempt budget (GR2, arXiv 2602.07774; our reading). Each attempt gets a kind:
'accepted',
'wrong_top1' (valid, another top-1), 'no_reasoning' (valid ranking, no reasoning text) or the
parser's failure kind (malformed_json, duplicate, omitted, out_of_set, truncated).

Prompt formats (`TeacherSpec.prompt`):
  'chat'  GR2's rejection prompt (prompts.render_rejection_messages: the principles of §1.3; the
          whole kept history, every item with its SID, brand, category and title) through the
          teacher tokenizer's own chat template with thinking off (`enable_thinking=False`);
          the answer is one JSON object {"reasoning": str, "ranking": [labels, best first]}.
  'data'  the data build's own prompt (prompts.prompt_config), as a model trained by this
          project reads it (e.g. the tiny AR GR2 SFT export); the reasoning is the response's
          `<think>` block (answer.reasoning_text), the answer its JSON ranking.
Labels are the build's candidate labels (slot tokens or SIDs), so a trace cites candidates as the
student's prompt shows them.

Sampling: `sample_fn(prompts, key) -> (texts, lengths)`. The teacher stage
(gr2jax/train/teacher_stage.py, its `model_sampler`) loads the teacher with load.load_model (a
gr2jax checkpoint or any local HF Qwen3 directory; bf16 on accelerators), shards its params over the
mesh (model/sharding.py specs on train/mesh.py's ('data', 'fsdp', 'tp') mesh) and samples with
model/generate.py in static batches: `batch_size` rows (the last batch padded by repeating a row),
one prompt width (the longest prompt of the selected users, rounded up to 16), `max_new_tokens`, so
nothing recompiles. Batch b samples with fold_in(key(seed), b). A batch holds first the next attempt
of every user whose last attempt failed, then new users, so batches stay full and each user gets
only the attempts it needs.

Files under the output directory (W/teacher, the chain's teacher step; teacher_stage.run's
`out_dir` elsewhere):
  attempts/NNNNNN.jsonl  batch NNNNNN: one row per attempt {"user", "attempt" (1-based), "kind",
                         "ranking" (slots, best first; null unless valid), "reasoning" (null
                         unless valid), "response", "tokens", "teacher"}, written under a temp
                         name and renamed once complete: a SIGKILL loses at most the batch in
                         flight and never leaves a partial line.
  traces.jsonl           the accepted traces {"user", "reasoning", "ranking", "attempts",
                         "teacher"} (user order): what `data.teacher_traces` /
                         teacher.load_traces read; rewritten atomically when every user is done.
  summary.json           acceptance by attempt, failures by kind, reasoning length, tokens/s.
The "teacher" digest names the model (the content of every file of its directory), the sampling
settings and the data build; a rerun with another digest on the same output is refused
(`teacher.restart=True` makes the chain move the previous output aside first). The run ends with
its summary printed (users, attempts, accepted, the traces file) and fails (NoTracesError, after
writing the files) when it accepted nobody: an empty traces file would give the data build no
training example.

Resume: a rerun of the same command reads attempts/ and continues where it stopped: finished
users are skipped, a user with failed attempts resumes at its next attempt; a larger `num_users`
extends the sample (the first users of the same seeded permutation; the rows of the first ones
are not touched), a smaller one is its prefix. The output directory is locked for the run
(workdir.lock_workdir): a second run on it fails at once.

Multi-host (`run.py --multihost`): the model is one SPMD program over the global mesh, so every
process runs the same batches; each process places only its own devices' rows of a batch, i.e. its
own users (model/sharding.global_arrays), the responses are gathered to every process
(host_arrays), and process 0 alone reads the resume state (broadcast to the others), holds the lock
and writes the one output.
"""

import collections
import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from gr2jax import files, metrics, settings
from gr2jax.data import answer, build_settings, prompts
from gr2jax.data.records import Catalog, RerankExample
from gr2jax.progress import progress

KINDS = ("accepted", "wrong_top1", "no_reasoning") + tuple(k for k in answer.KINDS
                                                           if k != "valid")
ATTEMPTS_DIR = "attempts"
TRACES_FILE = "traces.jsonl"
SUMMARY_FILE = "summary.json"
_BATCH_FILE = re.compile(r"(\d{6})\.jsonl")

class NoTracesError(RuntimeError):
  """The teacher accepted no user: its traces file is empty (the message says what it tried)."""


# (prompts: [B'] token-id arrays, B' <= batch_size; key) -> (B' response texts, [B'] tokens)
SampleFn = Callable[[Sequence[np.ndarray], jax.Array], tuple[list[str], np.ndarray]]


def _mesh_shape(values: tuple) -> str:
  """'' for a mesh of three sizes, else what it must be (settings.items' rule)."""
  return "" if len(values) == 3 else "(data, fsdp, tp)"


@dataclasses.dataclass(frozen=True, kw_only=True)
class TeacherSpec(build_settings.TeacherSettings):
  """The teacher stage's settings: a recipe's `teacher` block (TeacherSettings) on the recipe's
  mesh; recipe.teacher_spec builds it."""

  mesh: tuple[int, int, int] = settings.items(
    doc="(data, fsdp, tp) sizes; one may be -1 (the remaining devices)", what="3 mesh sizes",
    item=lambda where, name, v: settings.check_int(where, name, v, minimum=-1),
    rule=_mesh_shape)


@dataclasses.dataclass(frozen=True)
class Attempt:
  """The verdict on one response.

  Attributes:
    kind: one of KINDS.
    ranking: [N] int32 slots, best first, when the answer is valid; else None.
    reasoning: the reasoning text when the answer is valid and has one; else None.
  """

  kind: str
  ranking: np.ndarray | None
  reasoning: str | None


def _json_reasoning(text: str) -> str | None:
  """The non-blank "reasoning" string of a response's JSON answer (parse_answer found the JSON
  valid: one object after the think block, up to the end of turn), else None."""
  for stop in (prompts.IM_END, prompts.END_OF_TEXT):
    text = text.split(stop, 1)[0]
  if prompts.THINK_END in text:
    text = text.split(prompts.THINK_END, 1)[1]
  value = json.loads(text[text.find("{"):]).get("reasoning")
  return value.strip() if isinstance(value, str) and value.strip() else None


def judge(text: str, labels: Sequence[str], target_position: int, prompt_format: str) -> Attempt:
  """Parses one response and applies GR2's rejection criterion (module docstring).

  Args:
    text: the decoded response (special tokens kept).
    labels: [N] the candidates' labels in D's order.
    target_position: the target's slot in D.
    prompt_format: 'chat' (reasoning = the JSON's "reasoning") or 'data' (the think block).

  Returns:
    The Attempt: 'accepted' iff the answer is a valid permutation with the target first and
    carries a reasoning text ('data': a think block, possibly empty, as the rule teacher's).
  """
  result = answer.parse_answer(text, labels)
  if not result.valid:
    return Attempt(result.kind, None, None)
  if prompt_format == "chat":
    reasoning = _json_reasoning(text)
  else:
    reasoning = answer.reasoning_text(text) if prompts.THINK_START in text else None
  if reasoning is None:
    return Attempt("no_reasoning", result.ranking, None)
  kind = "accepted" if int(result.ranking[0]) == target_position else "wrong_top1"
  return Attempt(kind, result.ranking, reasoning)


def select_users(num_examples: int, num_users: int, seed: int) -> np.ndarray:
  """[U] indices of the training lists the teacher answers, in processing order: the first
  `num_users` (0 = all) of a seeded permutation, so a larger num_users extends a smaller one."""
  order = np.random.default_rng(seed).permutation(num_examples)
  return order[:num_users] if num_users else order


def encode_prompts(examples: Sequence[RerankExample], catalog: Catalog, sids: np.ndarray,
                   prompt_config: prompts.PromptConfig, tokenizer, prompt_format: str,
                   history_items: int) -> list[np.ndarray]:
  """Token ids of each example's teacher prompt (no target anywhere).

  Args:
    examples: the users' examples.
    catalog, sids: item metadata and [I, L] semantic IDs.
    prompt_config: the data build's PromptConfig (labels; the 'data' prompt itself).
    tokenizer: the teacher's tokenizer ('chat' needs its chat template).
    prompt_format: 'chat' or 'data'.
    history_items: history items the 'chat' prompt shows (the build's max_history: all kept).

  Returns:
    [E] int32 token-id arrays.
  """
  if prompt_format == "data":
    texts = [prompts.render_prompt(e, catalog, sids, prompt_config) for e in examples]
  else:
    if not getattr(tokenizer, "chat_template", None):
      raise ValueError("teacher.prompt='chat' needs a tokenizer with a chat template (an HF "
                       "Qwen3 directory's); set teacher.tokenizer_dir or use prompt='data'")
    shown = dataclasses.replace(prompt_config, style="chat", evidence="raw",
                                fields=prompts.FIELDS, history_items=history_items)
    texts = [tokenizer.apply_chat_template(
      prompts.render_rejection_messages(e, catalog, sids, shown), tokenize=False,
      add_generation_prompt=True, enable_thinking=False) for e in examples]
  ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
  return [np.asarray(i, np.int32) for i in ids]


def model_digest(path: str) -> str:
  """sha256 over (relative path, content digest) of every file under a model directory (files
  hashed in parallel threads: a 64 GB checkpoint is read once at disk speed)."""
  rels = sorted(os.path.relpath(os.path.join(root, name), path)
                for root, _, names in os.walk(path) for name in names)
  if not rels:
    raise FileNotFoundError(f"teacher.hf_dir={path!r} holds no files")
  with concurrent.futures.ThreadPoolExecutor(min(16, len(rels))) as pool:
    digests = list(pool.map(lambda rel: files.file_sha256(os.path.join(path, rel)), rels))
  return hashlib.sha256(json.dumps(list(zip(rels, digests, strict=True))).encode()).hexdigest()


def teacher_digest(spec: TeacherSpec, model: str, data_config) -> str:
  """The digest rows carry: the model's content digest, what shapes its samples (prompt format,
  tokenizer, sampling settings, attempts) and the data build's config."""
  sampling = {f: getattr(spec, f) for f in ("prompt", "attempts", "temperature", "top_p",
                                            "max_new_tokens", "param_dtype", "seed")}
  tok = (model_digest(spec.tokenizer_dir) if spec.tokenizer_dir else "")
  data = data_config.to_dict() if hasattr(data_config, "to_dict") else data_config
  return files.json_digest([model, tok, sampling, data])


def _jsonl(rows: Sequence[dict]) -> str:
  return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def read_attempts(out_dir: str, digest: str) -> list[dict]:
  """Every attempt row of the finished batches under out_dir/attempts, in batch order.

  Temp files of a killed run are removed (call with the output locked).

  Raises:
    ValueError: a row written by another teacher digest, or an unreadable row (file:line).
  """
  directory = os.path.join(out_dir, ATTEMPTS_DIR)
  os.makedirs(directory, exist_ok=True)
  rows = []
  for name in sorted(os.listdir(directory)):
    path = os.path.join(directory, name)
    if ".tmp-" in name:
      os.remove(path)  # the temp file of a batch in flight when a run was killed
    if not _BATCH_FILE.fullmatch(name):
      continue
    with open(path, encoding="utf-8") as f:
      for lineno, line in enumerate(f, start=1):
        try:
          row = json.loads(line)
        except json.JSONDecodeError as err:
          raise ValueError(f"{path}:{lineno}: unreadable attempt row ({err})") from None
        if row.get("teacher") != digest:
          raise ValueError(
            f"{path}:{lineno}: written by teacher {row.get('teacher')!r}, this run is {digest!r} "
            "(another model, sampling setting or data build); nothing was changed: rerun with "
            "its settings, pass --config.teacher.restart=True (the chain moves the output "
            "aside, kept) or use a new --workdir")
        rows.append(row)
  return rows


def _num_batches(out_dir: str) -> int:
  names = [n for n in os.listdir(os.path.join(out_dir, ATTEMPTS_DIR)) if _BATCH_FILE.fullmatch(n)]
  return max((int(_BATCH_FILE.fullmatch(n)[1]) + 1 for n in names), default=0)


def user_state(rows: Sequence[dict], users: np.ndarray, attempts: int) -> tuple[np.ndarray,
                                                                              np.ndarray]:
  """([U] attempts made, [U] finished) of the selected users from the attempt rows.

  A user is finished once accepted or after `attempts` attempts. Rows of users outside `users`
  are ignored.

  Raises:
    ValueError: a user's attempts are not numbered 1, 2, ... or go on after an acceptance (the
      output was written by something else than one run at a time).
  """
  index = {int(u): i for i, u in enumerate(users)}
  made = np.zeros(len(users), np.int32)
  finished = np.zeros(len(users), bool)
  for row in rows:
    i = index.get(row["user"])
    if i is None:
      continue
    if finished[i] or row["attempt"] != made[i] + 1:
      raise ValueError(f"user {row['user']}: attempt {row['attempt']} after {made[i]} attempts "
                       f"(finished={bool(finished[i])}); the attempt log is inconsistent")
    made[i] = row["attempt"]
    finished[i] = row["kind"] == "accepted" or made[i] >= attempts
  return made, finished


def next_batch(made: np.ndarray, finished: np.ndarray, batch_size: int) -> np.ndarray:
  """[<= batch_size] positions (into the selected users, i.e. processing order) of the next
  batch: users whose last attempt failed first, then users not started."""
  retry = np.flatnonzero((made > 0) & ~finished)
  fresh = np.flatnonzero(made == 0)
  return np.concatenate([retry, fresh])[:batch_size]


def summarize(rows: Sequence[dict], users: np.ndarray, target_positions: np.ndarray,
              attempts: int, reasoning_tokens: Sequence[int], timing: dict) -> dict:
  """The run's summary (module docstring) from every attempt row of the selected users.

  Args:
    rows: the attempt rows.
    users: [U] the selected users; target_positions: [U] their targets' slots.
    attempts: k.
    reasoning_tokens: teacher-tokenizer lengths of the accepted reasoning texts.
    timing: {'generated_tokens', 'generate_seconds'} of this run's batches (the first, compiling
      batch excluded).

  Returns:
    {'users', 'finished', 'accepted', 'acceptance' (of finished users),
     'acceptance_at_attempt' {j: fraction of finished users accepted within j attempts},
     'accepted_at_attempt' {j: count}, 'attempts' (total), 'failures' {kind: count},
     'first_attempt_top1_hit' (fraction of users whose first attempt ranks the target first, an
     invalid answer falling back to D's order as in evaluation), 'reasoning_tokens' {p50, p99},
     'generated_tokens', 'generate_seconds', 'tokens_per_s'}.
  """
  index = {int(u): i for i, u in enumerate(users)}
  rows = [r for r in rows if r["user"] in index]
  made, finished = user_state(rows, users, attempts)
  at = collections.Counter(r["attempt"] for r in rows if r["kind"] == "accepted")
  done = int(finished.sum())
  firsts = [r for r in rows if r["attempt"] == 1]
  hits = [(r["ranking"][0] if r["ranking"] is not None else 0)
          == target_positions[index[r["user"]]] for r in firsts]
  accepted = sum(at.values())
  seconds = timing["generate_seconds"]
  return {
    "users": len(users), "finished": done, "accepted": accepted,
    "acceptance": accepted / done if done else 0.0,
    "acceptance_at_attempt": {str(j): sum(at[i] for i in range(1, j + 1)) / done if done else 0.0
                              for j in range(1, attempts + 1)},
    "accepted_at_attempt": {str(j): at[j] for j in range(1, attempts + 1)},
    "attempts": int(made.sum()),
    "failures": {k: sum(r["kind"] == k for r in rows) for k in KINDS if k != "accepted"},
    "first_attempt_top1_hit": float(np.mean(hits)) if hits else 0.0,
    "reasoning_tokens": metrics.percentiles(reasoning_tokens, (50, 99)),
    "generated_tokens": timing["generated_tokens"], "generate_seconds": seconds,
    "tokens_per_s": timing["generated_tokens"] / seconds if seconds > 0 else None,
  }


def trace_rows(rows: Sequence[dict], users: np.ndarray) -> list[dict]:
  """The accepted traces of the selected users, in user order (the traces.jsonl rows)."""
  selected = set(int(u) for u in users)
  accepted = sorted((r for r in rows if r["kind"] == "accepted" and r["user"] in selected),
                    key=lambda r: r["user"])
  return [{"user": r["user"], "reasoning": r["reasoning"], "ranking": r["ranking"],
           "attempts": r["attempt"], "teacher": r["teacher"]} for r in accepted]


def _broadcast_state(made: np.ndarray, finished: np.ndarray, batch_index: int):
  """Process 0's resume state (attempts made, finished, next batch index) in every process
  (multi-host: every process must run the same batches with the same keys)."""
  if jax.process_count() == 1:
    return made, finished, batch_index
  from jax.experimental import multihost_utils

  made, finished, batch_index = multihost_utils.broadcast_one_to_all(
    (made, finished, np.int32(batch_index)))
  return np.array(made), np.array(finished), int(batch_index)  # writable copies


def generate_traces(sample_fn: SampleFn, prompt_ids: Sequence[np.ndarray],
                    labels: Sequence[Sequence[str]], users: np.ndarray,
                    target_positions: np.ndarray, spec: TeacherSpec, out_dir: str, digest: str,
                    tokenizer) -> dict:
  """The rejection-sampling loop over the selected users (module docstring), resumable.

  Args:
    sample_fn: (prompts, key) -> (texts, [B'] tokens generated), B' <= spec.batch_size.
    prompt_ids: [U] the users' prompt token ids; labels: [U] their candidate labels.
    users: [U] the users (processing order); target_positions: [U] their targets' slots.
    spec: the settings (attempts, batch_size, prompt, seed).
    out_dir: the output directory (locked by the caller on process 0).
    digest: the teacher digest every row carries.
    tokenizer: the teacher's tokenizer (reasoning lengths in its tokens).

  Returns:
    The summary (also out_dir/summary.json, and printed); traces.jsonl holds the accepted traces.

  Raises:
    NoTracesError: no user was accepted (the files are written first).
  """
  writer = jax.process_index() == 0
  if writer:
    for name in os.listdir(out_dir):
      if ".tmp-" in name:  # traces / summary temp files of a run killed while writing them
        os.remove(os.path.join(out_dir, name))
  rows = read_attempts(out_dir, digest) if writer else []
  made, finished, batch_index = _broadcast_state(*user_state(rows, users, spec.attempts),
                                                 _num_batches(out_dir) if writer else 0)
  key = jax.random.key(spec.seed)
  selected = set(users.tolist())
  accepted = sum(r["kind"] == "accepted" and r["user"] in selected for r in rows)
  shown = int(finished.sum())
  bar = progress(len(users), initial=shown, desc="teacher", unit="user")
  timing = {"generated_tokens": 0, "generate_seconds": 0.0}
  first = True
  while not finished.all():
    batch = next_batch(made, finished, spec.batch_size)
    start = time.perf_counter()
    texts, lengths = sample_fn([prompt_ids[i] for i in batch],
                               jax.random.fold_in(key, batch_index))
    if not first:
      timing["generate_seconds"] += time.perf_counter() - start
      timing["generated_tokens"] += int(np.sum(lengths))
    first = False
    new_rows = []
    for i, text, n in zip(batch, texts, lengths, strict=True):
      verdict = judge(text, labels[i], int(target_positions[i]), spec.prompt)
      made[i] += 1
      finished[i] = verdict.kind == "accepted" or made[i] >= spec.attempts
      accepted += verdict.kind == "accepted"
      new_rows.append({"user": int(users[i]), "attempt": int(made[i]), "kind": verdict.kind,
                       "ranking": None if verdict.ranking is None else verdict.ranking.tolist(),
                       "reasoning": verdict.reasoning, "response": text, "tokens": int(n),
                       "teacher": digest})
    if writer:
      files.atomic_write(os.path.join(out_dir, ATTEMPTS_DIR, f"{batch_index:06d}.jsonl"),
                    _jsonl(new_rows))
    rows += new_rows
    batch_index += 1
    done = int(finished.sum())
    bar.set_postfix(acceptance=f"{accepted / max(done, 1):.3f}")
    bar.update(done - shown)
    shown = done
  bar.close()
  traces = trace_rows(rows, users)
  reasoning_tokens = [len(ids) for ids in tokenizer(
    [t["reasoning"] for t in traces], add_special_tokens=False)["input_ids"]] if traces else []
  summary = summarize(rows, users, target_positions, spec.attempts, reasoning_tokens, timing)
  summary |= {"teacher": digest, "spec": dataclasses.asdict(spec),
              "traces": os.path.join(out_dir, TRACES_FILE)}
  if writer:
    files.atomic_write(os.path.join(out_dir, TRACES_FILE), _jsonl(traces))
    summary["traces_sha256"] = files.file_sha256(os.path.join(out_dir, TRACES_FILE))
    files.atomic_write(os.path.join(out_dir, SUMMARY_FILE), json.dumps(summary, indent=1))
  print(format_summary(summary), flush=True)
  if not summary["accepted"]:
    failures = ", ".join(f"{k} {n}" for k, n in summary["failures"].items() if n) or "none"
    raise NoTracesError(
      f"the teacher accepted none of {summary['users']} users ({summary['attempts']} attempts, "
      f"up to {spec.attempts} each; failures: {failures}): {summary['traces']} is empty and "
      "gives the data build no training example. Check the model (teacher.hf_dir), the prompt "
      "format (teacher.prompt) and teacher.max_new_tokens; the attempts are kept in "
      f"{os.path.join(out_dir, ATTEMPTS_DIR)}")
  return summary


def format_summary(summary: dict) -> str:
  """The teacher's closing line: users, attempts, accepted (acceptance), failures, the traces."""
  failures = ", ".join(f"{k}={n}" for k, n in summary["failures"].items() if n) or "none"
  return (f"[teacher] {summary['finished']}/{summary['users']} users finished, "
          f"{summary['attempts']} attempts, accepted {summary['accepted']} "
          f"(acceptance {summary['acceptance']:.3f}); failures: {failures}; traces: "
          f"{summary['traces']}")
