"""THE policy: the one dispatch of every decode (evaluation, rerank, the tables, the server), at
a recipe's decode spec (spec.py).

A policy (the anchors: gemma `Sampler`, tunix `generate/`) is the model with its own decoder at
the spec, behind one method and the decoders' param layout:

  decode(params, prompt_tokens, prompt_lengths, *, steering) -> Decoded
      the evaluation decode: greedy, block diffusion at spec.eval_tau (constrained answers when
      spec.constrained and a steering constraint is given); numpy [B, ...] fields.
  decoding_params(params) -> params in the decoders' layout, converted once.

and says what it is: `kind` ('ar', 'diffusion' or 'lossless'), `name` (the decoder's name in the
server's rows and cost tables: the kind, or 'lossless_k<K>' at the spec's draft_k) and `models`
(each model it decodes with, as a message names it), so no caller tells the policies apart by
their type.

Three implementations, chosen by the model (`make_policy`, the only place the choice is made):
  ARPolicy         an AR model (no mask token): model.generate.
  DiffusionPolicy  a block-diffusion model: block_diffusion_generate (`decoding(tau,
                   temperature)` gives its settings at any threshold).
Each holds its decoder's settings object (model/decode_core.Decoding's convention):
ARPolicy.decoding(temperature), DiffusionPolicy.decoding(tau, temperature) and
LosslessPolicy.decoding() (the spec's `draft`).
  LosslessPolicy   a block-diffusion drafter verified by an AR model (`verifier_config`):
                   diffusion/speculative.py, the verifier's greedy output.

The on-policy stages' sampling with traces and log-probs of given tokens are training's, built on
these decoders (gr2jax/train/rollout.py); nothing here imports gr2jax.train.

`causal_log_probs` is THE causal scorer: "the response given the prompt" in one forward over
`[prompt (P slots, right-padded) | response]` (layout.two_stream_inputs with no noisy stream),
response token j at RoPE position prompt_length + j, causal over the valid keys: exactly the
sampler's cached decoding. SFT, AR RL and the OPD teacher score with it.
"""

import dataclasses
from typing import ClassVar, NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode, layout, speculative
from gr2jax.model import generate
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import layer_list


class Decoded(NamedTuple):
  """What Policy.decode returns (numpy).

  Attributes:
    tokens: [B, N] int32 the responses, pad after each row's stop.
    lengths: [B] int32 tokens per row (the stop token included).
    nfe: [B] int32 forwards per row (prefill and commit forwards included).
    denoise_steps: [B] int32 the paper's NFE (denoising steps; AR: one per token).
  """

  tokens: np.ndarray
  lengths: np.ndarray
  nfe: np.ndarray
  denoise_steps: np.ndarray


def causal_log_probs(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
                     prompt_lengths: jax.Array, response_tokens: jax.Array,
                     response_lengths: jax.Array, *, temperature: float = 0.0,
                     return_log_probs: bool = False) -> tuple[jax.Array, jax.Array | None]:
  """The one causal scorer: log p(response token j | prompt, response_<j) (module docstring).

  Args:
    params: the param pytree.
    config: an AR model (block_size 1); a mask_token_id, if set, is suppressed in the
      distributions (commit.token_log_probs) and fills the slots past a response's length.
    prompt_tokens: [B, P] right-padded prompts.
    prompt_lengths: [B].
    response_tokens: [B, M] the responses (any token past response_lengths).
    response_lengths: [B].
    temperature: the sampling temperature (0 = scored at 1).
    return_log_probs: also return the full distributions.

  Returns:
    (logp [B, M] f32 of the response tokens, log_probs [B, M, V] f32 or None).
  """
  inputs, queries = causal_layout("causal_log_probs", config, prompt_tokens, prompt_lengths,
                                  response_tokens, response_lengths)
  return layout.score(params, config, inputs, queries, response_tokens, temperature=temperature,
                      return_log_probs=return_log_probs)


def causal_layout(where: str, config: ModelConfig, prompt_tokens: jax.Array,
                  prompt_lengths: jax.Array, response_tokens: jax.Array,
                  response_lengths: jax.Array) -> tuple[layout.Layout, jax.Array]:
  """The causal scorer's one forward: `[prompt | response]` (module docstring) and the query
  predicting each response token, (Layout, queries [B, M] int32); shapes as causal_log_probs.

  Raises:
    ValueError: starting with `where`, for a config with block_size != 1.
  """
  if config.block_size != 1:
    raise ValueError(f"{where}: the causal scorer scores an AR model, got block_size="
                     f"{config.block_size}")
  b, m = response_tokens.shape
  inputs = layout.two_stream_inputs(config, prompt_tokens, prompt_lengths, response_tokens,
                                    response_lengths, jnp.zeros((b, 0, m), bool))
  queries = layout.prediction_queries(jnp.full((b, m), layout.CLEAN_STREAM), prompt_lengths,
                                      prompt_tokens.shape[1], m)
  return inputs, queries


class Policy(Protocol):
  """The policy interface (module docstring); ARPolicy, DiffusionPolicy and LosslessPolicy
  implement it."""

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int
  kind: str  # 'ar', 'diffusion' or 'lossless'

  @property
  def name(self) -> str:
    """The decoder's name: the kind, or 'lossless_k<K>' (the server's rows and cost tables)."""

  @property
  def models(self) -> tuple[tuple[str, ModelConfig], ...]:
    """(how a message names it, its config) of each model the policy decodes with."""

  def decoding_params(self, params: dict) -> dict:
    """params in the decoders' layout (model/params.layer_list), converted once by a caller that
    decodes many batches (the decoders convert per call otherwise: a copy of the weights)."""

  def decode(self, params: dict, prompt_tokens, prompt_lengths, *,
             steering: decode.Steering = decode.NO_STEERING) -> Decoded: ...


class _OneModel:
  """What ARPolicy and DiffusionPolicy share: one model, its decoder named by the kind."""

  config: ModelConfig
  kind: ClassVar[str]

  @property
  def name(self) -> str:
    return self.kind

  @property
  def models(self) -> tuple[tuple[str, ModelConfig], ...]:
    return (("the model", self.config),)

  def decoding_params(self, params):
    return layer_list(params)


@dataclasses.dataclass(frozen=True)
class ARPolicy(_OneModel):
  """An AR model decoded by model.generate.

  Attributes:
    config: the AR model.
    spec: the decode spec (none of its fields changes the greedy AR decode; train/rollout.py
      samples at its temperature).
    max_new_tokens: M, the response cap.
  """

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  kind: ClassVar[str] = "ar"

  def decoding(self, temperature: float = 0.0) -> generate.ARDecoding:
    """The AR decoder's settings at this temperature (0 = greedy)."""
    return generate.ARDecoding(max_new_tokens=self.max_new_tokens, temperature=temperature)

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering=decode.NO_STEERING):
    """Greedy decoding (module docstring); one forward per token (denoise_steps = lengths)."""
    if not steering.empty:
      raise ValueError("constrained answers and a given response prefix are block-diffusion "
                       "decoder options; this model is AR")
    out = generate.generate(params, self.config, prompt_tokens, prompt_lengths, self.decoding())
    lengths = np.asarray(out.lengths)
    return Decoded(np.asarray(out.tokens), lengths, np.full(lengths.shape, int(out.nfe)),
                   lengths)


@dataclasses.dataclass(frozen=True)
class DiffusionPolicy(_OneModel):
  """A block-diffusion model decoded by block_diffusion_generate.

  Attributes:
    config: the diffusion model (a mask token; config.block_size is B).
    spec: the decode spec: evaluations commit at spec.eval_tau (rollouts, train/rollout.py, at
      the stage's own threshold and temperature), at most spec.max_steps_per_block steps per
      block.
    max_new_tokens: M, the response cap.
  """

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  kind: ClassVar[str] = "diffusion"

  def __post_init__(self):
    if self.config.mask_token_id is None:
      raise ValueError("DiffusionPolicy: config.mask_token_id is None (an AR model: ARPolicy)")

  def decoding(self, tau: float, temperature: float = 0.0) -> decode.BlockDecoding:
    """The block decoder's settings at commit threshold tau."""
    return decode.BlockDecoding(threshold=tau, max_steps_per_block=self.spec.max_steps_per_block,
                                max_new_tokens=self.max_new_tokens, temperature=temperature,
                                commit_order=self.spec.commit_order)

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering=decode.NO_STEERING):
    """Greedy block diffusion at spec.eval_tau (module docstring)."""
    out = decode.block_diffusion_generate(params, self.config, prompt_tokens, prompt_lengths,
                                          self.decoding(self.spec.eval_tau), steering=steering)
    return Decoded(np.asarray(out.tokens), np.asarray(out.lengths), np.asarray(out.nfe),
                   np.asarray(out.denoise_steps))


@dataclasses.dataclass(frozen=True)
class LosslessPolicy:
  """A block-diffusion drafter verified by an AR model (diffusion/speculative.py): the decode is
  the verifier's own greedy output at the drafter's speed of acceptance (exact as
  decoding/exactness.py defines it: up to float near-ties, rare in fp32, common in bf16).

  Its params are {"drafter": ..., "verifier": ...}. It serves the evaluation, rerank and the
  server; the on-policy stages sample the model's own policy (train/rollout.py), never this one.

  Attributes:
    config: the drafter (a mask token; config.block_size >= spec.draft_k).
    verifier_config: the AR verifier (the drafter's vocab, eos and pad ids).
    spec: the decode spec (spec.draft: K, draft tau, draft steps; its commit order).
    max_new_tokens: M, the response cap.
  """

  config: ModelConfig
  verifier_config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  kind: ClassVar[str] = "lossless"

  @property
  def name(self) -> str:
    return f"lossless_k{self.spec.draft_k}"

  @property
  def models(self) -> tuple[tuple[str, ModelConfig], ...]:
    return (("the verifier", self.verifier_config), ("the drafter", self.config))

  def decoding_params(self, params):
    return {name: layer_list(params[name]) for name in ("drafter", "verifier")}

  def decoding(self) -> speculative.DraftDecoding:
    """The draft-and-verify settings (greedy: the verifier's output)."""
    return self.spec.draft(self.max_new_tokens)

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering=decode.NO_STEERING):
    """Greedy draft-and-verify (speculative.speculative_generate). nfe counts both models'
    forwards with their two prefills; denoise_steps the drafter's and verifier's forwards."""
    if not steering.empty:
      raise ValueError("constrained answers and a given response prefix are block-diffusion "
                       "decoder options; the lossless mode's output is its AR verifier's")
    out = speculative.speculative_generate(
      speculative.Model(params["drafter"], self.config),
      speculative.Model(params["verifier"], self.verifier_config), prompt_tokens,
      prompt_lengths, self.decoding())
    forwards = np.asarray(out.verify_forwards) + np.asarray(out.draft_forwards)
    return Decoded(np.asarray(out.tokens), np.asarray(out.lengths), forwards + 2, forwards)


def make_policy(config: ModelConfig, spec: DecodeSpec, max_new_tokens: int,
                verifier_config: ModelConfig | None = None) -> Policy:
  """The model's own decoder: ARPolicy for an AR model (no mask token), else DiffusionPolicy;
  with `verifier_config` (an AR model) the lossless LosslessPolicy, `config` drafting."""
  if verifier_config is not None:
    return LosslessPolicy(config, verifier_config, spec, max_new_tokens)
  if config.mask_token_id is None:
    return ARPolicy(config, spec, max_new_tokens)
  return DiffusionPolicy(config, spec, max_new_tokens)
