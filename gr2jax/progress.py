"""Console progress bars for long work (training, evaluation, data-build steps).

tqdm on stderr with rate and ETA; silent on processes other than 0 and when GR2JAX_PROGRESS=0.
"""

import os

import jax
import tqdm


def progress(total: int, initial: int = 0, desc: str = "", unit: str = "it",
             disable: bool = False) -> tqdm.tqdm:
  """A progress bar over `total` units of work."""
  off = disable or os.environ.get("GR2JAX_PROGRESS", "1") == "0" or jax.process_index() != 0
  return tqdm.tqdm(total=total, initial=initial, desc=desc, unit=unit, dynamic_ncols=True,
                   mininterval=2.0, disable=off)
