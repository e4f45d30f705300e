"""The reranker's load path (gr2jax/decoding/reranker.py load_reranker): a bundled export loads
alone and light (the server's imports and the load pull in no data pipeline, TFDS, sklearn,
optax or torch), an export that never had a bundle is refused unless the caller names the
workdir of its data build, and a data build other than the export's is refused. Decoding and
request handling are tested in tests/apps/test_rerank.py."""

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from gr2jax import exports
from gr2jax.data import pipeline
from gr2jax.decoding import bundle
from gr2jax.decoding import reranker as reranker_lib
from tests.decoding import tiny_export
from tests.smoke_workdir import REPO, env

HEAVY = ("tensorflow_datasets", "sklearn", "optax", "gr2jax.data.pipeline")


def test_a_bundled_export_loads_without_the_data_build_modules_or_torch(bundled):
  """In a fresh process, as a serving replica starts: `import gr2jax.apps.serve.server` imports
  neither transformers nor torch; then load_reranker of the export imports none of HEAVY and
  not torch (its tokenizer is read without transformers' AutoTokenizer, data/tokenizer.py)."""
  code = ("import sys; import gr2jax.apps.serve.server; "
          "print(sorted(m for m in ('transformers', 'torch') if m in sys.modules)); "
          "from gr2jax.decoding import reranker; "
          f"r = reranker.load_reranker({bundled.export!r}); "
          "assert r.prompt_len > 0; "
          f"print(sorted(m for m in {HEAVY + ('torch',)!r} if m in sys.modules))")
  out = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env(), capture_output=True,
                       text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.strip().splitlines()[-2:] == ["[]", "[]"]


def test_an_export_that_never_had_a_bundle_needs_its_workdir(bundled, tmp_path, monkeypatch):
  """No inference/: refused in one line naming add_bundle.py or workdir=, with nothing built or
  written (it used to build the data in the export's grandparent directory); with workdir= it
  reads the data build there, as the bundle does."""
  grandparent = tmp_path / "srv"
  old = tiny_export.copy_without_bundle(bundled.export, str(grandparent / "models" / "export"))
  before = sorted(os.listdir(grandparent))
  with monkeypatch.context() as m:
    m.setattr(pipeline, "run", lambda *a, **k: pytest.fail("the data build ran"))
    with pytest.raises(ValueError, match=(
        rf"^{re.escape(old)}: the export has no inference bundle \(inference/, written by "
        rf"training stages since exports carried one\): add it with `python weights_conversion/"
        rf"add_bundle\.py --export={re.escape(old)} --workdir=<the workdir of its data build>`, "
        r"or pass workdir= of its data build$")):
      reranker_lib.load_reranker(old)
  assert sorted(os.listdir(grandparent)) == before
  from_build = reranker_lib.load_reranker(old, workdir=bundled.workdir)
  from_bundle = reranker_lib.load_reranker(bundled.export)
  assert from_build.prompt_len == from_bundle.prompt_len
  assert from_build.policy.max_new_tokens == from_bundle.policy.max_new_tokens
  np.testing.assert_array_equal(from_build.rendering.thresholds, from_bundle.rendering.thresholds)
  np.testing.assert_array_equal(from_build.rendering.catalogue.sids,
                                from_bundle.rendering.catalogue.sids)
  assert from_build.tokenizer.get_vocab() == from_bundle.tokenizer.get_vocab()


def test_a_data_build_with_other_semantic_ids_is_refused(bundled, tmp_path):
  """The export's data build record holds its SIDs' digest: a bundle rewritten with the
  same-shaped SIDs of another build (consistent digests) is still not the export's."""
  export = str(tmp_path / "export")
  tiny_export.copy_without_bundle(bundled.export, export)
  sids = np.load(bundled.summary["paths"]["sids"])
  other = str(tmp_path / "other_sids.npy")
  np.save(other, sids[np.random.default_rng(0).permutation(len(sids))])
  summary = {**bundled.summary, "paths": {**bundled.summary["paths"], "sids": other}}
  from gr2jax.data import build_rendering

  bundle.write(export, summary, build_rendering.load_rendering(summary, bundled.config))
  assert bundle.read(export, bundled.config) is not None  # the bundle itself is consistent
  with pytest.raises(ValueError, match=rf"^{re.escape(export)} was trained on another data build "
                                       r"than this one .*: semantic IDs sids_sha256 \w+ vs \w+"):
    reranker_lib.load_reranker(export)
  assert exports.load_metadata(export)["data_build"]["sids_sha256"] == exports.sids_digest(sids)
