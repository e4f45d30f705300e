"""experiments/export_reads.py: an export of another data build than the workdir's is refused by
eval.py's check before its weights load; the export's own build passes and reads."""

import pytest

from experiments import export_reads
from gr2jax import load


def _no_load(path, *args, **kwargs):
  raise AssertionError(f"{path} was loaded")


def test_an_export_of_another_data_build_is_refused_by_name_before_it_loads(two_builds,
                                                                           monkeypatch):
  """W's build has another tokenizer than the export's: the line eval.py gives for the pair
  (exports.check_data_build), naming the export and both tokenizers; no weights load."""
  monkeypatch.setattr(load, "load_model", _no_load)
  with pytest.raises(ValueError) as e:
    export_reads.read_diffusion(two_builds.export, two_builds.other, "test_1615", 2)
  assert str(e.value).startswith(
    f"{two_builds.export} was trained on another data build than this one (checkpoint vs this "
    "run): tokenizer vocab_sha256 ")
  assert "(vocab 749) vs " in str(e.value) and "(vocab 600)" in str(e.value)


def test_the_exports_own_build_passes_the_check_and_loads(two_builds):
  read = export_reads.read_diffusion(two_builds.export, two_builds.workdir, "test_1615", 2)
  assert read.config.mask_token_id is not None and len(read.data) == 2


def test_a_build_that_differs_in_its_prompt_alone_is_refused(two_builds, monkeypatch):
  """The workdir's summary records its build's prompt format: an export trained on another
  prompt (here: the summary says 'raw' evidence, the export's build 'flags') is refused."""
  from gr2jax.data import pipeline
  from gr2jax.data import tokenizer as tokenizer_lib

  summary = pipeline.read_summary(two_builds.workdir)
  assert summary["prompt"]["evidence"] != "raw"
  tokenizer = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  export_reads.check_build(two_builds.export, summary, tokenizer)  # its own build: passes
  other = dict(summary, prompt=dict(summary["prompt"], evidence="raw"))
  with pytest.raises(ValueError, match="was trained on another data build"):
    export_reads.check_build(two_builds.export, other, tokenizer)
