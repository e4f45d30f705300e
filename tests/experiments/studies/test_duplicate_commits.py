"""experiments/studies/duplicate_commits.py: which steps committed a repeated label; an export of
another data build than the workdir's refused by eval.py's check before its weights load (the
decode itself is a run, not a test)."""

import os

import numpy as np

from experiments.studies import duplicate_commits
from tests.experiments import study_main

LABELS = np.array([[7, 8], [7, 9], [6, 9]], np.int32)  # two-token labels sharing a first token


def test_occurrences_match_whole_labels_from_the_answer_on():
  tokens = np.array([7, 8, 1, 7, 8, 2, 7, 9, 7, 8], np.int32)
  assert duplicate_commits.occurrences(tokens, LABELS[0], 0) == [0, 3, 8]
  assert duplicate_commits.occurrences(tokens, LABELS[0], 1) == [3, 8]
  assert duplicate_commits.occurrences(tokens, LABELS[1], 0) == [6]


def test_a_repeat_is_same_step_only_within_one_block_and_step():
  tokens = np.array([7, 8, 1, 7, 8, 2, 7, 9, 7, 8], np.int32)
  steps = np.array([0, 0, 0, 3, 3, 0, 1, 1, 3, 3], np.int32)
  # the answer from index 1: label 0 at 3 and 8, both step 3; B = 4 puts them in blocks 0 and 2
  assert duplicate_commits.repeat_kind(tokens, steps, LABELS, 1, 4) == "other_steps"
  assert duplicate_commits.repeat_kind(tokens, steps, LABELS, 1, 16) == "same_step"
  steps[8] = 2
  assert duplicate_commits.repeat_kind(tokens, steps, LABELS, 1, 16) == "other_steps"
  # a label cited in the reasoning and ranked once does not repeat
  assert duplicate_commits.repeat_kind(tokens, steps, LABELS, 4, 16) is None


class _Chars:
  """A tokenizer whose token i decodes to chr(i)."""

  def decode(self, ids, skip_special_tokens=False):
    return "".join(chr(i) for i in ids)


def test_the_answer_starts_at_the_token_completing_its_opening():
  text = 'ab\n{"ranking":["x"]}'
  tokens = np.array([ord(c) for c in text], np.int32)
  assert duplicate_commits.answer_start(_Chars(), tokens) == text.index('{"ranking"') + 9
  assert duplicate_commits.answer_start(_Chars(), tokens[:5]) == 5


def test_an_export_of_another_data_build_is_one_line_before_it_loads(two_builds, tmp_path,
                                                                    monkeypatch, capsys):
  """main, as `duplicate_commits.py --workdir=W2 --ckpt=E --out=OUT` runs it (cli.run): W2's
  tokenizer is not the export's; the line names the export (exports.check_data_build)."""
  out = tmp_path / "counts.json"
  err = study_main.refusal(duplicate_commits, [
    "duplicate_commits.py", f"--workdir={two_builds.other}", f"--ckpt={two_builds.export}",
    f"--out={out}"], monkeypatch, capsys)
  assert err.startswith(f"{two_builds.export} was trained on another data build than this one "
                        "(checkpoint vs this run): tokenizer vocab_sha256 ")
  assert os.listdir(tmp_path) == []
