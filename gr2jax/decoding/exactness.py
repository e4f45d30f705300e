"""What "exact" means for a greedy decode in any precision: the teacher-forced check.

Bit-for-bit equality with AR's own decode holds only where both run the same kernels. In fp32 the
lossless mode's (K + 1)-query verify forward and AR's one-query step round ~1e-7 apart and no
token of the trained tiny pair differs (docs/results/lossless/). In bf16 on an accelerator the
verify forward and AR's step, and AR itself at batch 1 and at batch 16, run different kernels
and reduction orders: where two logits are closer than that rounding, the arg-max can fall
either way, and neither the lossless mode nor AR's own decode is bit-reproducible across batch
sizes. The definition the lossless mode, serve.mode='auto' and AR are held to is therefore the
teacher-forced check public serving stacks use (vllm-rbln's test of speculative decoding at batch
1 / 8 / 16):

  A greedy decode of a model M (AR GR2; the lossless mode's AR verifier) is *exact within
  tolerance e* when at every position j of every row the committed token t_j is the arg-max of
  M's teacher-forced logits l_j, or within e * max|l_j| of it:
      max(l_j) - l_j[t_j] <= e * max_v |l_j[v]|.
  l_j comes from one causal forward of [prompt | t_<j] (the causal scorer's layout,
  decoding/policy.causal_layout) at the decode's batch, in the params' own precision. A
  position where t_j is not the arg-max is a *flip*; its *margin* is max(l_j) - l_j[t_j].

The tolerance is relative because rounding is: bf16 keeps 8 significant bits, so each rounding
moves a value by up to 2^-9 of itself, and a logit gathers many through the layers. `TOLERANCE`
= 2^-6 (1.6% of the position's largest logit magnitude) is a near-tie: at a trained model's top
logits (~20-30) it is ~0.3-0.5 nats, far below the ~4-nat margins that mark a real divergence
(a wrong cache slot, mask or position moves a logit by far more than rounding). Each flip is
counted once: the check teacher-forces the decode's own prefix, so the positions after a flip
are checked in the context the decode actually had.
"""

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax import settings
from gr2jax.decoding import policy
from gr2jax.diffusion import layout, speculative
from gr2jax.model import masks, validate
from gr2jax.model.config import ModelConfig

TOLERANCE = 2.0**-6  # e: a flip within e * max|l_j| is a near-tie (module docstring)


class Check(NamedTuple):
  """The teacher-forced check of a decode (module docstring), per position (numpy).

  Attributes:
    argmax: [B, M] int32 the model's teacher-forced greedy token (its own decoder's rule:
      speculative.verifier_greedy).
    margin: [B, M] f32 max(l_j) - l_j[t_j] >= 0 (0 where the committed token is the arg-max).
    scale: [B, M] f32 max_v |l_j[v]|, what the tolerance is relative to.
    valid: [B, M] bool positions inside each row's length.
    flipped: [B, M] bool valid positions whose committed token is not the arg-max.
  """

  argmax: np.ndarray
  margin: np.ndarray
  scale: np.ndarray
  valid: np.ndarray
  flipped: np.ndarray


@functools.partial(jax.jit, static_argnames="config")
def _check(params, config, prompt_tokens, prompt_lengths, tokens, lengths):
  inputs, queries = policy.causal_layout("teacher_forced_check", config, prompt_tokens,
                                         prompt_lengths, tokens, lengths)
  logits = layout.logits(params, config, inputs, queries)  # [B, M, V] f32
  argmax = speculative.verifier_greedy(logits, config.mask_token_id)
  at = lambda t: jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
  valid = masks.padding_mask(lengths, tokens.shape[1])
  margin = jnp.where(valid, at(argmax) - at(tokens), 0.0)
  return (argmax, margin, jnp.max(jnp.abs(logits), axis=-1), valid,
          valid & (tokens != argmax))


def teacher_forced_check(params: dict, config: ModelConfig, prompt_tokens, prompt_lengths,
                         tokens, lengths) -> Check:
  """Checks every committed token of a greedy decode against one teacher-forced forward.

  Args:
    params: the model's param pytree, in the precision under test (e.g. bf16, with config's
      param_dtype and compute_dtype 'bfloat16').
    config: the model whose greedy decode `tokens` claims to be (an AR model: block_size 1).
    prompt_tokens: [B, P] int right-padded prompts, the decode's batch.
    prompt_lengths: [B] int in 1..P.
    tokens: [B, M] int the committed tokens (anything in the vocab after `lengths`).
    lengths: [B] int in 0..M, tokens per row.

  Returns:
    Check (numpy).

  Raises:
    TypeError / ValueError starting with `teacher_forced_check` and naming the argument, as the
      decoders check theirs (gr2jax/model/validate.py): a config that is not a ModelConfig;
      prompts (validate.prompts); tokens or lengths that are not integer arrays, rows other
      than the prompts', ids outside [0, V), lengths outside 0..M (validate.responses); a
      config that is not an AR model (block_size != 1).
  """
  where = "teacher_forced_check"
  if not isinstance(config, ModelConfig):
    raise TypeError(f"{where}: config must be a ModelConfig, got {type(config).__name__}")
  prompt_tokens, prompt_lengths = validate.prompts(where, config, prompt_tokens, prompt_lengths)
  tokens, lengths = validate.responses(where, tokens, lengths, rows=prompt_tokens.shape[0],
                                       vocab_size=config.vocab_size)
  out = _check(params, config, prompt_tokens, prompt_lengths, jnp.asarray(tokens),
               jnp.asarray(lengths))
  return Check(*(np.asarray(x) for x in out))


def summary(check: Check, tolerance: float = TOLERANCE) -> dict:
  """The check in numbers: {'positions', 'flips', 'flip_rate', 'max_flip_margin' and
  'max_flip_relative' (margin / scale; None without a flip), 'tolerance', 'beyond_tolerance'
  (flips with margin > tolerance * scale: 0 for an exact decode)}.

  Raises:
    TypeError: check is not a Check (teacher_forced_check's). ValueError / TypeError: tolerance
      is not a finite real >= 0 (settings.check_real).
  """
  if not isinstance(check, Check):
    raise TypeError(f"summary: check must be an exactness.Check (teacher_forced_check's), got "
                    f"{type(check).__name__}")
  tolerance = settings.check_real("summary", "tolerance", tolerance, low=0)
  margins, scales = check.margin[check.flipped], check.scale[check.flipped]
  positions = int(check.valid.sum())
  top = lambda x: float(x.max()) if x.size else None
  return {"positions": positions, "flips": int(margins.size),
          "flip_rate": margins.size / max(positions, 1), "max_flip_margin": top(margins),
          "max_flip_relative": top(margins / scales), "tolerance": tolerance,
          "beyond_tolerance": int((margins > tolerance * scales).sum())}


def differences(tokens, lengths, reference, reference_lengths) -> dict:
  """How two decodes of the same prompts differ (e.g. a prompt at batch 16 against batch 1):
  {'rows', 'rows_differing', 'positions_differing' (slots where either row has a token and they
  differ), 'first_index' (per differing row, its first differing slot)}.

  Raises:
    TypeError / ValueError starting with `differences` and naming the argument: tokens [B, M]
      and reference [B, M'] that are not integer arrays or have other row counts; lengths
      outside 0..M (reference_lengths 0..M') (validate.responses).
  """
  tokens, lengths = validate.responses("differences", tokens, lengths)
  reference, reference_lengths = validate.responses(
    "differences", reference, reference_lengths, rows=tokens.shape[0],
    names=("reference", "reference_lengths"))
  n = max(tokens.shape[1], reference.shape[1])
  slots = np.arange(n)[None, :]
  width = lambda x: np.pad(x, ((0, 0), (0, n - x.shape[1])))
  mine, theirs = slots < lengths[:, None], slots < reference_lengths[:, None]  # [B, N]
  differ = (mine != theirs) | (mine & theirs & (width(tokens) != width(reference)))
  rows = np.flatnonzero(differ.any(axis=1))
  return {"rows": int(tokens.shape[0]), "rows_differing": int(rows.size),
          "positions_differing": int(differ.sum()),
          "first_index": [int(np.argmax(differ[r])) for r in rows]}
