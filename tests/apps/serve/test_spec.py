"""The serve block as one typed value (gr2jax/apps/serve/spec.py): every field checked once,
errors naming serve.<field>, and serve.mode / draft_ks / cost_table as one typed decoder choice."""

import pytest

from gr2jax import recipes
from gr2jax.apps.serve import auto
from gr2jax.apps.serve import spec as spec_lib


def _spec(**overrides) -> spec_lib.ServeSpec:
  """The serve block's defaults with overrides (a plain dict: a ConfigDict would refuse a value
  of another type before the spec sees it)."""
  return spec_lib.ServeSpec.from_config(recipes.config("", "serve").serve.to_dict() | overrides)


def test_every_block_field_is_a_spec_field_or_the_decoder_choice():
  block = recipes.config("", "serve").serve
  fields = {f.name for f in spec_lib.dataclasses.fields(spec_lib.ServeSpec)}
  assert set(block.keys()) == (fields - {"choice"}) | {"mode", "draft_ks", "cost_table"}


def test_the_mode_becomes_a_typed_decoder_choice():
  assert _spec().choice == auto.Fixed()
  spec = _spec(mode="auto", verify_with="v", draft_ks=[2, 8], cost_table="t.json")
  assert spec.choice == auto.Auto((2, 8), "t.json") and spec.choice.mode == "auto"


@pytest.mark.parametrize("field,value", [
  ("ckpt", ""), ("prompt_lengths", (0,)), ("prompt_lengths", "96"), ("items_file", 3),
  ("max_new_tokens", -1), ("max_new_tokens", 1.5), ("verify_with", None),
  ("model_name", 1), ("compilation_cache", False), ("keep_alive_s", 0.0),
  ("drain_timeout_s", -1.0), ("max_body_bytes", 0), ("mode", "fast"), ("cost_table", 1)])
def test_a_bad_field_is_named(field, value):
  with pytest.raises(ValueError, match=rf"^serve\.{field}[= \[]"):
    _spec(**{field: value})


def test_a_fixed_choice_serves_its_one_decoder_and_auto_the_cheapest_per_bucket():
  decoders = {"ar": None, "lossless_k4": None}
  assert auto.Fixed().chosen((1, 4), decoders) == {1: "ar", 4: "ar"}
  assert auto.Fixed().report() is None
  choice = auto.Auto((4,)).with_costs({1: {"ar": 2.0, "lossless_k4": 1.0}, 4: {"ar": 1.0}})
  assert choice.decoder(1, decoders) == "lossless_k4"
  assert choice.chosen((1, 4, 8), decoders) == {1: "lossless_k4", 4: "ar"}
  assert auto.Auto((4,)).chosen((1, 4), decoders) == {}
  with pytest.raises(ValueError, match=r"no cost for batch bucket 8"):
    choice.decoder(8, decoders)
