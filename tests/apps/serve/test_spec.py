"""The serve block as one typed value (gr2jax/apps/serve/spec.py): every field declared and
checked once, errors naming serve.<field>, and serve.mode / draft_ks / cost_table as one typed
decoder choice."""

import dataclasses

import pytest

from gr2jax import recipes, settings, tool_settings
from gr2jax.apps.serve import auto
from gr2jax.apps.serve import spec as spec_lib


def _spec(**overrides) -> spec_lib.ServeSpec:
  """The serve block's defaults with overrides (a plain dict: a ConfigDict would refuse a value
  of another type before the spec sees it)."""
  return spec_lib.ServeSpec.of(recipes.config("", "serve").serve.to_dict() | overrides, "serve.")


def test_the_spec_declares_the_serve_block():
  """Its defaults are the block's values, its to_dict() the block's (records); a ConfigDict
  block reads as its dict does."""
  block = recipes.config("", "serve").serve
  assert settings.defaults(spec_lib.ServeSpec) == block.to_dict()
  assert spec_lib.ServeSpec() == spec_lib.ServeSpec.of(block, "serve.") == _spec()
  assert _spec().to_dict() == block.to_dict()
  assert {f.name for f in dataclasses.fields(spec_lib.ServeSpec)} == set(block.keys())
  assert tool_settings.SERVE_MODES == tuple(auto.CHOICES)  # serve.mode's values: the choices


def test_the_mode_becomes_a_typed_decoder_choice():
  assert _spec().choice == auto.Fixed()
  spec = _spec(mode="auto", verify_with="v", draft_ks=[2, 8], cost_table="t.json")
  assert spec.choice == auto.Auto((2, 8), "t.json") and spec.choice.mode == "auto"
  assert spec.draft_ks == (2, 8)  # a list given is held as a tuple
  with pytest.raises(ValueError, match=r"^serve\.cost_table='t\.json' chooses serve\.mode='auto'"):
    _spec(cost_table="t.json")


@pytest.mark.parametrize("field,value", [
  ("ckpt", ""), ("prompt_lengths", (0,)), ("prompt_lengths", "96"), ("items_file", 3),
  ("max_new_tokens", -1), ("max_new_tokens", 1.5), ("verify_with", None),
  ("model_name", 1), ("compilation_cache", False), ("keep_alive_s", 0.0),
  ("drain_timeout_s", -1.0), ("max_body_bytes", 0), ("mode", "fast"), ("cost_table", 1),
  ("draft_ks", (8, 4)), ("draft_ks", ()), ("draft_ks", (0,)), ("batch_buckets", [2, 2]),
  ("port", 70000), ("host", "")])
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
