"""experiments/stage_sweep.py: variant parsing, what a variant copies, the table."""

import os

import pytest

from experiments import stage_sweep


def test_variants_parse_and_bad_ones_are_named():
  assert stage_sweep.parse_variants("a=--x=1 --y='b c';b=") == [
    ("a", ["--x=1", "--y=b c"]), ("b", [])]
  for bad, match in (("", "no variant"), ("a", "name=overrides"), ("a b=", "plain name"),
                     ("a=;a=", "twice")):
    with pytest.raises(ValueError, match=match):
      stage_sweep.parse_variants(bad)


def test_a_variant_copies_the_upstream_steps_only(tmp_path):
  base = tmp_path / "W"
  for name in ("sft", "ar_rl", "cft", "opd", "opd.1234", "rl", "tfds-1", ".lock"):
    (base / name).mkdir(parents=True)
  (base / "summary.json").write_text("{}")
  assert stage_sweep.upstream_entries(str(base), "opd") == [
    "ar_rl", "cft", "sft", "summary.json", "tfds-1"]
  stage_sweep.copy_upstream(str(base), "opd", str(tmp_path / "v"))
  assert sorted(os.listdir(tmp_path / "v")) == ["ar_rl", "cft", "sft", "summary.json", "tfds-1"]
  # A resumed sweep keeps the variant's workdir as it is.
  (tmp_path / "v" / "opd").mkdir()
  stage_sweep.copy_upstream(str(base), "opd", str(tmp_path / "v"))
  assert (tmp_path / "v" / "opd").is_dir()


def test_the_table_has_a_row_and_a_command_per_variant():
  row = dict.fromkeys(stage_sweep.COLUMNS, 1)
  text = stage_sweep.table([{**row, "R@1": 0.41234, "variant": "a", "command": "python x"}])
  assert "| a | 0.4123 |" in text and "`python x`" in text
