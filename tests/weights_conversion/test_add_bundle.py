"""weights_conversion/add_bundle.py: an export written before exports carried an inference bundle
gets the bundle its training stage would have written, from its data build in --workdir (run as
the README writes the command); a build that is not the export's is refused before anything is
written."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from gr2jax import exports
from gr2jax.data import pipeline
from gr2jax.decoding import bundle
from gr2jax.decoding import reranker as reranker_lib
from tests.decoding import tiny_export
from tests.smoke_workdir import REPO, env
from weights_conversion import add_bundle

TOOL = os.path.join(REPO, "weights_conversion", "add_bundle.py")


@pytest.fixture(scope="module")
def built(tmp_path_factory):
  """(data config, summary, workdir, a stage export of the build with its bundle)."""
  config, summary, workdir = tiny_export.build(tmp_path_factory)
  export = str(tmp_path_factory.mktemp("stage") / "export")
  tiny_export.write_export(export, config, summary)
  return config, summary, workdir, export


def test_the_command_writes_the_bundle_its_stage_wrote(built, tmp_path):
  _, _, workdir, export = built
  old = tiny_export.copy_without_bundle(export, str(tmp_path / "export"))
  with pytest.raises(ValueError, match="has no inference bundle.*add_bundle.py"):
    reranker_lib.load_reranker(old)
  out = subprocess.run([sys.executable, TOOL, f"--export={old}", f"--workdir={workdir}"],
                       cwd=REPO, env=env(), capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert f"wrote {old}/inference: format {bundle.FORMAT}" in out.stdout
  assert sorted(os.listdir(old)) == sorted(os.listdir(export))
  for name in (bundle.DIRECTORY, ""):
    directory, original = os.path.join(old, name), os.path.join(export, name)
    for file in os.listdir(original):
      if os.path.isfile(os.path.join(original, file)) and file != exports.METADATA_FILE:
        with open(os.path.join(directory, file), "rb") as f, \
             open(os.path.join(original, file), "rb") as g:
          assert f.read() == g.read(), file
  with open(os.path.join(old, exports.METADATA_FILE)) as f, \
       open(os.path.join(export, exports.METADATA_FILE)) as g:
    assert json.load(f) == json.load(g)  # untouched, but for the bundle's digest now recorded
  assert reranker_lib.load_reranker(old).prompt_len == reranker_lib.load_reranker(export).prompt_len


def test_a_build_that_is_not_the_exports_is_refused_before_writing(built, tmp_path):
  config, _, workdir, export = built
  other = tiny_export.copy_without_bundle(export, str(tmp_path / "export"))
  metadata_file = os.path.join(other, exports.METADATA_FILE)
  with open(metadata_file) as f:
    metadata = json.load(f)
  with open(metadata_file, "w") as f:
    json.dump(dict(metadata, run={"lengths": [32, 16]}), f)
  with pytest.raises(ValueError, match=r"trained with P, R = \[32, 16\] \(gr2jax_metadata\.json "
                                       r"run\.lengths\), the data build in --workdir=\S+ has "
                                       r"\[64, 48\]: not its data build"):
    add_bundle.add_bundle(other, workdir)
  with open(metadata_file, "w") as f:
    json.dump(dict(metadata, data_build=dict(metadata["data_build"], sids_sha256="0" * 64)), f)
  with pytest.raises(ValueError, match=r"another data build .*semantic IDs sids_sha256"):
    add_bundle.add_bundle(other, workdir)
  with open(metadata_file, "w") as f:
    json.dump({k: v for k, v in metadata.items() if k != "data_config"}, f)
  with pytest.raises(ValueError, match=r"records no data_config .*no data build to bundle"):
    add_bundle.add_bundle(other, workdir)
  assert not os.path.exists(os.path.join(other, bundle.DIRECTORY))
  shutil.rmtree(other)
  with pytest.raises(exports.CheckpointError, match="not a gr2jax checkpoint"):
    add_bundle.add_bundle(other, workdir)


@pytest.mark.parametrize("damage", ["lost", "edited"])
def test_a_chain_exports_bundle_is_repaired_and_its_step_reused(built, tmp_path, damage):
  """A chain step's export (its completion record, data/pipeline.mark_complete) that lost its
  bundle.json, or whose bundle.json was edited (its digest is the export's record): add_bundle.py
  writes it again, records its digest and the completion record, so the step counts as intact
  (the chain reuses it, not retrains it) and the export loads."""
  config, _, workdir, export = built
  copy = str(tmp_path / "export")
  shutil.copytree(export, copy)
  pipeline.mark_complete(copy)
  record = os.path.join(copy, bundle.DIRECTORY, bundle.BUNDLE_FILE)
  if damage == "lost":
    os.remove(record)
  else:
    with open(record) as f:
      fields = json.load(f)
    with open(record, "w") as f:
      json.dump(dict(fields, thresholds=[[0.5] * 3] * 3), f)
    with pytest.raises(ValueError, match=r"bundle\.json: sha256 .* the export records "
                                         r"\(gr2jax_metadata\.json field 'bundle_sha256'\)"):
      bundle.read(copy, config)
  assert pipeline.incomplete(copy) is not None
  add_bundle.add_bundle(copy, workdir)
  assert pipeline.incomplete(copy) is None
  assert exports.load_metadata(copy) == exports.load_metadata(export)
  assert bundle.read(copy, config).prompt_len == bundle.read(export, config).prompt_len


def test_damage_beyond_the_bundle_keeps_the_completion_record(built, tmp_path):
  """Params damaged too: the bundle is written, the completion record is left as it was, so the
  chain still redoes the step."""
  _, _, workdir, export = built
  copy = str(tmp_path / "export")
  shutil.copytree(export, copy)
  pipeline.mark_complete(copy)
  os.remove(os.path.join(copy, bundle.DIRECTORY, bundle.BUNDLE_FILE))
  with open(os.path.join(copy, exports.PARAMS_DIR, exports.MANIFEST_FILE), "a") as f:
    f.write(" ")
  add_bundle.add_bundle(copy, workdir)
  assert "manifest.json has" in pipeline.incomplete(copy)
