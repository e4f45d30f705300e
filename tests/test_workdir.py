"""gr2jax/workdir.py: one live holder per workdir, stale locks taken over, re-entrant in-process."""

import os
import subprocess
import sys
import textwrap

import pytest

from gr2jax import workdir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _holder(path: str) -> subprocess.Popen:
  """A process that holds lock_workdir(path) until killed (it prints 'locked' once it does)."""
  code = textwrap.dedent(f"""
    import sys, time
    sys.path.insert(0, {ROOT!r})
    from gr2jax import workdir
    with workdir.lock_workdir({path!r}):
      print("locked", flush=True)
      time.sleep(120)
  """)
  proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
  assert proc.stdout.readline().strip() == "locked"
  return proc


def test_second_run_is_refused_and_a_dead_holders_lock_is_taken_over(tmp_path):
  proc = _holder(str(tmp_path))
  try:
    with pytest.raises(workdir.InUseError, match=rf"workdir .* in use by pid {proc.pid}"):
      with workdir.lock_workdir(str(tmp_path)):
        pass
  finally:
    proc.kill()  # SIGKILL: no cleanup, the lock file (with its pid) stays behind
    proc.wait()
  with open(tmp_path / workdir.LOCK_FILE) as f:
    assert f.read().strip() == str(proc.pid)
  with workdir.lock_workdir(str(tmp_path)):  # the kernel dropped the dead process's flock
    with open(tmp_path / workdir.LOCK_FILE) as f:
      assert f.read().strip() == str(os.getpid())
  assert not os.path.exists(tmp_path / workdir.LOCK_FILE)  # removed on release


def test_reentrant_within_a_process(tmp_path):
  lock = tmp_path / workdir.LOCK_FILE
  with workdir.lock_workdir(str(tmp_path)):
    with workdir.lock_workdir(str(tmp_path)):  # e.g. a stage calling the data pipeline
      assert lock.exists()
    assert lock.exists()  # still held by the outer block
  assert not lock.exists()
  new = tmp_path / "new" / "dir"
  with workdir.lock_workdir(str(new)):  # creates the workdir
    assert new.is_dir()


def test_an_unwritable_directory_names_the_lock_file(tmp_path, monkeypatch):
  def read_only_open(path, flags, *args):
    raise OSError(30, "Read-only file system", path)

  monkeypatch.setattr(workdir.os, "open", read_only_open)
  with pytest.raises(OSError, match=rf"workdir {tmp_path}: cannot open its lock file "
                                    r".*\.lock \(Read-only file system\)"):
    with workdir.lock_workdir(str(tmp_path)):
      pass


def test_a_path_in_the_checkout_is_written_relative_to_it(tmp_path, monkeypatch):
  """The shipped data is "{checkout}/data/amazon_beauty" wherever the checkout lives (a clone, a
  moved checkout); a path inside the workdir stays "{workdir}/...", any other path absolute; a
  record that wrote a path of this checkout absolute reads as the same value (in_checkout)."""
  from gr2jax.data import build_settings

  assert workdir.portable(build_settings.DATA_DIR, "W") == "{checkout}/data/amazon_beauty"
  records = []
  for clone in ("a", "b"):
    root = tmp_path / clone
    monkeypatch.setattr(workdir, "CHECKOUT_DIR", str(root))
    tree = {"data_dir": str(root / "data" / "amazon_beauty"), "init": str(root / "W" / "export"),
            "mine": [str(tmp_path / "mine"), "preset:tiny"]}
    records.append(workdir.portable(tree, str(root / "W")))
  assert records[0] == records[1] == {
    "data_dir": "{checkout}/data/amazon_beauty", "init": "{workdir}/export",
    "mine": [str(tmp_path / "mine"), "preset:tiny"]}
  before = workdir.portable(tree, str(root / "W"), checkout=False)
  assert before["data_dir"] == str(root / "data" / "amazon_beauty")
  assert workdir.in_checkout(before) == records[1]


def test_fill_path_replaces_only_its_two_fields_literally(tmp_path, monkeypatch):
  """The one path template: '{workdir}' and '{checkout}' replaced as text, in one pass; every
  other brace is the path's own (str.format raised IndexError on run{1}, KeyError on
  '{checkout}'); portable's records read back where the workdir is now."""
  monkeypatch.setattr(workdir, "CHECKOUT_DIR", str(tmp_path / "clone"))
  assert workdir.fill_path("{workdir}/rl/export", "run{1}") == "run{1}/rl/export"
  assert workdir.fill_path("/data/run{1}/{0}/x{", "W") == "/data/run{1}/{0}/x{"
  assert workdir.fill_path("{checkout}/data", "W") == str(tmp_path / "clone" / "data")
  assert workdir.fill_path("{workdir}", "/a/{checkout}") == "/a/{checkout}"  # not filled twice
  moved = tmp_path / "moved{1}"
  record = {"paths": {"tokenizer": "{workdir}/tokenizer-k", "items": "{checkout}/data/i.gz",
                      "other": "/abs/x"}, "n": 3}
  assert workdir.fill_paths(record, str(moved)) == {
    "paths": {"tokenizer": f"{moved}/tokenizer-k", "items": str(tmp_path / "clone/data/i.gz"),
              "other": "/abs/x"}, "n": 3}
  assert workdir.portable(workdir.fill_paths(record, str(moved)), str(moved)) == record
