"""The recipe's `table` block: `TableSettings`, with Figure 6's settings nested as `fig6`
(`Fig6Settings`): what Table 2 (gr2jax/apps/table2.py), Table 3, Table 4 and Figure 6
(gr2jax/apps/tables.py) evaluate and time. The defaults are the tiny recipe's.

Declared with the one settings schema (gr2jax/settings.py); this module imports nothing else of
gr2jax but the commit orders' names (gr2jax/diffusion/commit.py), so the recipe (gr2jax/recipe.py,
a floor below the applications) holds the block typed.
"""

import dataclasses
import os

from gr2jax import settings
from gr2jax.diffusion import commit

SPLITS = ("test_1615", "test", "validation")  # the evaluation splits (test_1615: the paper's 1,615
#                                               users of the test split)
TABLES = ("table3", "table4", "fig6")  # the tables table2.py may run after Table 2


def _draft(where: str, name: str, value) -> None:
  """A lossless row's (K, tau_d): K >= 1 tokens drafted per verify forward, tau_d in [0, 1]."""
  if not isinstance(value, (tuple, list)) or len(value) != 2:
    raise settings.WrongKind(f"{settings.label(where, name)}={value!r} must be a pair (K, "
                             "tau_d)")
  settings.check_int(where, f"{name}[0]", value[0], minimum=1)
  settings.check_real(where, f"{name}[1]", value[1], low=0, high=1)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fig6Settings(settings.Settings):
  """Figure 6: the speed-up over AR by output and prompt length, every example decoded alone."""

  WHERE = "table.fig6."

  tau: float = settings.real(0.9, doc="diffusion commit threshold of the timed decodes", low=0,
                             high=1, low_open=True)
  limit: int = settings.integer(300, doc="examples decoded one by one by each model (0 = the "
                                "whole split)", minimum=0)
  num_bins: int = settings.integer(6, doc="quantile bins of output / prompt length", minimum=1)
  output_lengths: tuple[int, ...] = settings.ints((32, 64, 128, 256), doc="forced output lengths "
                                                  "of the sweep", minimum=1)
  sweep_examples: int = settings.integer(20, doc="examples decoded (batch 1) at each forced "
                                         "length per model", minimum=0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TableSettings(settings.Settings):
  """The `table` block: Table 2's splits and results directory; Table 3, Table 4 and Figure 6's
  split, thresholds, lossless rows and timings."""

  WHERE = "table."

  splits: tuple[str, ...] = settings.texts(("test_1615", "test"), doc="Table 2's splits (the "
                                           "paper's 1,615 users, all users)", choices=SPLITS)
  diffusion_splits: tuple[str, ...] = settings.texts(
    ("test_1615",), doc="of splits, where the diffusion rows are evaluated too (at tau 1.0 a row "
    "on all 22,363 test users takes 13 min on 2 CPU cores)", choices=SPLITS)
  results_dir: str = settings.text(os.path.join("{workdir}", "results"), doc="where the tables "
                                   "go (table2.{md,csv,json}, ...)", nonempty="a directory")
  then: tuple[str, ...] = settings.texts(TABLES, doc="tables run after Table 2 by table2.py",
                                         choices=TABLES)
  split: str = settings.choice("test_1615", doc="the split of Table 3, Table 4 and Figure 6",
                               choices=SPLITS)
  taus: tuple[float, ...] = settings.reals(
    (1.0, 0.9, 0.8, 0.6, 0.4), doc="Table 3's diffusion commit thresholds (the paper's: 0.9, "
    "0.6, 0.4; 1.0 = Table 2's)", low=0, high=1, low_open=True)
  commit_orders: tuple[str, ...] = settings.texts(
    (), doc="Table 3's diffusion rows: every tau of taus decoded under each of these commit "
    "orders (decode.commit_order, the recipe's own, among them; the paper's: confidence); () = "
    "decode.commit_order alone", choices=commit.ORDERS)
  full_split_taus: tuple[float, ...] = settings.reals(
    (), doc="of taus: the final diffusion model at each (under decode.commit_order) on every "
    "user of `test`, paired per user with itself at tau 1.0 and with AR GR2 there (Table 3's "
    "full_split; () = none)", low=0, high=1, low_open=True)
  speed_examples: int = settings.integer(100, doc="Table 3: examples decoded alone for batch-1 "
                                         "tokens/s (0 = skip)", minimum=0)
  lossless_drafts: tuple = settings.items(
    ((16, 0.0), (8, 0.9)), doc="Table 3's lossless rows, (K, tau_d) each (the final diffusion "
    "model drafts, AR GR2 verifies)", what="(K, tau_d) pairs", item=_draft)
  remeasure: bool = settings.flag(False, doc="time Table 3's batch-1 decodes and Figure 6 again "
                                  "(else a finished table's timings of the same models and "
                                  "settings are reused)")
  fig6: Fig6Settings = settings.block(Fig6Settings, doc="Figure 6's settings")

  def check(self, where: str) -> None:
    """The diffusion rows' splits are splits of Table 2, the full-split taus are taus of Table 3
    and its commit orders are distinct."""
    for name, values, within in (("diffusion_splits", self.diffusion_splits, "splits"),
                                 ("full_split_taus", self.full_split_taus, "taus")):
      extra = [v for v in values if v not in getattr(self, within)]
      if extra:
        raise ValueError(f"{settings.label(where, name)}={values!r}: {extra} not in "
                         f"{settings.label(where, within)}={getattr(self, within)!r}")
    if len(set(self.commit_orders)) != len(self.commit_orders):
      raise ValueError(f"{settings.label(where, 'commit_orders')}={self.commit_orders!r} must be "
                       "distinct commit orders")
