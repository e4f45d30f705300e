"""The data build: raw Beauty -> re-ranking examples -> SIDs -> tokenizer -> prompts -> TFDS.

`run(config, workdir)` runs each step once per distinct input: a step's cache key is a hash of
its config fields, of the keys of the steps it reads (the raw files by content) and of the source
files of the modules it runs. Outputs live under `workdir/cache/` (pickles) or
`workdir/<step>-<key>/` (directories); a re-run with unchanged inputs only loads them. The summary
(statistics, floor and teacher metrics, SID stats, prompt lengths per variant, timings) is
returned, printed as a table and written to `workdir/summary.json` (its paths written
"{workdir}/..." as run records write them, gr2jax/workdir.portable; `read_summary` reads it back).

Safety (README "What bad input gets"): a run that builds holds the workdir lock (`gr2jax.workdir`;
a second one on the same workdir fails at once with "workdir ... in use by pid N"), while a run
that finds the build complete only reads it (no lock, no write: `run`); every output is built
under a unique temp name (`<path>.tmp-<pid>-<hex>`; temp leftovers of a killed run are removed at
the start of the next) and renamed into place; a completion record `<path>.complete.json` (the
size of every file) is written last, and a cached output is reused only if its record is there
and every file it lists still has its size -- a deleted TFDS shard, a truncated pickle or an
output without a record is logged and rebuilt.
"""

import contextlib
import dataclasses
import json
import logging
import os
import pickle
import shutil
import time

import numpy as np

from gr2jax import files, metrics
from gr2jax import workdir as workdir_lib
from gr2jax.data import (
  build_settings,
  candidates,
  embeddings,
  evidence,
  examples,
  headroom,
  prompts,
  raw,
  retriever,
  rqvae,
  split,
  teacher,
  tfds_builder,
  tokenizer,
)
from gr2jax.data.records import Catalog, RerankExample

# config fields that decide the examples (and so the examples step's cache key)
EXAMPLE_FIELDS = ("users", "max_history", "num_candidates", "negative_pool", "pool_size", "seed",
                  "rejection", "teacher_traces", "all_training_targets", "accept_position_leak",
                  "evidence_decay", "evidence_window", "retriever", "eval_subset_size",
                  "learned_headroom")
VARIANTS = tuple((a, e) for a in prompts.ANSWER_FORMATS for e in prompts.EVIDENCE_MODES)

log = logging.getLogger(__name__)


def _key(*parts) -> str:
  """A short stable hash of JSON-able parts (config values, parent keys, file digests)."""
  return files.json_digest(list(parts))


def _code(*modules) -> str:
  """Digest of the modules' source files: a code change invalidates the steps that use them."""
  return _key(*(files.file_sha256(m.__file__) for m in modules))


COMPLETE_SUFFIX = ".complete.json"
SUMMARY_FILE = "summary.json"  # the last build's summary, in the workdir


def _inventory(path: str) -> dict[str, int]:
  """{relative file path: size} of a file ('' = itself) or of every file under a directory."""
  if os.path.isfile(path):
    return {"": os.path.getsize(path)}
  out = {}
  for root, _, names in os.walk(path):
    for name in names:
      full = os.path.join(root, name)
      out[os.path.relpath(full, path)] = os.path.getsize(full)
  return out


def mark_complete(path: str) -> None:
  """Writes `path`.complete.json, the completion record of a finished output (atomically): the
  size of every file, what `incomplete` checks (cached outputs here; the chain's step outputs)."""
  files.atomic_write(path + COMPLETE_SUFFIX, json.dumps({"files": _inventory(path)}, indent=0))


def damaged_files(path: str) -> dict[str, str] | None:
  """{file of the output at `path` (relative to it, '' = itself): why} for every file its
  completion record lists that is missing or has another size, in the record's order; None when
  it has no valid record (or does not exist)."""
  try:
    with open(path + COMPLETE_SUFFIX) as f:
      recorded = json.load(f)["files"]
    items = list(recorded.items())
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    return None
  damaged = {}
  for rel, size in items:
    full = os.path.join(path, rel) if rel else path
    if not os.path.isfile(full):
      damaged[rel] = f"{full} is missing"
    elif os.path.getsize(full) != size:
      damaged[rel] = (f"{full} has {os.path.getsize(full)} bytes, {size} when it was written "
                      "(truncated?)")
  return damaged


def incomplete(path: str) -> str | None:
  """Why the output at `path` cannot be reused (None when it is complete; see module doc)."""
  if not os.path.exists(path):
    return "missing"
  damaged = damaged_files(path)
  if damaged is None:
    return f"no valid completion record {os.path.basename(path)}{COMPLETE_SUFFIX}"
  return next(iter(damaged.values()), None)


def _remove(path: str) -> None:
  for p in (path, path + COMPLETE_SUFFIX):
    if os.path.isdir(p):
      shutil.rmtree(p)
    elif os.path.exists(p):
      os.remove(p)


def _remove_stale_temps(*directories: str) -> None:
  """Removes `*.tmp-<pid>-<hex>` outputs of an earlier, killed run (call with the lock held)."""
  for directory in directories:
    for name in os.listdir(directory):
      if files.TEMP_PATTERN.fullmatch(name):
        log.warning("removing %s left by an interrupted run", os.path.join(directory, name))
        _remove(os.path.join(directory, name))


class NotBuilt(Exception):
  """A read-only pass met a step whose output is not complete (the message says which)."""


class _Steps:
  """Runs cached steps in a workdir and records their wall-clock times.

  read_only: only load complete outputs; a step that would build (or remove) anything raises
  NotBuilt instead, and nothing in the workdir is written.
  """

  def __init__(self, workdir: str, read_only: bool = False):
    self.workdir = workdir
    self.read_only = read_only
    self.timings: dict[str, float] = {}
    self.cached: dict[str, bool] = {}
    if not read_only:
      os.makedirs(os.path.join(workdir, "cache"), exist_ok=True)
      _remove_stale_temps(workdir, os.path.join(workdir, "cache"))

  def _reusable(self, name: str, path: str) -> bool:
    reason = incomplete(path)
    if reason is not None and self.read_only:
      raise NotBuilt(f"step {name}: {path}: {reason}")
    if reason is not None and reason != "missing":
      log.warning("step %s: not reusing %s: %s; rebuilding", name, path, reason)
      _remove(path)
    return reason is None

  def value(self, name: str, key: str, fn):
    """fn() cached as a pickle under cache/{name}-{key}.pkl."""
    path = os.path.join(self.workdir, "cache", f"{name}-{key}.pkl")
    start = time.perf_counter()
    hit = self._reusable(name, path)
    if hit:
      try:
        with open(path, "rb") as f:
          out = pickle.load(f)
      except Exception as e:  # a damaged pickle can raise almost anything; it is only a cache
        if self.read_only:
          raise NotBuilt(f"step {name}: {path} is unreadable ({type(e).__name__})") from e
        log.warning("step %s: %s is unreadable (%s: %s); rebuilding", name, path,
                    type(e).__name__, e)
        _remove(path)
        hit = False
    if not hit:
      out = fn()
      files.atomic_write(path, pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
      mark_complete(path)
    self._done(name, start, hit)
    return out

  def directory(self, name: str, key: str, fn) -> str:
    """fn(tmp_dir) fills a directory, kept as {name}-{key}/ once complete; returns its path."""
    path = os.path.join(self.workdir, f"{name}-{key}")
    start = time.perf_counter()
    hit = self._reusable(name, path)
    if not hit:
      tmp = files.temp_name(path)
      try:
        fn(tmp)
        os.replace(tmp, path)
      except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
      mark_complete(path)
    self._done(name, start, hit)
    return path

  def _done(self, name: str, start: float, hit: bool):
    self.timings[name] = time.perf_counter() - start
    self.cached[name] = hit
    log.info("step %-10s %6.1f s%s", name, self.timings[name], " (cached)" if hit else "")


def rqvae_config(config) -> rqvae.RQVAEConfig:
  """The RQVAEConfig of `config.rqvae` (its block of RQVAESettings)."""
  return rqvae.RQVAEConfig.of(config.rqvae.to_dict(), build_settings.RQVAESettings.WHERE)


def _codes_per_level(sids: np.ndarray, config) -> tuple[int, ...]:
  """SID vocabulary sizes: at least codebook_size per RQ level, max collision + 1 for the last."""
  used = sids.max(axis=0) + 1
  return tuple(max(config.rqvae.codebook_size, int(n)) for n in used[:-1]) + (int(used[-1]),)


def example_spec(config: build_settings.DataSettings) -> examples.ExampleSpec:
  """The examples' settings of a data build's settings (all training lists kept when LLM traces
  replace the rule teacher: their own rejection filter runs in `run`)."""
  return examples.ExampleSpec(
    max_history=config.max_history, num_candidates=config.num_candidates,
    negative_pool=config.negative_pool, pool_size=config.pool_size, seed=config.seed,
    rejection=config.rejection and not config.teacher_traces,
    all_training_targets=config.all_training_targets,
    accept_position_leak=config.accept_position_leak, evidence_decay=config.evidence_decay,
    evidence_window=config.evidence_window,
    retriever=config.retriever,
    subset_size=config.eval_subset_size, learned_headroom=config.learned_headroom)


def _prompt_lengths(exs, catalog, sids, config, tok) -> dict:
  """Token-length percentiles of prompt and response for every prompt variant.

  Measured on the first `config.tokenizer_sample` training examples (they carry responses).
  """
  exs = exs[: config.tokenizer_sample]
  out = {}
  for answer_format, evidence_mode in VARIANTS:
    pc = prompts.prompt_config(config, answer_format, evidence_mode)
    rendered = [prompts.render_example(e, catalog, sids, pc) for e in exs]
    ids = tok([r.prompt for r in rendered], add_special_tokens=False)["input_ids"]
    resp = tok([r.reasoning + r.answer for r in rendered], add_special_tokens=False)["input_ids"]
    out[f"{answer_format}/{evidence_mode}"] = {
      "prompt": metrics.percentiles([len(i) for i in ids]),
      "response": metrics.percentiles([len(i) for i in resp])}
  return out


def _tokenizer_corpus(catalog, exs, sids, config) -> list[str]:
  """BPE training texts: every item's text and a sample of examples in all prompt variants."""
  items = [" ".join(filter(None, (t, b, " > ".join(c))))
           for t, b, c in zip(catalog.titles, catalog.brands, catalog.categories, strict=True)]
  rng = np.random.default_rng(config.seed)
  sample = rng.permutation(len(exs))[: config.tokenizer_sample]
  texts = []
  for answer_format, evidence_mode in VARIANTS:
    pc = prompts.prompt_config(config, answer_format, evidence_mode)
    for i in sample:
      r = prompts.render_example(exs[i], catalog, sids, pc)
      texts.append(r.prompt + r.reasoning + r.answer)
  return items + texts


def _catalog_path(config) -> str:
  """The raw catalogue file of the build (items.jsonl.gz under config.data_dir)."""
  return os.path.join(config.data_dir, "items.jsonl.gz")


def _tokenizer_key(config, examples_key: str, traces_digest: str, sids_key: str) -> str:
  """The tokenizer step's key: its settings, its parents' keys and its code."""
  base = config.tokenizer_base
  if base:
    return _key(sids_key, config.num_candidates, _code(prompts, tokenizer),
                files.file_sha256(os.path.join(base, "tokenizer.json")))
  return _key(examples_key, traces_digest, sids_key, config.prompt.to_dict(),
              _code(prompts, tokenizer), config.tokenizer_vocab_size, config.tokenizer_sample,
              config.seed)


def _build_tokenizer(out: str, config, catalog, by_split, sids) -> None:
  """The tiny BPE trained on this build's texts, or (config.tokenizer_base, an HF directory)
  that tokenizer extended with the project's tokens (out/added_tokens.txt lists the new ones,
  for the HF checkpoint conversion)."""
  sizes = dict(codes_per_level=_codes_per_level(sids, config), num_slots=config.num_candidates,
               evidence_levels=evidence.NUM_BUCKETS)
  if config.tokenizer_base:
    tokenizer.extend_tokenizer(config.tokenizer_base, out, **sizes)
  else:
    tokenizer.train_tokenizer(_tokenizer_corpus(catalog, by_split["train"], sids, config), out,
                              vocab_size=config.tokenizer_vocab_size, **sizes)


def _static_lengths(rendered_by_split: dict, tok) -> dict[str, int]:
  """The longest prompt and response (reasoning + answer) in tokens over the given splits, each
  piece tokenized separately as batches.encode_examples does."""

  def longest(texts):
    texts = [t for t in texts if t]
    return max((len(i) for i in tok(texts, add_special_tokens=False)["input_ids"]), default=0)

  prompt = response = 0
  for rendered in rendered_by_split.values():
    prompt = max(prompt, longest(r.prompt for r in rendered))
    with_response = [r for r in rendered if r.reasoning or r.answer]
    if with_response:
      pieces = tok([r.reasoning for r in with_response] + [r.answer for r in with_response],
                   add_special_tokens=False)["input_ids"]
      n = len(with_response)
      response = max(response, max(len(a) + len(b) for a, b in zip(pieces[:n], pieces[n:],
                                                                   strict=True)))
  return {"prompt": prompt, "response": response}


def _split_examples(by_split: dict, test_users: np.ndarray) -> dict[str, list[RerankExample]]:
  """The TFDS splits: train / validation / test plus test_1615 (the evaluation user subset)."""
  users = set(test_users.tolist())
  return {**by_split, "test_1615": [e for e in by_split["test"] if e.user in users]}


def _metric_text(values: dict) -> str:
  return " ".join(f"{k}={v:.4f}" for k, v in values.items())


def format_summary(summary: dict) -> str:
  """A plain-text table of the summary."""
  ex = summary["examples"]
  rows = [("dataset", " ".join(f"{k}={v}" for k, v in summary["dataset"].items())),
          ("tfds examples", " ".join(f"{k}={v}" for k, v in summary["splits"].items())),
          ("retriever full rank", " ".join(f"{k}:{_metric_text(v)}"
                                           for k, v in ex["retriever"].items()))]
  for name in ex["floor"]:
    rows.append((f"{name} floor", _metric_text({k: ex["floor"][name][k]
                                                for k in ("R@1", "R@3", "N@3")})))
    rows.append((f"{name} teacher", _metric_text(ex["teacher"][name])))
    if name in ex.get("learned", {}):
      rows.append((f"{name} learned (GBDT, fit on validation)", _metric_text(ex["learned"][name])))
  rows.append(("test target positions", " ".join(f"{p:.3f}"
                                                 for p in ex["floor"]["test"]["histogram"])))
  rows.append(("rule teacher", f"acceptance={ex['acceptance']:.4f} "
                               f"weights={ex['teacher_weights']}"
                               + (" (not trained on: LLM traces below)"
                                  if summary.get("teacher_traces") else "")))
  traces = summary.get("teacher_traces")
  if traces:
    t = ex["traces"]
    rows.append(("LLM traces", f"{traces['file']} sha256={traces['sha256'][:16]} "
                               f"rows={t['rows']} bad={t['bad']} accepted={t['accepted']} "
                               f"kept={t['kept']} teachers={traces['teachers']}"))
  sid = summary["sids"]
  rows.append(("sids", f"unique={sid['unique']} utilisation={sid['utilisation']} "
                       f"collision_rate={sid['collision_rate']:.4f} "
                       f"max_collisions={sid['max_collisions']} "
                       f"recon={sid.get('recon_loss', float('nan')):.4f}"))
  rows.append(("tokenizer", f"vocab={summary['tokenizer']['vocab']}"))
  for variant, lengths in summary["prompt_lengths"].items():
    rows.append((f"tokens {variant}", " ".join(
      f"{part} " + "/".join(f"{v:.0f}" for v in p.values()) for part, p in lengths.items())
      + "  (p50/p90/p99/max, train)"))
  rows.append(("timings s", " ".join(f"{k}={v:.1f}" for k, v in summary["timings"].items())))
  width = max(len(r[0]) for r in rows)
  return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _semantic_ids(steps: _Steps, config, catalog, raw_key: str) -> tuple[np.ndarray, dict, str]:
  """SIDs [I, 4] from `config.sids_file`, or embeddings -> RQ-VAE (two cached steps).

  Returns:
    (sids, stats, cache key); stats = rqvae.code_stats (+ RQ-VAE losses when trained).
  """
  if config.sids_file:
    key = _key(files.file_sha256(config.sids_file), _code(rqvae))

    def load():
      sids = rqvae.load_sids(config.sids_file, catalog.num_items)
      return sids, rqvae.code_stats(sids[:, :-1], config.rqvae.codebook_size)

    return *steps.value("sids", key, load), key
  emb_key = _embeddings_key(config, raw_key)
  if config.item_embeddings:
    item_emb = steps.value("embeddings", emb_key, lambda: embeddings.load_item_embeddings(
      config.item_embeddings, catalog.num_items))
  else:
    item_emb = steps.value("embeddings", emb_key, lambda: embeddings.item_embeddings(
      catalog, config.embedding_dim, config.seed))

  def train():
    rq_config = rqvae_config(config)
    params, stats = rqvae.train_rqvae(item_emb, rq_config, config.seed)
    sids = rqvae.semantic_ids(rqvae.encode_codes(params, rq_config, item_emb))
    return sids, {k: v for k, v in stats.items() if k != "loss_history"}

  key = _rqvae_key(config, emb_key)
  return *steps.value("sids", key, train), key


def _embeddings_key(config, raw_key: str) -> str:
  """The item embeddings step's key: the file's content, or TF-IDF's settings on the raw data."""
  if config.item_embeddings:
    return _key(files.file_sha256(config.item_embeddings), _code(embeddings))
  return _key(raw_key, config.embedding_dim, config.seed, _code(embeddings))


def _rqvae_key(config, embeddings_key: str) -> str:
  """The trained SIDs step's key: the RQ-VAE's settings on the item embeddings."""
  return _key(embeddings_key, config.rqvae.to_dict(), config.seed, _code(rqvae))


def _save_sids(out: str, sids: np.ndarray) -> None:
  """Writes the build's SIDs [I, 4] as out/sids.npy (rqvae.save_sids), for readers of the build
  (rerank, tables) and for pinning them on another machine (data.sids_file)."""
  os.makedirs(out)
  rqvae.save_sids(os.path.join(out, "sids.npy"), sids)


def _check_summary_paths(summary_file: str, paths: dict, workdir: str) -> None:
  """Raises NotBuilt unless `summary_file` records `paths` (what load.py reads the tokenizer
  from: a read-only pass never leaves it naming another build). Both are compared as summary.json
  writes them (workdir.portable), so a finished workdir moved or mounted elsewhere, even
  read-only, is still its build (a summary written with absolute paths counts where they are
  still inside the workdir)."""
  try:
    with open(summary_file) as f:
      recorded = json.load(f)["paths"]
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise NotBuilt(f"{summary_file} is unreadable ({type(e).__name__})") from e
  if workdir_lib.portable(workdir_lib.fill_paths(recorded, workdir), workdir) != (
      workdir_lib.portable(paths, workdir)):
    raise NotBuilt(f"{summary_file} names another build")


def read_summary(workdir: str) -> dict:
  """The summary.json of the last data build in `workdir` (read only, nothing built), its paths
  filled in with where the workdir is now (workdir.fill_paths)."""
  with open(os.path.join(workdir, SUMMARY_FILE)) as f:
    return workdir_lib.fill_paths(json.load(f), workdir)


_SHOWN: set[str] = set()  # the builds whose summary this process printed


def run(config, workdir: str) -> dict:
  """Builds (or loads from cache) every data artefact into `workdir`.

  Args:
    config: the data build's settings: build_settings.DataSettings, or a ConfigDict of its fields
      (a recipe's `data` block: build_settings.data_settings reads it, naming a bad field).
    workdir: output directory.

  Returns:
    The summary dict; `summary['paths']` holds the tokenizer and TFDS directories, the catalogue
    (items.jsonl.gz) and the SIDs file (sids.npy, int32 [I, 4]) the prompts were rendered with;
    `summary['teacher_traces']` names the LLM traces file the training split came from (its path,
    sha256 and the teacher digests of its rows), None with the rule teacher. With traces, the
    training split is the traced users only (accepted ones under `rejection`), never the rule
    teacher's.

  A complete build (every step's output there with its completion record, and summary.json
  naming the same outputs) is only read: no lock is taken and nothing is written, so any number
  of readers (servers, rerank runs) share a finished, even read-only, workdir. Otherwise the run
  takes the workdir lock and builds what is missing.

  Raises:
    gr2jax.workdir.InUseError: the build is not complete and another live run holds the workdir.
    OSError: the build is not complete and the workdir is not writable (naming both).
  """
  config = resolve_workdir(config, workdir)
  try:
    return _run(config, workdir, read_only=True)
  except NotBuilt as e:
    missing = str(e)
  log.info("data build in %s not complete (%s): building", workdir, missing)
  with contextlib.ExitStack() as stack:
    try:
      stack.enter_context(workdir_lib.lock_workdir(workdir))
    except OSError as e:
      raise OSError(f"the data build in workdir {os.path.abspath(workdir)} is not complete "
                    f"({missing}) and cannot be built there: {e.strerror or e}") from e
    return _run(config, workdir)


def resolve_workdir(config, workdir: str) -> build_settings.DataSettings:
  """The DataSettings of `config` (build_settings.data_settings) with `{workdir}` (and
  `{checkout}`) in data.teacher_traces replaced by the build's workdir (workdir.fill_path; a
  recipe's LLM-teacher step writes its traces there: gr2jax/recipe.TEACHER_TRACES)."""
  config = build_settings.data_settings(config)
  return config.replace(teacher_traces=workdir_lib.fill_path(config.teacher_traces, workdir))


def _raw(steps: _Steps, config) -> tuple:
  """(catalog, usable sequences, raw key, users dropped): the raw files, loaded once per content
  (a cached step), then `_usable_users` and `check_sizes`."""
  items_path = _catalog_path(config)
  sequences_path = os.path.join(config.data_dir, "sequences.txt.gz")
  raw_key = _key(files.file_sha256(items_path), files.file_sha256(sequences_path), _code(raw))

  def load_raw():
    catalog = raw.load_catalog(items_path)
    return catalog, raw.load_sequences(sequences_path, catalog)

  catalog, sequences = steps.value("raw", raw_key, load_raw)
  sequences = sequences[:config.users] if config.users else sequences
  sequences, dropped = _usable_users(config, catalog, sequences, sequences_path)
  check_sizes(config, catalog.num_items, len(sequences))
  return catalog, sequences, raw_key, dropped


def _usable_users(config, catalog: Catalog, sequences: list[np.ndarray],
                  path: str) -> tuple[list[np.ndarray], int]:
  """The sequences of the users the build can use (examples.unusable_users), and how many were
  dropped. The examples' cache key needs no field for it: with users to drop, the build either
  drops them (data.drop_unusable_users) or stops.

  Raises:
    raw.RawDataError: there are unusable users and data.drop_unusable_users is off; names the
      first few by file, 1-based line and user id.
  """
  bad = examples.unusable_users(sequences, catalog.num_items, config.num_candidates)
  if not bad:
    return sequences, 0
  named = raw.name_users(path, bad)
  if not config.drop_unusable_users:
    raise raw.RawDataError(
      f"{len(bad)} of {len(sequences)} users cannot be used: {named}. Set "
      "--config.data.drop_unusable_users=True to drop them (counted in the build's summary)")
  log.warning("dropping %d of %d users (data.drop_unusable_users): %s", len(bad),
              len(sequences), named)
  return [s for u, s in enumerate(sequences) if u not in bad], len(bad)


def check_sizes(config, num_items: int, num_users: int) -> None:
  """Refuses sizes the catalogue or the users cannot fill, before any step runs.

  Raises:
    ValueError: one line naming each field at fault (data.eval_subset_size,
      data.embedding_dim, data.rqvae.codebook_size) and the largest value that fits.
  """
  rules = [("eval_subset_size", config.eval_subset_size, num_users, f"{num_users} users")]
  if not config.sids_file:
    rules.append(("rqvae.codebook_size", config.rqvae.codebook_size, num_items,
                  f"{num_items} items (the RQ-VAE's k-means needs an item per code)"))
    if not config.item_embeddings:
      rules.append(("embedding_dim", config.embedding_dim, num_items - 1,
                    f"{num_items} items (TF-IDF + SVD: at most items - 1 dimensions)"))
  wrong = [f"data.{name}={value} does not fit the build's {what}: set "
           f"--config.data.{name}={fits} or less"
           for name, value, fits, what in rules if not 0 < value <= fits]
  if wrong:
    raise ValueError("; ".join(wrong))


def _example_field(config, name: str):
  """A field's value in the examples step's key. The examples depend only on whether LLM traces
  are used ('' or 'set': the file's content enters the later steps' keys), not on where the file
  is, so a workdir spelt another way, moved or copied keeps its cache."""
  if name == "retriever":
    return config.retriever.to_dict()
  if name == "teacher_traces":
    return config.teacher_traces and "set"
  return getattr(config, name)


def _examples_key(config, raw_key: str) -> str:
  """The examples step's key: its fields (EXAMPLE_FIELDS) on the raw data, and its code."""
  return _key(raw_key, [_example_field(config, k) for k in EXAMPLE_FIELDS],
              _code(examples, split, retriever, candidates, evidence, teacher, headroom, metrics))


def _examples(steps: _Steps, config, catalog, sequences, raw_key: str) -> tuple:
  """(examples by split, their stats, cache key): the cached examples step of `config`."""
  examples_key = _examples_key(config, raw_key)
  by_split, example_stats = steps.value("examples", examples_key,
                                        lambda: examples.build_examples(catalog, sequences,
                                                                        example_spec(config)))
  return by_split, example_stats, examples_key


def training_lists(config, workdir: str) -> tuple[Catalog, list[RerankExample]]:
  """The catalogue and EVERY training list of the build of `config` (DataSettings, or a ConfigDict
  of its fields), none dropped by the rule teacher's rejection: the lists an LLM teacher writes
  `data.teacher_traces` for (a build that reads traces keeps exactly these lists, then only the
  traced users; data/llm_teacher.py).

  Raises:
    gr2jax.workdir.InUseError: another live run holds the workdir.
  """
  config = build_settings.data_settings(config)
  # learned_headroom: a statistic only (headroom.py), not needed for the lists
  unfiltered = config.replace(rejection=False, teacher_traces="", learned_headroom=False)
  with workdir_lib.lock_workdir(workdir):
    steps = _Steps(workdir)
    catalog, sequences, raw_key, _ = _raw(steps, config)
    by_split, _, _ = _examples(steps, unfiltered, catalog, sequences, raw_key)
  return catalog, by_split["train"]


def load_traces(config, train: list[RerankExample]) -> tuple[list, dict]:
  """The LLM traces of `config.teacher_traces` for the training lists (teacher.load_traces,
  strict when config.strict_traces): skipped rows are printed as file:line: why (the first few,
  then their count).

  Raises:
    FileNotFoundError: the file does not exist (naming data.teacher_traces).
    teacher.TraceError: a bad row under strict_traces, or no usable row at all (before any
      tokenizer or TFDS output is built).
  """
  path = config.teacher_traces
  if not os.path.isfile(path):
    raise FileNotFoundError(f"data.teacher_traces={path!r} is not a file")
  traces, stats = teacher.load_traces(path, train, rejection=config.rejection,
                                      strict=config.strict_traces)
  for line in stats["skipped"]:
    print(f"skipped trace row {line}", flush=True)
  if stats["bad"] > len(stats["skipped"]):
    print(f"... and {stats['bad'] - len(stats['skipped'])} more skipped rows of {path} "
          f"({stats['bad_reasons']})", flush=True)
  if not traces:
    rejected = (f", {stats['rows'] - stats['bad'] - stats['accepted']} whose top-1 is not the "
                "target (data.rejection)" if config.rejection else "")
    raise teacher.TraceError(
      f"data.teacher_traces={path}: no usable trace row ({stats['rows']} rows: "
      f"{stats['bad']} bad{rejected}); the build would have no training example")
  return traces, stats


def _tfds_key(config, examples_key: str, traces_digest: str, sids_key: str) -> str:
  """The TFDS step's key: the prompt format (PromptConfig) on its parents' keys, and its code."""
  return _key(examples_key, traces_digest, sids_key,
              dataclasses.asdict(prompts.prompt_config(config)), _code(prompts, tfds_builder))


def _run(config, workdir: str, read_only: bool = False) -> dict:
  steps = _Steps(workdir, read_only)
  start = time.perf_counter()
  catalog, sequences, raw_key, dropped = _raw(steps, config)
  by_split, example_stats, examples_key = _examples(steps, config, catalog, sequences, raw_key)
  reasonings, traces_digest, traces_provenance = {}, "", None
  if config.teacher_traces:
    traces, trace_stats = load_traces(config, by_split["train"])
    traces_digest = files.file_sha256(config.teacher_traces)
    by_split["train"] = [t.example for t in traces]
    reasonings = {t.example.user: t.reasoning for t in traces}
    example_stats = example_stats | {"traces": trace_stats}
    traces_provenance = {"file": os.path.abspath(config.teacher_traces),
                         "sha256": traces_digest, "teachers": trace_stats["teachers"]}
  test_users = split.eval_subset(len(sequences), config.eval_subset_size)
  by_split = _split_examples(by_split, test_users)

  sids, sid_stats, sids_key = _semantic_ids(steps, config, catalog, raw_key)
  sids_dir = steps.directory("sids_npy", sids_key, lambda out: _save_sids(out, sids))

  tok_key = _tokenizer_key(config, examples_key, traces_digest, sids_key)
  tok_dir = steps.directory("tokenizer", tok_key,
                            lambda out: _build_tokenizer(out, config, catalog, by_split, sids))
  tok = tokenizer.load_tokenizer(tok_dir)

  pc = prompts.prompt_config(config)
  tfds_key = _tfds_key(config, examples_key, traces_digest, sids_key)

  def render(name):
    return [prompts.render_example(e, catalog, sids, pc, reasonings.get(e.user))
            for e in by_split[name]]

  def write_tfds(out):
    records = {name: [tfds_builder.to_record(e, r, sids) for e, r in zip(exs, render(name),
                                                                          strict=True)]
               for name, exs in by_split.items()}
    tfds_builder.build(records, out)

  tfds_dir = steps.directory("tfds", tfds_key, write_tfds)

  lengths_key = _key(tok_key, tfds_key)
  prompt_lengths = steps.value("lengths", lengths_key, lambda: _prompt_lengths(
    by_split["train"], catalog, sids, config, tok))
  static_lengths = steps.value("static_lengths", lengths_key, lambda: _static_lengths(
    {name: render(name) for name in by_split if name != "test_1615"}, tok))

  steps.timings["total"] = time.perf_counter() - start
  summary = {
    "dataset": split.dataset_stats(sequences, catalog.num_items)
               | {"missing_titles": raw.num_missing_titles(catalog), "dropped_users": dropped},
    "examples": example_stats,
    "splits": {name: len(exs) for name, exs in by_split.items()},
    "sids": {"unique": int(len(np.unique(sids, axis=0))), **sid_stats},
    "tokenizer": {"vocab": len(tok)},
    "prompt": dataclasses.asdict(prompts.prompt_config(config)),  # the build's prompt format
    "prompt_lengths": prompt_lengths,
    "static_lengths": static_lengths,
    "timings": steps.timings,
    "cached": steps.cached,
    "teacher_traces": traces_provenance,
    "paths": {"tokenizer": tok_dir, "tfds": tfds_dir, "items": _catalog_path(config),
              "sids": os.path.join(sids_dir, "sids.npy")},
  }
  summary_file = os.path.join(workdir, SUMMARY_FILE)
  if read_only:
    _check_summary_paths(summary_file, summary["paths"], workdir)
  else:  # its paths portable ("{workdir}/tokenizer-<key>"): read_summary fills them in
    written = summary | {"paths": workdir_lib.portable(summary["paths"], workdir)}
    if traces_provenance:
      written["teacher_traces"] = traces_provenance | {
        "file": workdir_lib.portable(traces_provenance["file"], workdir)}
    files.atomic_write(summary_file, json.dumps(written, indent=1,
                                               default=lambda x: np.asarray(x).tolist()))
  if tfds_dir not in _SHOWN:  # once per build and process: every stage reads the build
    _SHOWN.add(tfds_dir)
    print(format_summary(summary), flush=True)
  return summary
