"""gr2jax/files.py: the atomic write leaves the old file or the whole new one, never a temp."""

import os

import pytest

from gr2jax import files


def test_atomic_write_replaces_whole_and_leaves_no_temp(tmp_path):
  path = str(tmp_path / "out.txt")
  files.atomic_write(path, "old")
  files.atomic_write(path, b"new bytes")
  assert open(path, "rb").read() == b"new bytes" and os.listdir(tmp_path) == ["out.txt"]


def test_a_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
  path = str(tmp_path / "out.txt")
  files.atomic_write(path, "old")

  def fail(*args):
    raise OSError("disk full")

  monkeypatch.setattr(os, "replace", fail)
  with pytest.raises(OSError, match="disk full"):
    files.atomic_write(path, "new")
  assert open(path).read() == "old" and os.listdir(tmp_path) == ["out.txt"]


def test_temp_names_are_unique_and_recognised(tmp_path):
  a, b = files.temp_name(str(tmp_path / "x")), files.temp_name(str(tmp_path / "x"))
  assert a != b and files.TEMP_PATTERN.fullmatch(os.path.basename(a))


def test_digests(tmp_path):
  (tmp_path / "f").write_bytes(b"abc")
  assert files.file_sha256(str(tmp_path / "f")).startswith("ba7816bf")
  assert files.json_digest({"b": 1, "a": 2}) == files.json_digest({"a": 2, "b": 1})
  assert len(files.json_digest([1])) == 16
