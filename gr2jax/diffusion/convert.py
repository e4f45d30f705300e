"""AR -> block-diffusion conversion of a model config (Diffusion-GR2 §2: weights copied 1:1).

Only the config changes: the block size B and the mask token. The tensors are the AR model's.
"""

import dataclasses

from gr2jax.model.config import ModelConfig


def to_diffusion(config: ModelConfig, block_size: int, mask_token_id: int) -> ModelConfig:
  """The diffusion config of an AR model.

  Args:
    config: the AR model's config.
    block_size: B >= 1 (1 = AR decoding).
    mask_token_id: the <|mask|> id; it must be in the vocabulary and be neither a stop token
      (the decoder never proposes the mask token, so no row could stop) nor the pad token.

  Returns:
    The config with block_size and mask_token_id set.
  """
  if block_size < 1:
    raise ValueError(f"to_diffusion: block_size={block_size} must be >= 1")
  if not 0 <= mask_token_id < config.vocab_size:
    raise ValueError(f"to_diffusion: mask_token_id={mask_token_id} is outside the vocabulary "
                     f"[0, {config.vocab_size}) (add <|mask|> with convert_hf.py --add_tokens)")
  for role, ids in (("an eos / stop token (eos_token_ids)", config.eos_token_ids),
                    ("the pad token (pad_token_id)", (config.pad_token_id,))):
    if mask_token_id in ids:
      raise ValueError(f"to_diffusion: mask_token_id={mask_token_id} is {role}: no row could "
                       "stop (eos) or padding would read as masks (pad)")
  return dataclasses.replace(config, block_size=block_size, mask_token_id=mask_token_id)
