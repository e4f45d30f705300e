"""The decoders' one settings convention (model/decode_core.py `Decoding`): every decoder takes
(model(s), prompt_tokens, prompt_lengths, decoding, *, key), its settings a Decoding subclass
whose shared fields are named, defaulted and checked once."""

import dataclasses
import inspect

import numpy as np
import pytest

from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode, speculative
from gr2jax.model import decode_core, generate
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params

# decoder, its settings class, the settings' required fields beyond max_new_tokens
DECODERS = [
  (generate.generate, generate.ARDecoding, {}),
  (decode.block_diffusion_generate, decode.BlockDecoding,
   dict(threshold=0.9, max_steps_per_block=4)),
  (speculative.speculative_generate, speculative.DraftDecoding, {}),
]


@pytest.mark.parametrize("decoder, settings, required", DECODERS)
def test_every_decoder_takes_its_settings_after_the_prompts_and_the_key_by_keyword(
    decoder, settings, required):
  assert issubclass(settings, decode_core.Decoding)
  params = inspect.signature(decoder).parameters
  positional = [n for n, p in params.items() if p.kind is p.POSITIONAL_OR_KEYWORD]
  assert positional[-3:] == ["prompt_tokens", "prompt_lengths", "decoding"]
  assert params["key"].kind is params["key"].KEYWORD_ONLY and params["key"].default is None
  shared = {f.name: f.default for f in dataclasses.fields(decode_core.Decoding)}
  mine = {f.name: f.default for f in dataclasses.fields(settings)}
  assert {n: mine[n] for n in shared} == shared  # the same names and defaults everywhere
  assert list(mine)[:len(shared)] == list(shared)


@pytest.mark.parametrize("decoder, settings, required", DECODERS)
def test_the_shared_fields_are_checked_when_the_settings_are_built(decoder, settings, required):
  name = settings.__name__
  built = settings(max_new_tokens=8, stop_token_ids=[3, 4], **required)
  assert built.stop_token_ids == (3, 4) and hash(built) == hash(settings(
    max_new_tokens=8, stop_token_ids=(3, 4), **required))  # static under jit
  for fields, error, match in [
    (dict(max_new_tokens=0), ValueError, f"{name}: max_new_tokens=0 must be >= 1"),
    (dict(max_new_tokens=True), TypeError, f"{name}: max_new_tokens must be an int"),
    (dict(max_new_tokens=8, temperature=-0.5), ValueError, r"temperature=-0.5 must be >= 0"),
    (dict(max_new_tokens=8, temperature=float("inf")), ValueError, "temperature=inf must be"),
    (dict(max_new_tokens=8, stop_token_ids="12"), TypeError, "stop_token_ids must be a sequence"),
    (dict(max_new_tokens=8, stop_token_ids=(1, -2)), ValueError,
     r"stop_token_ids\[1\]=-2 must be >= 0"),
  ]:
    with pytest.raises(error, match=match):
      settings(**fields, **required)
  with pytest.raises(TypeError):
    settings(8, **required)  # keywords only: no positional order to get wrong


def test_a_recipes_draft_settings_are_its_decode_specs():
  spec = DecodeSpec(draft_k=8, draft_tau=0.5, draft_steps=4, commit_order="distinct")
  draft = spec.draft(40)
  assert draft == speculative.DraftDecoding(max_new_tokens=40, k=8, draft_tau=0.5, draft_steps=4,
                                            commit_order="distinct")
  assert draft.temperature == 0.0 and draft.stop_token_ids is None  # greedy, the eos ids
  assert DecodeSpec().draft(40) == speculative.DraftDecoding(max_new_tokens=40)  # one default


# a model of 32 positions; prompts of width 8 (nothing below is traced: abstract params suffice)
SHORT = ModelConfig.tiny(vocab_size=64, num_layers=1, max_position_embeddings=32,
                         eos_token_ids=(2,))
SHORT_BLOCKS = dataclasses.replace(SHORT, block_size=4, mask_token_id=63)
PROMPTS = np.ones((2, 8), np.int32)
_model = lambda config: speculative.Model(abstract_params(config), config)
POSITION_CASES = [  # call(max_new_tokens, cache_size), max_new_tokens, cache_size, message
  (lambda n, c: generate.generate(
    _model(SHORT).params, SHORT, PROMPTS, None, generate.ARDecoding(max_new_tokens=n,
                                                                    cache_size=c)),
   30, None, "generate: max_new_tokens=30 with prompts of width 8 needs 8 + 30 = 38 positions; "
   "the model has 32 (max_position_embeddings): max_new_tokens <= 24 fits"),
  (lambda n, c: generate.generate(
    _model(SHORT).params, SHORT, PROMPTS, None, generate.ARDecoding(max_new_tokens=n,
                                                                    cache_size=c)),
   20, 40, "generate: cache_size=40 exceeds the 32 positions the model has "
   "(max_position_embeddings)"),
  (lambda n, c: decode.block_diffusion_generate(
    _model(SHORT_BLOCKS).params, SHORT_BLOCKS, PROMPTS, None, decode.BlockDecoding(
      max_new_tokens=n, threshold=0.9, max_steps_per_block=4, cache_size=c)),
   27, None, "block_diffusion_generate: max_new_tokens=27 with prompts of width 8 needs "
   "8 + 28 (27 in whole blocks of 4) = 36 positions; the model has 32 "
   "(max_position_embeddings): max_new_tokens <= 24 fits"),
  (lambda n, c: speculative.speculative_generate(
    _model(SHORT_BLOCKS), _model(SHORT), PROMPTS, None, speculative.DraftDecoding(
      max_new_tokens=n, k=4)),
   25, None, "speculative_generate: max_new_tokens=25 with prompts of width 8 needs 8 + 25 = "
   "33 positions; the verifier has 32 (max_position_embeddings): max_new_tokens <= 24 fits"),
  (lambda n, c: speculative.speculative_generate(
    _model(SHORT_BLOCKS), _model(dataclasses.replace(SHORT, max_position_embeddings=64)),
    PROMPTS, None, speculative.DraftDecoding(max_new_tokens=n, k=4)),
   25, None, "speculative_generate: max_new_tokens=25 with prompts of width 8 needs 8 + 28 (25 in "
   "whole blocks of 4) = 36 positions; the drafter has 32 (max_position_embeddings): "
   "max_new_tokens <= 24 fits"),
]


@pytest.mark.parametrize("call, max_new_tokens, cache_size, message", POSITION_CASES)
def test_a_decode_past_the_models_positions_names_the_decoder_and_max_new_tokens(
    call, max_new_tokens, cache_size, message):
  """It failed in init_cache (inside the trace for block diffusion and draft-and-verify):
  `init_cache: max_len=38 must be in [1, max_position_embeddings=32]`, naming neither the
  decoder nor max_new_tokens."""
  with pytest.raises(ValueError) as e:
    call(max_new_tokens, cache_size)
  assert str(e.value) == message


def test_slots_needed_and_most_new_tokens_agree():
  for config in (SHORT, SHORT_BLOCKS):
    for p in (1, 8, 13):
      most = decode_core.most_new_tokens(config, p)
      assert decode_core.slots_needed(config, p, most) <= 32 < decode_core.slots_needed(
        config, p, most + 1)
      assert decode_core.check_positions("f", config, p, most) == decode_core.slots_needed(
        config, p, most)
  assert decode_core.most_new_tokens(SHORT, 33) < 1
  with pytest.raises(ValueError, match="prompts of width 40 leave no room$"):
    decode_core.check_positions("f", SHORT, 40, 1)
