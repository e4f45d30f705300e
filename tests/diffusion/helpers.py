"""block_diffusion_generate called with its settings as keywords (the tests' shorthand)."""

import dataclasses

from gr2jax.diffusion import decode

_DECODING = {f.name for f in dataclasses.fields(decode.BlockDecoding)}
_STEERING = {f.name for f in dataclasses.fields(decode.Steering)}


def generate(params, config, prompt_tokens, prompt_lengths, *, key=None, **kw):
  """decode.block_diffusion_generate with BlockDecoding / Steering fields as keywords."""
  unknown = set(kw) - _DECODING - _STEERING
  if unknown:
    raise TypeError(f"unknown keywords {sorted(unknown)}")
  decoding = decode.BlockDecoding(**{k: v for k, v in kw.items() if k in _DECODING})
  steering = decode.Steering(**{k: v for k, v in kw.items() if k in _STEERING})
  return decode.block_diffusion_generate(params, config, prompt_tokens, prompt_lengths, decoding,
                                         key=key, steering=steering)
