"""A data build's Rendering read from its files (gr2jax/data/build_rendering.py): the exact
evidence thresholds behind the summary's rounded ones. The Rendering of a whole small build is
tested with the bundle written from it (tests/decoding/test_bundle.py)."""

import numpy as np

from gr2jax.data import build_rendering
from gr2jax.data import evidence as evidence_lib


def test_exact_thresholds_undo_the_summary_rounding():
  """Levels on a threshold (1/3 at a quantile) stay in the lower bucket, as in the build; the
  summary's 0.333333 alone would move them up."""
  exact = np.asarray([[0.1, 0.2, 1 / 3]] * 3)
  levels = np.asarray([[1 / 3, 1 / 3 + 1e-7, 0.2], [0.05, 0.3, 0.5], [1 / 3 - 1e-7, 0.0, 0.1]]).T
  levels = np.concatenate([levels, [[0.2, 0.2, 0.2], [0.2 + 1e-7] * 3]])
  buckets = evidence_lib.bucketize(levels, exact)
  rounded = exact.round(6)
  assert (evidence_lib.bucketize(levels, rounded) != buckets).any()
  recovered = build_rendering.exact_thresholds(rounded, levels, buckets)
  np.testing.assert_array_equal(evidence_lib.bucketize(levels, recovered), buckets)
