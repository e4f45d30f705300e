"""The decoders' one settings convention (model/decode_core.py `Decoding`): every decoder takes
(model(s), prompt_tokens, prompt_lengths, decoding, *, key), its settings a Decoding subclass
whose shared fields are named, defaulted and checked once."""

import dataclasses
import inspect

import pytest

from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode, speculative
from gr2jax.model import decode_core, generate

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
