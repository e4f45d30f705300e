"""Tests for gr2jax/data/pipeline.py: an end-to-end build on a small synthetic Beauty-like dataset,
the cache on re-run, LLM traces, and reading the result back (TFDS -> batches -> validator).

The fast tests load a SID file; the RQ-VAE path (JIT compiles for ~20 s) is marked slow."""

import builtins
import gzip
import json
import os
import shutil
import time

import numpy as np
import pytest

from gr2jax import recipes, workdir
from gr2jax.data import answer, batches, pipeline, raw, rqvae, teacher, tfds_builder, tokenizer

NUM_ITEMS, NUM_USERS = 300, 160


def _write_dataset(path):
  rng = np.random.default_rng(0)
  brands = [f"Brand{b}" for b in range(12)]
  leaves = ["Mascara", "Lipstick", "Shampoos", "Nail Polish", "Lip Balms", "Body Washes"]
  with gzip.open(os.path.join(path, "items.jsonl.gz"), "wt") as f:
    for i in range(NUM_ITEMS):
      f.write(json.dumps({
        "asin": f"B{i:09d}", "title": None if i % 50 == 7 else f"{leaves[i % 6]} deluxe {i}",
        "brand": brands[i % 12] if i % 9 else None,
        "categories": ["Beauty", "Makeup" if i % 2 else "Hair Care", leaves[i % 6]],
        "price": float(i % 30)}) + "\n")
  with gzip.open(os.path.join(path, "sequences.txt.gz"), "wt") as f:
    for u in range(NUM_USERS):
      home = rng.integers(12)  # users favour one brand: items home, home + 12, ...
      length = rng.integers(6, 11)
      favoured = rng.permutation(np.arange(home, NUM_ITEMS, 12))[: length // 2]
      others = rng.permutation(np.setdiff1d(np.arange(NUM_ITEMS), favoured))[: length - len(
        favoured)]
      items = rng.permutation(np.concatenate([favoured, others]))
      f.write(f"U{u} " + " ".join(f"B{i:09d}" for i in items) + "\n")


def _config(data_dir, sids_file=""):
  config = recipes.config().data
  config.data_dir = str(data_dir)
  config.sids_file = str(sids_file)
  config.eval_subset_size = 40
  config.accept_position_leak = True  # synthetic lists: the leak check is not the point here
  config.rejection = False
  config.embedding_dim = 32
  config.rqvae.update(dict(latent_dim=8, codebook_size=16, epochs=4, batch_size=64,
                           kmeans_iters=2, reset_every=0))
  config.tokenizer_vocab_size = 1500
  config.tokenizer_sample = 50
  return config


def write_dataset_with_sids(path):
  """The toy dataset in `path` and its semantic IDs in path/sids.npy; returns `path`."""
  _write_dataset(path)
  codes = np.random.default_rng(0).integers(0, 16, size=(NUM_ITEMS, 3))
  rqvae.save_sids(path / "sids.npy", rqvae.semantic_ids(codes))
  return path


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
  return write_dataset_with_sids(tmp_path_factory.mktemp("beauty"))


@pytest.fixture(scope="module")
def built(data_dir, tmp_path_factory):
  config = _config(data_dir, data_dir / "sids.npy")
  workdir = str(tmp_path_factory.mktemp("work"))
  return config, workdir, pipeline.run(config, workdir)


def test_summary_and_splits(built):
  _, workdir, summary = built
  assert summary["dataset"]["users"] == NUM_USERS and summary["dataset"]["items"] == NUM_ITEMS
  assert summary["dataset"]["missing_titles"] == NUM_ITEMS // 50
  assert summary["splits"] == {"train": NUM_USERS, "validation": NUM_USERS, "test": NUM_USERS,
                               "test_1615": 40}
  assert {"R@1", "R@3", "N@3"} <= set(summary["examples"]["floor"]["test_subset"])
  assert summary["sids"]["unique"] == NUM_ITEMS
  assert set(summary["prompt_lengths"]) == {"sid/raw", "sid/flags", "slot/raw", "slot/flags"}
  assert not any(summary["cached"].values())
  assert os.path.exists(os.path.join(workdir, "summary.json"))
  table = pipeline.format_summary(summary)
  assert "test_subset floor" in table and "tokens slot/flags" in table


def test_rerun_loads_every_step_from_cache(built):
  config, workdir, first = built
  again = pipeline.run(config, workdir)
  assert all(again["cached"].values())
  assert again["paths"] == first["paths"]
  assert again["splits"] == first["splits"] and again["sids"] == first["sids"]
  config.prompt.answer_format = "sid"  # only the prompt-dependent steps rebuild
  changed = pipeline.run(config, workdir)
  assert changed["cached"]["sids"] and changed["cached"]["examples"]
  assert not changed["cached"]["tfds"] and changed["paths"]["tfds"] != first["paths"]["tfds"]


def _records(summary, split):
  """The decoded records of one split of a build's TFDS dataset, in order."""
  source = tfds_builder.data_source(summary["paths"]["tfds"], split)
  return [tfds_builder.decode_record(source[i]) for i in range(len(source))]


def test_tfds_to_encoded_examples_to_validator(built):
  _, _, summary = built
  tok = tokenizer.load_tokenizer(summary["paths"]["tokenizer"])
  records = _records(summary, "train")
  assert len(records) == NUM_USERS
  rendered = [pipeline.prompts.RenderedExample(r["prompt"], r["reasoning"], r["answer"],
                                               r["labels"]) for r in records]
  encoded = batches.encode_examples(rendered, [r["target_position"] for r in records], tok)
  assert len(encoded) == NUM_USERS and encoded[0].label_tokens.shape == (10, 1)
  for r in records[:20]:
    result = answer.parse_answer(r["reasoning"] + r["answer"], r["labels"])
    assert result.valid
    np.testing.assert_array_equal(result.ranking, r["teacher_ranking"])
  test = _records(summary, "test_1615")
  assert len(test) == 40 and test[0]["answer"] == ""


def test_llm_traces_replace_rule_reasoning(data_dir, tmp_path):
  config = _config(data_dir, data_dir / "sids.npy")
  traces = tmp_path / "traces.jsonl"
  rows = [{"user": u, "reasoning": f"LLM thought {u}", "ranking": list(range(9, -1, -1))}
          for u in (3, 5, 8)]
  traces.write_text("".join(json.dumps(r) + "\n" for r in rows))
  config.teacher_traces = str(traces)
  summary = pipeline.run(config, str(tmp_path / "work"))
  assert summary["splits"]["train"] == 3 and summary["examples"]["traces"]["kept"] == 3
  records = _records(summary, "train")
  assert [r["user"] for r in records] == [3, 5, 8]
  assert records[1]["reasoning"] == "<think>\nLLM thought 5\n</think>\n\n"
  assert answer.parse_answer(records[0]["answer"], records[0]["labels"]).ranking[0] == 9


def test_bad_trace_rows_are_named_and_no_usable_row_fails_before_tfds(data_dir, tmp_path,
                                                                     capsys):
  """data.strict_traces (the default) fails on the first bad row, naming file:line; off, each
  skipped row is printed as file:line: why; a file with no usable row fails before the tokenizer
  and TFDS are built, naming data.teacher_traces."""
  config = _config(data_dir, data_dir / "sids.npy")
  assert config.strict_traces is True
  traces = tmp_path / "traces.jsonl"
  good = {"user": 3, "reasoning": "r", "ranking": list(range(9, -1, -1))}
  traces.write_text("{oops\n" + json.dumps({**good, "user": 10 ** 6}) + "\n" + json.dumps(good)
                    + "\n")
  config.teacher_traces = str(traces)
  work = str(tmp_path / "work")
  with pytest.raises(teacher.TraceError, match=rf"{traces}:1: json: corrupt JSON"):
    pipeline.run(config, work)
  config.strict_traces = False
  summary = pipeline.run(config, work)
  out = capsys.readouterr().out
  assert f"skipped trace row {traces}:1: json: corrupt JSON" in out
  assert f"skipped trace row {traces}:2: user: 1000000 is not a user" in out
  assert "rows=3 bad=2 " in out and " kept=1 " in out and summary["splits"]["train"] == 1
  for body in ("", json.dumps({**good, "user": 10 ** 6}) + "\n"):  # empty, all users unknown
    traces.write_text(body)
    with pytest.raises(teacher.TraceError, match=rf"data.teacher_traces={traces}: no usable "
                                                  "trace row"):
      pipeline.run(config, str(tmp_path / f"work{len(body)}"))
    assert not [n for n in os.listdir(tmp_path / f"work{len(body)}") if n.startswith("tfds")]


def test_workdir_is_locked_by_the_run(data_dir, tmp_path):
  """a second run on the same workdir is refused while the first holds it."""
  from tests.test_workdir import _holder

  holder = _holder(str(tmp_path))
  try:
    with pytest.raises(workdir.InUseError, match=rf"workdir .* in use by pid {holder.pid}"):
      pipeline.run(_config(data_dir, data_dir / "sids.npy"), str(tmp_path))
  finally:
    holder.kill()
    holder.wait()
  assert os.listdir(tmp_path) == [workdir.LOCK_FILE]  # nothing was built


def test_incomplete_cached_outputs_are_rebuilt(built, data_dir, tmp_path):
  """a deleted TFDS shard, a truncated pickle, a killed run's temp dir and an
  output without a completion record are each detected, not reused."""
  _, first_workdir, first = built
  work = str(tmp_path / "work")
  shutil.copytree(first_workdir, work)
  tfds_dir = os.path.join(work, os.path.basename(first["paths"]["tfds"]))
  shard = max((os.path.join(r, f) for r, _, fs in os.walk(tfds_dir) for f in fs
               if "array_record" in f), key=os.path.getsize)
  os.remove(shard)
  examples_pkl = [os.path.join(work, "cache", f) for f in os.listdir(os.path.join(work, "cache"))
                  if f.startswith("examples-") and f.endswith(".pkl")][0]
  os.truncate(examples_pkl, os.path.getsize(examples_pkl) // 2)
  tok_dir = os.path.join(work, os.path.basename(first["paths"]["tokenizer"]))
  os.remove(tok_dir + pipeline.COMPLETE_SUFFIX)
  stale = os.path.join(work, "tfds-0123.tmp-4242-deadbeef")
  os.makedirs(stale)
  summary = pipeline.run(_config(data_dir, data_dir / "sids.npy"), work)
  assert {k for k, hit in summary["cached"].items() if not hit} == {"examples", "tokenizer",
                                                                     "tfds"}
  assert os.path.isfile(shard) and not os.path.exists(stale)
  assert len(_records(summary, "train")) == NUM_USERS
  assert all(pipeline.run(_config(data_dir, data_dir / "sids.npy"), work)["cached"].values())


@pytest.mark.slow
def test_rqvae_path(data_dir, tmp_path):
  summary = pipeline.run(_config(data_dir), str(tmp_path))
  assert summary["sids"]["unique"] == NUM_ITEMS and "recon_loss" in summary["sids"]
  assert not summary["cached"]["embeddings"]


def _write_small_catalogue(path, heavy: int, short: int) -> None:
  """A 50-item catalogue and 40 users of 5-8 items, but user `heavy` touched 45 items (5
  unseen, D needs 9 negatives) and user `short` has 3 (the split needs 4)."""
  rng = np.random.default_rng(1)
  with gzip.open(os.path.join(path, "items.jsonl.gz"), "wt") as f:
    for i in range(50):
      f.write(json.dumps({"asin": f"S{i:03d}", "title": f"Lipstick shade {i % 7} no {i}",
                          "brand": f"Brand{i % 5}", "categories": ["Beauty", "Makeup"],
                          "price": float(i % 9)}) + "\n")
  with gzip.open(os.path.join(path, "sequences.txt.gz"), "wt") as f:
    for u in range(40):
      length = {heavy: 45, short: 3}.get(u, int(rng.integers(5, 9)))
      f.write(f"U{u} " + " ".join(f"S{i:03d}" for i in rng.permutation(50)[:length]) + "\n")


def _small_config(data_dir, **overrides):
  config = _config(data_dir)
  config.eval_subset_size = 20
  config.embedding_dim = 8
  config.rqvae.update(dict(codebook_size=8, epochs=2))
  config.update(overrides)
  return config


def test_unusable_users_are_named_by_file_line_and_id_within_seconds(tmp_path):
  _write_small_catalogue(tmp_path, heavy=7, short=12)
  start = time.perf_counter()
  with pytest.raises(raw.RawDataError) as e:
    pipeline.run(_small_config(tmp_path), str(tmp_path / "work"))
  assert time.perf_counter() - start < 10
  message = str(e.value)
  assert "2 of 40 users cannot be used" in message and "drop_unusable_users=True" in message
  assert "sequences.txt.gz:8: user 'U7' touched 45 of the 50 items, leaving 5 unseen" in message
  assert "sequences.txt.gz:13: user 'U12' has 3 items; the split needs >= 4" in message


def test_dropped_users_are_counted_and_the_build_finishes(tmp_path):
  _write_small_catalogue(tmp_path, heavy=7, short=12)
  codes = np.random.default_rng(0).integers(0, 8, size=(50, 3))
  rqvae.save_sids(tmp_path / "sids.npy", rqvae.semantic_ids(codes))
  config = _small_config(tmp_path, drop_unusable_users=True, sids_file=str(tmp_path / "sids.npy"))
  summary = pipeline.run(config, str(tmp_path / "work"))
  assert summary["dataset"]["users"] == 38 and summary["dataset"]["dropped_users"] == 2
  assert summary["splits"]["test"] == 38


@pytest.mark.parametrize("overrides,match", [
  (dict(eval_subset_size=1615), r"data\.eval_subset_size=1615 does not fit the build's 40 users: "
                                r"set --config\.data\.eval_subset_size=40 or less"),
  (dict(embedding_dim=256), r"data\.embedding_dim=256 .* 50 items .*embedding_dim=49 or less"),
  (dict(codebook_size=256), r"data\.rqvae\.codebook_size=256 .* 50 items .*codebook_size=50 "),
])
def test_sizes_the_build_cannot_fill_name_the_field(tmp_path, overrides, match):
  _write_small_catalogue(tmp_path, heavy=-1, short=-1)
  config = _small_config(tmp_path)
  if "codebook_size" in overrides:
    config.rqvae.codebook_size = overrides.pop("codebook_size")
  config.update(overrides)
  with pytest.raises(ValueError, match=match):
    pipeline.run(config, str(tmp_path / "work"))


def _snapshot(path) -> dict:
  """{relative path: (size, mtime_ns)} of every file and directory under `path`."""
  out = {}
  for root, dirs, names in os.walk(path):
    for name in dirs + names:
      full = os.path.join(root, name)
      out[os.path.relpath(full, path)] = (os.path.getsize(full), os.stat(full).st_mtime_ns)
  return out


def test_a_complete_build_is_read_without_the_lock_and_without_writing(built):
  """Readers of a finished build (two servers at once, a read-only volume) take no lock and
  write nothing: the build loads while another process holds the workdir lock."""
  from tests.test_workdir import _holder

  config, work, _ = built
  first = pipeline.run(config, work)  # the last build written (summary.json names it)
  holder = _holder(work)
  try:
    before = _snapshot(work)
    summary = pipeline.run(config, work)
    assert _snapshot(work) == before
  finally:
    holder.kill()
    holder.wait()
  assert summary["paths"] == first["paths"] and all(summary["cached"].values())


def test_an_incomplete_build_in_an_unwritable_workdir_names_the_workdir(data_dir, tmp_path,
                                                                      monkeypatch):
  real_open = os.open

  def read_only_open(path, flags, *args):
    if flags & os.O_CREAT:
      raise PermissionError(13, "Permission denied", path)
    return real_open(path, flags, *args)

  monkeypatch.setattr(workdir.os, "open", read_only_open)
  with pytest.raises(OSError, match=rf"data build in workdir {tmp_path} is not complete "
                                            r"\(step raw: .*missing\).*cannot open its lock file"):
    pipeline.run(_config(data_dir, data_dir / "sids.npy"), str(tmp_path))


def test_a_moved_finished_workdir_is_read_from_a_read_only_mount(built, tmp_path, monkeypatch):
  """summary.json writes its paths "{workdir}/..." (as run records do), so a finished workdir
  moved elsewhere and mounted read-only is still its build: read without the lock or a write,
  its paths where it is now (it used to be "not complete": summary.json named the old paths)."""
  config, work, _ = built
  first = pipeline.run(config, work)  # the last build written (summary.json names it)
  with open(os.path.join(work, pipeline.SUMMARY_FILE)) as f:
    written = json.load(f)["paths"]
  assert written["tokenizer"] == "{workdir}/" + os.path.basename(first["paths"]["tokenizer"])
  assert written["sids"].startswith("{workdir}/sids_npy-")
  moved = str(tmp_path / "mounted{1}" / "work")
  shutil.copytree(work, moved)
  real_open, real_builtin_open = os.open, builtins.open

  def read_only_open(path, flags, *args):  # what a read-only mount answers (tests run as root)
    if flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
      raise OSError(30, "Read-only file system", path)
    return real_open(path, flags, *args)

  def read_only_builtin_open(file, mode="r", *args, **kwargs):
    if set(mode) & set("wax+"):
      raise OSError(30, "Read-only file system", file)
    return real_builtin_open(file, mode, *args, **kwargs)

  before = _snapshot(moved)
  monkeypatch.setattr(os, "open", read_only_open)
  monkeypatch.setattr(builtins, "open", read_only_builtin_open)
  summary = pipeline.run(config, moved)
  monkeypatch.undo()
  assert _snapshot(moved) == before and all(summary["cached"].values())
  assert summary["paths"]["tokenizer"] == os.path.join(
    moved, os.path.basename(first["paths"]["tokenizer"]))
  assert pipeline.read_summary(moved)["paths"] == summary["paths"]
