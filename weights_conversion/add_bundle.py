r"""Writes a stage export's inference bundle from its data build (decoding/bundle.py):

  python weights_conversion/add_bundle.py --export=W/cft/export --workdir=W

For an export written before exports carried a bundle, or before they recorded its bundle.json's
digest, or one whose bundle is incomplete, edited, damaged or of an older format (gr2jax.rerank,
the server and the chain refuse those, naming this command). The data build the export records
(its data_config) is run in --workdir, or reused where that workdir already holds it (cached by
its inputs' digest); it must be the export's own: the tokenizer vocabulary, prompt and, where the
export records them, semantic IDs (exports.check_data_build) and static widths P, R (its run
record). The bundle is then written as a training stage writes it (bundle.write: the build's
tokenizer files beside the params, inference/ renamed into place whole, replacing the one there,
and the sha256 of its bundle.json recorded in the metadata, `bundle_sha256`) and read back with
its checks. The params and the rest of the metadata are not touched. A chain step's export (with
its completion record, data/pipeline.mark_complete) whose only damaged files were its bundle's
gets its completion record written again, so the chain reuses the step instead of redoing it.
"""

import os
import sys

import ml_collections
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gr2jax import cli, exports  # noqa: E402
from gr2jax.data import build_rendering, pipeline  # noqa: E402
from gr2jax.data import lengths as lengths_lib  # noqa: E402
from gr2jax.data import tokenizer as tokenizer_lib  # noqa: E402
from gr2jax.decoding import bundle  # noqa: E402


def add_bundle(export: str, workdir: str) -> bundle.Inference:
  """Writes the inference bundle of `export` from its data build in `workdir`.

  Args:
    export: a stage's export (records its data_config).
    workdir: where its data build is run or reused.

  Returns:
    The bundle as the reranker reads it (bundle.read).

  Raises:
    exports.CheckpointError: `export` is not a gr2jax export.
    ValueError: it records no data_config; the data build in `workdir` is not its own (names
      what differs).
  """
  exports.load_config(export)  # a gr2jax export, or a named refusal
  metadata = exports.load_metadata(export)
  if not metadata.get("data_config"):
    raise ValueError(f"{export}: records no data_config (not a stage's export, or one written "
                     "before exports recorded their recipe): no data build to bundle")
  data_config = ml_collections.ConfigDict(metadata["data_config"])
  summary = pipeline.run(data_config, workdir)
  rendering = build_rendering.load_rendering(summary, data_config)
  tokenizer = tokenizer_lib.load_tokenizer(summary["paths"]["tokenizer"])
  exports.check_data_build(export, exports.data_build_record(tokenizer, rendering.prompt,
                                                             rendering.catalogue.sids))
  trained = (metadata.get("run") or {}).get("lengths")
  built = list(lengths_lib.static_lengths(summary))
  if trained is not None and trained != built:
    raise ValueError(f"{export} was trained with P, R = {trained} ({exports.METADATA_FILE} "
                     f"run.lengths), the data build in --workdir={workdir} has {built}: not its "
                     "data build")
  damaged = pipeline.damaged_files(export)  # None: no completion record (not a chain step's)
  bundle.write(export, summary, rendering)
  if damaged is not None and all(bundle.is_bundle_file(name) for name in damaged):
    pipeline.mark_complete(export)  # the bundle's files and the metadata changed, nothing else
  return bundle.read(export, data_config)


def define_flags() -> None:
  """The command line's flags (defined only when run as a script: tests import the module beside
  other absl mains that define --workdir)."""
  flags.DEFINE_string("export", None, "The stage export to bundle (e.g. W/cft/export).")
  flags.DEFINE_string("workdir", None, "The workdir where its data build is run or reused.")


def main(argv):
  del argv
  if not flags.FLAGS.export or not flags.FLAGS.workdir:
    raise app.UsageError("--export and --workdir are required")
  inference = add_bundle(flags.FLAGS.export, flags.FLAGS.workdir)
  print(f"wrote {os.path.join(flags.FLAGS.export, bundle.DIRECTORY)}: format {bundle.FORMAT}, "
        f"P={inference.prompt_len} R={inference.response_len}, "
        f"{inference.rendering.catalogue.catalog.num_items} items, from the data build in "
        f"{flags.FLAGS.workdir}")


if __name__ == "__main__":
  define_flags()
  cli.run(main)
