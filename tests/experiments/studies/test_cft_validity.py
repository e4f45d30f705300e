"""experiments/studies/cft_validity.py: its --specs entries, parsed and checked before anything
loads; an export of another data build than the workdir's refused in one line before its weights
load (experiments/export_reads.py; the decodes themselves are a run, not a test)."""

import os
import subprocess
import sys

import pytest
from absl import app

from experiments.studies import cft_validity
from gr2jax import exports
from tests.experiments import study_main

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
FORM = "; expected TAU:ORDER:B or TAU:ORDER:B:given, e.g. 0.9:confidence:32"


def test_a_spec_is_its_decode_and_whether_the_reasoning_is_given():
  spec = cft_validity.parse_spec("0.9:left_to_right:16:given")
  assert spec.text == "0.9:left_to_right:16:given" and spec.given
  assert (spec.decode.eval_tau, spec.decode.commit_order, spec.decode.block_size) == (
    0.9, "left_to_right", 16)
  assert not cft_validity.parse_spec("1:distinct:32").given


@pytest.mark.parametrize("text, problem", [
  ("x:confidence:32", "TAU 'x' is not a number"),
  ("1.0:confidence", "has 2 fields, not 3 or 4"),
  ("1.5:confidence:32", "TAU 1.5 is not in (0, 1]"),
  ("nan:confidence:32", "TAU nan is not in (0, 1]"),
  ("0.9:random:32", "ORDER 'random' is not one of confidence, left_to_right, distinct"),
  ("0.9:confidence:0", "B '0' is not an integer >= 1"),
  ("0.9:confidence:3.5", "B '3.5' is not an integer >= 1"),
  ("0.9:confidence:32:gvien", "its 4th field is 'gvien', not 'given'"),
])
def test_a_bad_spec_names_the_flag_the_entry_and_the_form(text, problem):
  with pytest.raises(app.UsageError) as e:
    cft_validity.parse_spec(text)
  assert str(e.value) == f"--specs: {text!r} {problem}{FORM}"


def test_a_bad_spec_is_refused_before_the_model_and_split_load(tmp_path):
  """The checkpoint and workdir do not exist: the --specs line comes first, no traceback."""
  result = subprocess.run(
    [sys.executable, os.path.join(REPO, "experiments", "studies", "cft_validity.py"),
     f"--workdir={tmp_path / 'W'}", f"--ckpt={tmp_path / 'none'}", f"--out={tmp_path / 'o.json'}",
     "--specs=0.9:confidence:32,1.0:confidence"],
    capture_output=True, text=True, cwd=REPO, timeout=300,
    env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
  assert result.stderr.strip().splitlines()[-1] == (
    f"--specs: '1.0:confidence' has 2 fields, not 3 or 4{FORM}")


def test_the_study_refuses_the_pair_in_one_line_and_writes_nothing(two_builds, tmp_path,
                                                                  monkeypatch, capsys):
  """main, as `cft_validity.py --workdir=W2 --ckpt=E --out=OUT` runs it (cli.run)."""
  out = tmp_path / "rows.json"
  err = study_main.refusal(cft_validity, ["cft_validity.py", f"--workdir={two_builds.other}",
                                          f"--ckpt={two_builds.export}", f"--out={out}"],
                           monkeypatch, capsys)
  assert err.startswith(f"{two_builds.export} was trained on another data build")
  assert not out.exists() and os.listdir(tmp_path) == []
  metadata = exports.load_metadata(two_builds.export)["data_build"]
  assert metadata["sids_sha256"]  # a stage export's record: the SIDs are compared too
