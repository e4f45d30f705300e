"""The one settings schema (gr2jax/settings.py): the scalar checks, every field kind, `Cls.of`
naming the path, nested blocks, to_dict / defaults / to_config / describe / count_fields; and
the decoders' and the tools' blocks declared with it, whose defaults are the tiny recipe's
blocks."""

import dataclasses

import numpy as np
import pytest

from gr2jax import recipes, settings
from gr2jax.apps.serve.spec import ServeSpec
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion.commit import ORDERS
from gr2jax.table_settings import Fig6Settings, TableSettings
from gr2jax.tool_settings import EvaluateSettings, RerankSettings


@pytest.mark.parametrize("check, error, match", [
  (lambda: settings.check_int("decode.", "k", 0, minimum=1), ValueError,
   r"^decode\.k=0 must be >= 1$"),
  (lambda: settings.check_int("f", "port", 70000, maximum=65535), ValueError,
   r"^f: port=70000 must be <= 65535$"),
  (lambda: settings.check_int("f", "n", 2.0), TypeError, r"^f: n must be an int, got float 2.0$"),
  (lambda: settings.check_int("f", "n", True), TypeError, r"^f: n must be an int, got bool"),
  (lambda: settings.check_real("f", "tau", 0.0, low=0, high=1, low_open=True, note=" (why)"),
   ValueError, r"^f: tau=0.0 must be in \(0, 1\] \(why\)$"),
  (lambda: settings.check_real("f", "tau", 1.5, low=0, high=1), ValueError,
   r"^f: tau=1.5 must be in \[0, 1\]$"),
  (lambda: settings.check_real("s.", "t", -1.0, low=0), ValueError, r"^s\.t=-1.0 must be >= 0$"),
  (lambda: settings.check_real("s.", "t", 0, low=0, low_open=True), ValueError,
   r"^s\.t=0 must be > 0$"),
  (lambda: settings.check_real("s.", "t", 1, high=1, high_open=True), ValueError,
   r"^s\.t=1 must be < 1$"),
  (lambda: settings.check_real("s.", "t", float("nan"), low=0), ValueError,
   r"^s\.t=nan must be finite"),
  (lambda: settings.check_real("f", "t", "0.9"), TypeError,
   r"^f: t must be a real number, got str"),
  (lambda: settings.check_choice("f", "order", "x", ("a", "b")), ValueError,
   r"^f: order='x' not in \('a', 'b'\)$"),
  (lambda: settings.check_bool("d.", "on", 1), TypeError, r"^d\.on must be a bool, got int 1$"),
  (lambda: settings.check_text("", "path", 1), TypeError, r"^path=1 must be a string$"),
  (lambda: settings.check_text("b.", "path", "", nonempty="a path"), ValueError,
   r"^b\.path='' must be a path$"),
])
def test_scalar_checks_name_the_field(check, error, match):
  with pytest.raises(error, match=match):
    check()


def test_a_wrong_kind_is_both_a_type_and_a_value_error():
  """Settings blocks report every bad setting as a ValueError, entry points a wrong kind as a
  TypeError: the one error is both."""
  for check in (lambda: settings.check_int("f", "n", "1"),
                lambda: settings.check_bool("f", "b", 0)):
    with pytest.raises(settings.WrongKind) as raised:
      check()
    assert isinstance(raised.value, TypeError) and isinstance(raised.value, ValueError)


def test_scalar_checks_return_the_value_inside_the_bounds():
  assert settings.check_int("f", "n", np.int64(3), minimum=1, maximum=3) == 3
  assert settings.check_real("f", "t", 1, low=0, high=1, low_open=True) == 1.0
  settings.check_choice("f", "o", "a", ("a",))
  settings.check_bool("f", "b", False)


def _positive(where, name, value):
  if value <= 0:
    raise ValueError(f"{settings.label(where, name)}={value} must be positive")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Inner(settings.Settings):
  """A nested block."""
  rate: float = settings.real(0.5, doc="a rate", low=0, high=1)
  names: tuple = settings.texts(("a",), doc="names", choices=("a", "b"))


@dataclasses.dataclass(frozen=True, kw_only=True)
class Outer(settings.Settings):
  """A block of every kind: its fields out of name order, one without a default."""
  WHERE = "outer."
  size: int = settings.integer(doc="a size", minimum=1)
  on: bool = settings.flag(False, doc="a switch")
  mode: str = settings.choice("x", doc="a mode", choices=("x", "y"))
  path: str = settings.text("p", doc="a path", nonempty="a path")
  widths: tuple = settings.ints((1, 2), doc="widths", minimum=1, ascending=True)
  taus: tuple = settings.reals((0.5,), doc="thresholds", low=0, high=1)
  pairs: tuple = settings.items(((1, 2),), doc="pairs", what="pairs",
                                item=lambda w, n, v: settings.check_int(w, n, v[0], minimum=0))
  other: object = settings.value(1, doc="", what="a positive number", check=_positive)
  inner: Inner = settings.block(Inner, doc="the nested block")
  bound: int = settings.integer(4, doc="at least size", minimum=0)

  def check(self, where: str) -> None:
    if self.bound < self.size:
      raise ValueError(f"{settings.label(where, 'bound')}={self.bound} must be >= size")


def test_every_kind_keeps_the_value_given_and_a_list_as_a_tuple():
  o = Outer.of({"size": np.int64(2), "widths": [1, 3], "inner": {"rate": 1}}, "run.outer.")
  assert type(o.size) is np.int64 and o.inner.rate == 1 and type(o.inner.rate) is int
  assert o.widths == (1, 3) and o.inner == Inner(rate=1)
  assert o == Outer(size=2, widths=(1, 3), inner=Inner(rate=1))


@pytest.mark.parametrize("values, match", [
  ({"size": 0}, r"^run\.size=0 must be >= 1$"),
  ({"size": "2"}, r"^run\.size must be an int, got str"),
  ({"size": 2, "on": 1}, r"^run\.on must be a bool"),
  ({"size": 2, "mode": "z"}, r"^run\.mode='z' not in \('x', 'y'\)$"),
  ({"size": 2, "path": ""}, r"^run\.path='' must be a path$"),
  ({"size": 2, "widths": (2, 1)}, r"^run\.widths=\(2, 1\) must be ascending distinct ints$"),
  ({"size": 2, "widths": ()}, r"^run\.widths=\(\) must be ascending distinct ints$"),
  ({"size": 2, "widths": (0,)}, r"^run\.widths\[0\]=0 must be >= 1$"),
  ({"size": 2, "widths": 3}, r"^run\.widths=3 must be a tuple of ints >= 1$"),
  ({"size": 2, "taus": (0.5, 2.0)}, r"^run\.taus\[1\]=2.0 must be in \[0, 1\]$"),
  ({"size": 2, "pairs": ((-1, 0),)}, r"^run\.pairs\[0\]=-1 must be >= 0$"),
  ({"size": 2, "other": 0}, r"^run\.other=0 must be positive$"),
  ({"size": 2, "inner": {"rate": 2}}, r"^run\.inner\.rate=2 must be in \[0, 1\]$"),
  ({"size": 2, "inner": {"names": ("c",)}}, r"^run\.inner\.names\[0\]='c' not in"),
  ({"size": 2, "inner": 3}, r"^run\.inner must be a Inner block, got int$"),
  ({"size": 5}, r"^run\.bound=4 must be >= size$"),
  ({"size": 2, "sise": 2}, r"^run\.sise is not a setting \(the settings of run\.: bound, "),
  ({"size": 2, "inner": {"rat": 1}}, r"^run\.inner\.rat is not a setting"),
  ({}, r"^run\.size must be given$"),
])
def test_of_names_the_path_of_a_bad_field(values, match):
  with pytest.raises(ValueError, match=match):
    Outer.of(values, "run.")


def test_a_block_built_directly_is_named_by_its_where():
  with pytest.raises(ValueError, match=r"^outer\.size=0 must be >= 1$"):
    Outer(size=0)
  with pytest.raises(ValueError, match=r"^rate=2 must be in \[0, 1\]$"):
    Inner(rate=2)
  with pytest.raises(ValueError, match=r"^outer\.bound=0 must be >= size$"):
    Outer(size=1).replace(bound=0)  # a copy is checked again


def test_to_dict_is_nested_dicts_in_name_order():
  d = Outer(size=2).to_dict()
  assert list(d) == sorted(d) and list(d["inner"]) == ["names", "rate"]
  assert d["inner"] == {"names": ("a",), "rate": 0.5} and d["size"] == 2


def test_defaults_to_config_and_of_round_trip():
  assert settings.defaults(Outer) == {
    "on": False, "mode": "x", "path": "p", "widths": (1, 2), "taus": (0.5,), "pairs": ((1, 2),),
    "other": 1, "inner": {"rate": 0.5, "names": ("a",)}, "bound": 4}  # size: no default
  config = settings.to_config(Outer, {"size": 3})
  config.inner.rate = 0.25  # a nested block is a nested ConfigDict the command line overrides
  assert Outer.of(config.to_dict(), "outer.") == Outer(size=3, inner=Inner(rate=0.25))
  assert Outer.of(config.to_dict(), "outer.").to_dict() == config.to_dict()


def test_describe_and_count_fields():
  lines = settings.describe(Outer, "outer.", {"size": 3})
  assert lines[0] == "outer.size = 3  (int >= 1) a size"
  assert "outer.inner.rate = 0.5  (real in [0, 1]) a rate" in lines
  assert settings.describe(Outer)[0] == "size = (required)  (int >= 1) a size"
  assert len(lines) == 11
  assert settings.count_fields(Outer) == (10, 11)  # `other` has no doc


def _tiny(stage: str, block: str) -> dict:
  return recipes.config("tiny", stage)[block].to_dict()


@pytest.mark.parametrize("cls, stage, block", [
  (ServeSpec, "serve", "serve"), (RerankSettings, "rerank", "rerank"),
  (EvaluateSettings, "eval", "evaluate"), (TableSettings, "table2", "table")])
def test_a_blocks_defaults_are_the_tiny_recipes_block(cls, stage, block):
  values = _tiny(stage, block)
  assert settings.defaults(cls) == values
  built = cls.of(values, f"{block}.")
  assert built == cls() and built.to_dict() == values


def test_the_decode_spec_defaults_are_the_tiny_recipes_but_its_commit_order():
  values = _tiny("table2", "decode")
  assert settings.defaults(DecodeSpec) | {"commit_order": "distinct"} == values
  assert DecodeSpec.of(values, "decode.") == DecodeSpec(commit_order="distinct")


@pytest.mark.parametrize("cls, where, values, match", [
  (ServeSpec, "serve.", {"queue_bound": 0}, r"^serve\.queue_bound=0 must be >= 1$"),
  (RerankSettings, "rerank.", {"batch_size": 0}, r"^rerank\.batch_size=0 must be >= 1$"),
  (RerankSettings, "rerank.", {"max_new_tokens": -1}, r"^rerank\.max_new_tokens=-1 must be >= 0"),
  (EvaluateSettings, "evaluate.", {"convert": "yes"}, r"^evaluate\.convert must be a bool"),
  (TableSettings, "table.", {"fig6": {"tau": 0}}, r"^table\.fig6\.tau=0 must be in \(0, 1\]$"),
  (TableSettings, "table.", {"splits": ("dev",)}, r"^table\.splits\[0\]='dev' not in"),
  (TableSettings, "table.", {"then": ("table5",)}, r"^table\.then\[0\]='table5' not in"),
  (TableSettings, "table.", {"lossless_drafts": ((0, 0.5),)},
   r"^table\.lossless_drafts\[0\]\[0\]=0 must be >= 1$"),
  (TableSettings, "table.", {"lossless_drafts": ((4, 1.5),)},
   r"^table\.lossless_drafts\[0\]\[1\]=1.5 must be in \[0, 1\]$"),
  (TableSettings, "table.", {"lossless_drafts": (4,)},
   r"^table\.lossless_drafts\[0\]=4 must be a pair"),
  (TableSettings, "table.", {"splits": ("test",)},
   r"^table\.diffusion_splits=\('test_1615',\): \['test_1615'\] not in table\.splits"),
  (TableSettings, "table.", {"full_split_taus": (0.7,)},
   r"^table\.full_split_taus=\(0\.7,\): \[0\.7\] not in table\.taus=\(1\.0, 0\.9"),
  (TableSettings, "table.", {"taus": (1.0, 0.9), "full_split_taus": (0.6,)},
   r"^table\.full_split_taus=\(0\.6,\): \[0\.6\] not in table\.taus=\(1\.0, 0\.9\)$"),
  (TableSettings, "table.", {"commit_orders": ("random",)},
   r"^table\.commit_orders\[0\]='random' not in \('confidence', 'left_to_right', 'distinct'\)$"),
  (TableSettings, "table.", {"commit_orders": ("distinct", "distinct")},
   r"^table\.commit_orders=\('distinct', 'distinct'\) must be distinct commit orders$"),
  (DecodeSpec, "decode.", {"eval_tau": 0.0}, r"^decode\.eval_tau=0.0 must be in \(0, 1\]$"),
  (DecodeSpec, "decode.", {"commit_order": "random"}, r"^decode\.commit_order='random' not in"),
])
def test_a_bad_value_names_its_path(cls, where, values, match):
  with pytest.raises(ValueError, match=match):
    cls.of(values, where)


def test_table3_orders_and_full_split_default_to_what_the_stamped_results_did():
  """Until the run that restamps results/: the recipe's own order alone, no full-split rows
  (their digest is the stamped one's, report._added_at_default); both orders and tau 0.6 on the
  full split are settings."""
  t = TableSettings()
  assert t.taus == (1.0, 0.9, 0.8, 0.6, 0.4)
  assert t.commit_orders == () and t.full_split_taus == ()
  both = TableSettings(taus=(1.0, 0.6, 0.5), commit_orders=("distinct", "confidence"),
                       full_split_taus=(0.6,))
  assert set(both.commit_orders) <= set(ORDERS) and both.full_split_taus == (0.6,)


def test_a_nested_block_built_directly_names_its_path():
  with pytest.raises(ValueError, match=r"^table\.fig6\.num_bins=0 must be >= 1$"):
    Fig6Settings(num_bins=0)
  assert TableSettings().fig6 == Fig6Settings()
