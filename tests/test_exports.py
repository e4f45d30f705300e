"""gr2jax/exports.py: round trip, sharded restore, atomic writes, damaged checkpoints, the data
build checks."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import numpy as np
import pytest

from gr2jax import exports, load, workdir
from gr2jax.data import prompts
from gr2jax.data import tokenizer as tokenizer_lib
from gr2jax.model import params as params_lib
from gr2jax.model.config import ModelConfig
from tests.train.toy import PROMPT, toy_tokenizer

CONFIG = ModelConfig.tiny(vocab_size=64, hidden_size=32, head_dim=8, intermediate_size=48,
                          eos_token_ids=(1, 2), mask_token_id=63, block_size=4)


@pytest.fixture(scope="module")
def params():
  return params_lib.init_params(CONFIG, jax.random.key(0))


@pytest.fixture(scope="module")
def saved(tmp_path_factory, params):
  path = str(tmp_path_factory.mktemp("ckpt") / "model")
  exports.save(path, CONFIG, params)
  return path


def _assert_equal(a, b):
  jax.tree.map(np.testing.assert_array_equal, a, b)


def test_config_dict_round_trip():
  d = json.loads(json.dumps(exports.config_to_dict(CONFIG)))
  assert exports.config_from_dict(d) == CONFIG
  with pytest.raises(exports.CheckpointError, match=r"unknown ModelConfig field\(s\) \['foo'\]"):
    exports.config_from_dict({**d, "foo": 1}, source="x.json")
  with pytest.raises(exports.CheckpointError, match="not a gr2jax config"):
    exports.config_from_dict(CONFIG.to_hf_dict())


def test_an_export_recording_a_retired_field_loads_at_its_old_value_only(tmp_path, saved):
  """Exports written while ModelConfig had pivot_filler_id record it (null except in a
  pivot-aligned model): such an export loads as before; a pivot-aligned one is refused in one
  line naming the field."""
  path = str(tmp_path / "older")
  shutil.copytree(saved, path)
  file = os.path.join(path, exports.CONFIG_FILE)
  d = json.load(open(file))
  assert "pivot_filler_id" not in d
  for value in (None, 9):
    with open(file, "w") as f:
      json.dump({**d, "pivot_filler_id": value}, f)
    if value is None:
      assert load.load_model(path)[0] == CONFIG
      continue
    with pytest.raises(exports.CheckpointError) as e:
      load.load_model(path)
    assert str(e.value) == (f"{file}: pivot_filler_id=9: a model with pivot-aligned blocks, which "
                            "were retired; only a model without them loads")


def test_save_restore_round_trip(saved, params):
  config, restored = load.load_model(saved)
  assert config == CONFIG
  _assert_equal(restored, params)
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(restored))
  assert jax.tree.structure(restored) == jax.tree.structure(params)


def test_metadata_records_the_params_digest_and_older_dirs_still_load(tmp_path, saved, params):
  """Exports record what they are (gr2jax_metadata.json); a directory written before
  the file existed loads as before and has an empty record."""
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params, metadata={"stage": "cft", "kind": "diffusion"})
  metadata = exports.load_metadata(path)
  assert metadata["stage"] == "cft" and metadata["kind"] == "diffusion"
  assert metadata["params_sha256"] == exports.load_metadata(saved)["params_sha256"]
  assert exports.content_digest(path) == metadata["params_sha256"]
  changed = jax.tree.map(lambda x: x, params) | {"final_norm": params["final_norm"] * 2}
  other = str(tmp_path / "other")
  exports.save(other, CONFIG, changed)
  assert exports.content_digest(other) != exports.content_digest(path)
  os.remove(os.path.join(path, exports.METADATA_FILE))  # an older directory
  assert exports.load_metadata(path) == {}
  _assert_equal(load.load_model(path)[1], params)
  assert len(exports.content_digest(path)) == 64
  exports.check_data_build(path, {"vocab_sha256": "x", "vocab": 1, "prompt": {}})


class _Vocab:
  """A tokenizer as data_build_record reads it."""

  def get_vocab(self):
    return {"<a>": 0, "<b>": 1}


def test_the_data_build_record_tells_same_shaped_semantic_ids_apart(tmp_path, params):
  """A stage export's record holds its SIDs' digest: another build's same-shaped SIDs (the same
  codes given to other items) are refused by name; a record without the digest (a run record,
  an export written before it) is checked on the tokenizer and prompt only."""
  tokenizer, prompt = _Vocab(), prompts.PromptConfig()
  sids = np.arange(12, dtype=np.int32).reshape(3, 4)
  other = sids[[1, 0, 2]]
  record = exports.data_build_record(tokenizer, prompt, sids)
  assert record["sids_sha256"] == exports.sids_digest(sids.astype(np.int64))  # values, not dtype
  assert exports.sids_digest(other) != record["sids_sha256"]
  assert exports.sids_digest(sids.reshape(4, 3)) != record["sids_sha256"]
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params, metadata={"data_build": record})
  exports.check_data_build(path, exports.data_build_record(tokenizer, prompt, sids))
  exports.check_data_build(path, exports.data_build_record(tokenizer, prompt))
  with pytest.raises(ValueError, match=r"model was trained on another data build than this one "
                                       r"\(checkpoint vs this run\): semantic IDs sids_sha256 "
                                       r"\w{16} vs \w{16}\. Pass"):
    exports.check_data_build(path, exports.data_build_record(tokenizer, prompt, other))


def test_restore_into_shardings(saved, params):
  mesh = jax.make_mesh((4, 2), ("fsdp", "tp"))
  spec = jax.sharding.PartitionSpec
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, spec()), params)
  shardings["layers"]["q"] = jax.sharding.NamedSharding(mesh, spec(None, "fsdp", "tp", None))
  _, restored = exports.restore(saved, shardings)
  assert restored["layers"]["q"].sharding == shardings["layers"]["q"]
  _assert_equal(restored, params)
  with pytest.raises(exports.CheckpointError, match="shardings tree does not match"):
    exports.restore(saved, {"embed": shardings["embed"]})


def test_overwrite_is_atomic(tmp_path, params):
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params)

  def failing_write(tmp):
    with open(os.path.join(tmp, "partial"), "w") as f:
      f.write("x")
    raise RuntimeError("disk full")

  with pytest.raises(RuntimeError, match="disk full"):
    exports.atomic_directory(path, failing_write, overwrite=True)
  assert os.listdir(tmp_path) == ["model"]  # the old checkpoint survives, no temp dirs left
  _assert_equal(exports.restore(path)[1], params)
  with pytest.raises(FileExistsError):
    exports.save(path, CONFIG, params, overwrite=False)
  new = jax.tree.map(lambda x: x + 1, params)
  exports.save(path, CONFIG, new)
  assert os.listdir(tmp_path) == ["model"]
  _assert_equal(exports.restore(path)[1], new)


def _truncate_data(path):
  """Truncates the largest orbax data file to half its size."""
  files = [os.path.join(root, f) for root, _, fs in os.walk(os.path.join(path, "params"))
           for f in fs]
  largest = max(files, key=os.path.getsize)
  os.truncate(largest, os.path.getsize(largest) // 2)


@pytest.mark.parametrize("damage,message", [
  (lambda p: os.remove(os.path.join(p, exports.CONFIG_FILE)), "not a gr2jax checkpoint"),
  (lambda p: open(os.path.join(p, exports.CONFIG_FILE), "w").write("{"), "invalid JSON"),
  (lambda p: shutil.rmtree(os.path.join(p, exports.PARAMS_DIR)), "incomplete checkpoint"),
  (lambda p: os.remove(os.path.join(p, exports.PARAMS_DIR, exports.MANIFEST_FILE)),
   "incomplete checkpoint"),
  (lambda p: open(os.path.join(p, exports.PARAMS_DIR, exports.MANIFEST_FILE), "w").write(
    "[{}]"), "invalid manifest"),
  (lambda p: shutil.rmtree(os.path.join(p, exports.PARAMS_DIR, "layers.q")),
   "layers.q: cannot restore param layers.q"),
  (_truncate_data, "cannot restore param"),
])
def test_damaged_checkpoint_is_a_clear_error(tmp_path, params, damage, message):
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params)
  damage(path)
  with pytest.raises(exports.CheckpointError, match=message):
    exports.restore(path)


def test_load_model_rejects_unknown_directories(tmp_path):
  with pytest.raises(exports.CheckpointError, match="neither a gr2jax checkpoint"):
    load.load_model(str(tmp_path))


def test_load_model_hf_dir_into_shardings(tmp_path):
  from tests.weights_conversion.conftest import save_hf

  model = save_hf(str(tmp_path), seed=5)
  mesh = jax.make_mesh((4, 2), ("fsdp", "tp"))
  spec = jax.sharding.PartitionSpec
  config, params = load.load_model(str(tmp_path))
  shardings = jax.tree.map(lambda _: jax.sharding.NamedSharding(mesh, spec()), params)
  shardings["layers"]["q"] = jax.sharding.NamedSharding(mesh, spec(None, "fsdp", "tp", None))
  _, sharded = load.load_model(str(tmp_path), shardings)
  assert sharded["layers"]["q"].sharding == shardings["layers"]["q"]
  _assert_equal(sharded, params)
  np.testing.assert_array_equal(params["embed"], model.model.embed_tokens.weight.detach().numpy())
  del shardings["lm_head"]
  with pytest.raises(exports.CheckpointError, match="no entry for lm_head"):
    load.load_model(str(tmp_path), shardings)


def _siblings(path):
  parent, name = os.path.split(path)
  return sorted(e for e in os.listdir(parent) if e.startswith(f".{name}."))


def test_directories_get_umask_permissions(tmp_path, params):
  """tempfile.mkdtemp made every checkpoint 0700."""
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params)
  umask = os.umask(0)
  os.umask(umask)
  assert os.stat(path).st_mode & 0o777 == 0o777 & ~umask


@pytest.mark.parametrize("signum,exc", [(signal.SIGTERM, SystemExit),
                                        (signal.SIGINT, KeyboardInterrupt)])
def test_sigterm_and_sigint_clean_up(tmp_path, signum, exc):
  if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
    pytest.skip("the test runner handles SIGTERM itself")
  if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    pytest.skip("SIGINT is ignored in this process (a background job): it cannot interrupt")
  path = str(tmp_path / "model")

  def write(tmp):
    with open(os.path.join(tmp, "partial"), "w") as f:
      f.write("x")
    os.kill(os.getpid(), signum)
    time.sleep(5)  # the handler raises in this thread at once

  with pytest.raises(exc):
    exports.atomic_directory(path, write, overwrite=False)
  assert os.listdir(tmp_path) == []
  assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the default is restored


def test_stale_siblings_are_removed_and_a_parked_checkpoint_restored(tmp_path, params):
  path = str(tmp_path / "model")
  exports.save(path, CONFIG, params)
  # A writer killed mid-swap: the previous checkpoint parked in .old-*, the new one in .tmp-*.
  parked = tmp_path / ".model.old-4242-0badc0de"
  parked.mkdir()
  os.rename(path, parked / "model")
  (tmp_path / ".model.tmp-4242-12345678").mkdir()
  (tmp_path / ".model.tmp-4242-12345678" / "half").write_text("x")
  other = tmp_path / ".model.tmp-1-abc.keep"  # not a temp name of this target: left alone
  other.mkdir()
  with pytest.raises(FileExistsError):
    exports.atomic_directory(path, lambda tmp: None, overwrite=False)
  assert _siblings(path) == [other.name]
  _assert_equal(exports.restore(path)[1], params)


def _slow_writer(path: str) -> subprocess.Popen:
  """A process inside atomic_directory(path) whose write() sleeps; prints 'writing' first."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  code = textwrap.dedent(f"""
    import os, sys, time
    sys.path.insert(0, {root!r})
    from gr2jax import exports
    def write(tmp):
      open(os.path.join(tmp, "partial"), "w").write("x" * 1000)
      print("writing", flush=True)
      time.sleep(120)
    exports.atomic_directory({path!r}, write, overwrite=True)
  """)
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "writing"
  return proc


def test_killed_writers(tmp_path, params):
  """A concurrent writer is refused; SIGTERM cleans up; SIGKILL's leftovers go on the next run."""
  path = str(tmp_path / "model")
  proc = _slow_writer(path)
  try:
    with pytest.raises(workdir.InUseError, match=f"in use by pid {proc.pid}"):
      exports.save(path, CONFIG, params)
    proc.terminate()
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert os.listdir(tmp_path) == []
    proc = _slow_writer(path)
  finally:
    proc.kill()
    proc.wait()
  assert [e.split("-")[0] for e in _siblings(path)] == [".model.lock", ".model.tmp"]
  exports.save(path, CONFIG, params)
  assert os.listdir(tmp_path) == ["model"]
  _assert_equal(exports.restore(path)[1], params)


def _export(tmp_path, name, record):
  path = tmp_path / name
  path.mkdir()
  if record is not None:
    (path / exports.METADATA_FILE).write_text(json.dumps({"data_build": record}))
  return str(path)


@pytest.fixture(scope="module")
def builds(tmp_path_factory):
  """Two data build records as the exports' writer makes them (exports.data_build_record): the
  toy build, and one with a token more and SID answers."""
  out = str(tmp_path_factory.mktemp("tok"))
  toy_tokenizer(out)
  tok = tokenizer_lib.load_tokenizer(out)
  build = exports.data_build_record(tok, PROMPT)
  tok.add_tokens(["<another_token>"])
  return build, exports.data_build_record(tok, dataclasses.replace(PROMPT, answer_format="sid"))


def test_exports_of_different_data_builds_are_refused_by_name(tmp_path, builds):
  build, other_build = builds
  drafter = _export(tmp_path, "rl", build)
  exports.check_same_build(drafter, _export(tmp_path, "same", build))
  exports.check_same_build(drafter, _export(tmp_path, "older", None))  # no record: not checked
  older_name = {("tokenizer_sha256" if k == "vocab_sha256" else k): v for k, v in build.items()}
  # the field's old name:
  exports.check_same_build(drafter, _export(tmp_path, "older_name", older_name))
  other = _export(tmp_path, "ar_rl", other_build)
  digest, vocab = build["vocab_sha256"][:16], build["vocab"]
  with pytest.raises(ValueError, match=(
      rf"drafter {os.path.join(tmp_path, 'rl')} and verifier {os.path.join(tmp_path, 'ar_rl')} "
      rf"come from different data builds .*tokenizer vocab_sha256 {digest} \(vocab {vocab}\) vs "
      rf"{other_build['vocab_sha256'][:16]} \(vocab {vocab + 1}\); "
      r"prompt.answer_format 'slot' vs 'sid'")):
    exports.check_same_build(drafter, other)
