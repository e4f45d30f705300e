"""The static token widths of a data build: every prompt / response array is this wide.

`static_lengths(summary)` is the one definition of (P, R) that every stage, evaluation, table,
the re-ranking tool and the server use: the build's longest prompt and response over every split
(the pipeline's `static_lengths`), rounded up to LENGTH_MULTIPLE.
"""

from collections.abc import Mapping

LENGTH_MULTIPLE = 16  # every static prompt / response width is rounded up to this


def round_up(x: int, multiple: int = LENGTH_MULTIPLE) -> int:
  """x rounded up to a multiple of `multiple`."""
  return -(-x // multiple) * multiple


def static_lengths(summary: Mapping) -> tuple[int, int]:
  """(P, R) of a data build from its summary (pipeline.run's return value / summary.json)."""
  n = summary["static_lengths"]
  return round_up(int(n["prompt"])), round_up(max(int(n["response"]), 1))
