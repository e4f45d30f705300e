"""THE policy: the one dispatch of every decode (evaluation, rerank, the tables, the server) and
the one interface of the on-policy stages (AR RL, OPD, RL), at a recipe's decode spec (spec.py).

A policy (the anchors: tunix `BaseRollout.generate` / `get_per_token_logps`, gemma `Sampler`)
is the model with its own decoder at the spec, behind three methods:

  decode(params, prompt_tokens, prompt_lengths, *, steering) -> Decoded
      the evaluation decode: greedy, block diffusion at spec.eval_tau (constrained answers when
      spec.constrained and a steering constraint is given); numpy [B, ...] fields.
  sample(params, prompt_tokens, prompt_lengths, key, *, chunk_rows, sharding) -> (rollouts, stats)
      host side: on-policy samples at spec.temperature with their traces, in row chunks
      (gr2jax/chunks.py), as numpy [B, ...] fields:
        response_tokens [B, M] int32  the response, pad after the stop (what rewards parse)
        response_lengths [B] int32    tokens per row, the stop token included (what losses weigh)
      plus the policy's trace fields.
  log_probs(params, batch, *, temperature=None, return_log_probs=False)
      -> (logp [B, M] f32, log_probs [B, M, V] f32 | None)
      traced (jit, grad): the log-probs of the batch's response tokens in the context the sampler
      drew them in (commit.token_log_probs at `temperature`, default spec.temperature), and the
      full distributions when asked.

Three implementations, chosen by the model (`make_policy`, the only place the choice is made):
  ARPolicy         an AR model (no mask token): model.generate; log-probs from the causal scorer.
  DiffusionPolicy  a block-diffusion model: block_diffusion_generate (rollouts at
                   spec.rollout_tau, the step cap); trace fields trace_tokens, commit_step,
                   commit_logprob [B, M] and replay_rounds = replay.Rounds(S), the replay's static
                   round count; log-probs from the differentiable replay of the trace
                   (gr2jax/diffusion/replay.py).
  LosslessPolicy   a block-diffusion drafter verified by an AR model (`verifier_config`):
                   diffusion/speculative.py, the verifier's greedy output; decode only.

`causal_log_probs` is THE causal scorer: "the response given the prompt" in one forward over
`[prompt (P slots, right-padded) | response]` (layout.two_stream_inputs with no noisy stream),
response token j at RoPE position prompt_length + j, causal over the valid keys: exactly the
sampler's cached decoding. SFT, AR RL and the OPD teacher score with it.
"""

import dataclasses
from typing import NamedTuple, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from gr2jax import chunks
from gr2jax.data import batches
from gr2jax.data import lengths as lengths_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode, layout, replay, speculative
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
  """The policy interface (module docstring); ARPolicy and DiffusionPolicy implement it."""

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  def decoding_params(self, params: dict) -> dict:
    """params in the decoders' layout (model/params.layer_list), converted once by a caller that
    decodes many batches (the decoders convert per call otherwise: a copy of the weights)."""

  def decode(self, params: dict, prompt_tokens, prompt_lengths, *,
             steering: decode.Steering = decode.NO_STEERING) -> Decoded: ...

  def sample(self, params: dict, prompt_tokens, prompt_lengths, key: jax.Array, *,
             chunk_rows: int = 0, sharding=None) -> tuple[dict, dict]: ...

  def log_probs(self, params: dict, batch: batches.Batch, *, temperature: float | None = None,
                return_log_probs: bool = False) -> tuple[jax.Array, jax.Array | None]: ...


@dataclasses.dataclass(frozen=True)
class ARPolicy:
  """An AR model sampled by model.generate at spec.temperature (no top-k / top-p).

  Attributes:
    config: the AR model.
    spec: the decode spec (only its temperature applies to AR decoding).
    max_new_tokens: M, the response cap.
  """

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  def decoding_params(self, params):
    return layer_list(params)

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering=decode.NO_STEERING):
    """Greedy decoding (module docstring); one forward per token (denoise_steps = lengths)."""
    if not steering.empty:
      raise ValueError("constrained answers and a given response prefix are block-diffusion "
                       "decoder options; this model is AR")
    out = generate.generate(params, self.config, prompt_tokens, prompt_lengths,
                            max_new_tokens=self.max_new_tokens,
                            sampling=generate.Sampling(temperature=0.0))
    lengths = np.asarray(out.lengths)
    return Decoded(np.asarray(out.tokens), lengths, np.full(lengths.shape, int(out.nfe)),
                   lengths)

  def sample(self, params, prompt_tokens, prompt_lengths, key, *, chunk_rows=0, sharding=None):
    """Rollouts {response_tokens, response_lengths} (module docstring) and no stats."""
    sampling = generate.Sampling(temperature=self.spec.temperature)
    params = self.decoding_params(params)  # once for every chunk

    def rollouts(chunk, chunk_key):
      out = generate.generate(params, self.config, chunk["prompt_tokens"],
                              chunk["prompt_lengths"], max_new_tokens=self.max_new_tokens,
                              key=chunk_key, sampling=sampling)
      return {"response_tokens": out.tokens, "response_lengths": out.lengths}

    out = chunks.map_row_chunks(
      rollouts, {"prompt_tokens": prompt_tokens, "prompt_lengths": prompt_lengths}, chunk_rows,
      sharding=sharding, key=key)
    return {**out, "response_lengths": out["response_lengths"].astype(np.int32)}, {}

  def log_probs(self, params, batch, *, temperature=None, return_log_probs=False):
    """The causal scorer on the batch's prompts and responses."""
    return causal_log_probs(
      params, self.config, batch.prompt_tokens, batch.prompt_lengths, batch.response_tokens,
      batch.response_lengths,
      temperature=self.spec.temperature if temperature is None else temperature,
      return_log_probs=return_log_probs)


@dataclasses.dataclass(frozen=True)
class DiffusionPolicy:
  """A block-diffusion model sampled by its own decoder, scored by replaying the trace.

  Attributes:
    config: the diffusion model (a mask token; config.block_size is B).
    spec: the decode spec: evaluations commit at spec.eval_tau, rollouts at spec.rollout_tau,
      at most spec.max_steps_per_block steps per block, rollouts at spec.temperature.
    max_new_tokens: M, the response cap.
    shrink: replay step shrinkage (replay.py; 1 = exact).
  """

  config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int
  shrink: int = 1

  def __post_init__(self):
    if self.config.mask_token_id is None:
      raise ValueError("DiffusionPolicy: config.mask_token_id is None (an AR model: ARPolicy)")

  def decoding_params(self, params):
    return layer_list(params)

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

  @property
  def max_rounds(self) -> int:
    """The most replay rounds a trace of this decode setting can need (replay.rounds_needed)."""
    return replay.rounds_needed(self.config.block_size, self.spec.max_steps_per_block,
                                self.shrink)

  def sample(self, params, prompt_tokens, prompt_lengths, key, *, chunk_rows=0, sharding=None):
    """Rollouts with their traces, checked to fit the replay (module docstring); stats
    {'forwards_per_token'}: the decoder's forwards (prefill, denoising and commit) per token."""
    params = self.decoding_params(params)  # once for every chunk

    def rollouts(chunk, chunk_key):
      out = decode.block_diffusion_generate(
        params, self.config, chunk["prompt_tokens"], chunk["prompt_lengths"],
        self.decoding(self.spec.rollout_tau, self.spec.temperature), key=chunk_key)
      return {"trace_tokens": out.trace_tokens, "commit_step": out.commit_step,
              "response_lengths": out.lengths, "response_tokens": out.tokens,
              "commit_logprob": out.commit_logprob, "nfe": out.nfe}

    out = chunks.map_row_chunks(
      rollouts, {"prompt_tokens": prompt_tokens, "prompt_lengths": prompt_lengths}, chunk_rows,
      sharding=sharding, key=key)
    replay.check_rounds(out["commit_step"], self.max_rounds, self.shrink)
    nfe = out.pop("nfe")
    lengths = out["response_lengths"].astype(np.int32)
    rounds = replay.Rounds(replay.round_bucket(out["commit_step"], self.max_rounds, self.shrink))
    stats = {"forwards_per_token": float(nfe.sum() / max(lengths.sum(), 1))}
    return {**out, "response_lengths": lengths, "replay_rounds": rounds}, stats

  def log_probs(self, params, batch, *, temperature=None, return_log_probs=False):
    """The replay of the batch's traces over batch.replay_rounds.count rounds."""
    res = replay.replay(
      params, self.config, batch.prompt_tokens, batch.prompt_lengths, batch.trace_tokens,
      batch.commit_step, batch.response_lengths, num_rounds=batch.replay_rounds.count,
      temperature=self.spec.temperature if temperature is None else temperature,
      shrink=self.shrink, return_log_probs=return_log_probs)
    return res.logp, res.log_probs


@dataclasses.dataclass(frozen=True)
class LosslessPolicy:
  """A block-diffusion drafter verified by an AR model (diffusion/speculative.py): the decode is
  the verifier's own greedy output at the drafter's speed of acceptance (exact as
  decoding/exactness.py defines it: up to float near-ties, rare in fp32, common in bf16).

  Its params are {"drafter": ..., "verifier": ...}. It decodes only (evaluation, rerank, the
  server): it has no rollouts or log-probs of its own (its output is the verifier's).

  Attributes:
    config: the drafter (a mask token; config.block_size >= spec.draft_k).
    verifier_config: the AR verifier (the drafter's vocab, eos and pad ids).
    spec: the decode spec (spec.draft: K, draft tau, draft steps; its commit order).
    max_new_tokens: M, the verifier's own response cap (never widened for a pivot-aligned
      drafter's fillers: the output is the verifier's decode at M).
  """

  config: ModelConfig
  verifier_config: ModelConfig
  spec: DecodeSpec
  max_new_tokens: int

  def decoding_params(self, params):
    return {name: layer_list(params[name]) for name in ("drafter", "verifier")}

  def decode(self, params, prompt_tokens, prompt_lengths, *, steering=decode.NO_STEERING):
    """Greedy draft-and-verify (speculative.speculative_generate). nfe counts both models'
    forwards with their two prefills; denoise_steps the drafter's and verifier's forwards."""
    if not steering.empty:
      raise ValueError("constrained answers and a given response prefix are block-diffusion "
                       "decoder options; the lossless mode's output is its AR verifier's")
    out = speculative.speculative_generate(
      speculative.Model(params["drafter"], self.config),
      speculative.Model(params["verifier"], self.verifier_config), prompt_tokens,
      prompt_lengths, self.spec.draft, max_new_tokens=self.max_new_tokens)
    forwards = np.asarray(out.verify_forwards) + np.asarray(out.draft_forwards)
    return Decoded(np.asarray(out.tokens), np.asarray(out.lengths), forwards + 2, forwards)

  def sample(self, *args, **kwargs):
    raise NotImplementedError("LosslessPolicy decodes only: the on-policy stages sample with "
                              "the model's own policy (make_policy without a verifier)")

  def log_probs(self, *args, **kwargs):
    raise NotImplementedError("LosslessPolicy decodes only (its output is the verifier's)")


def response_width(response_len: int, config: ModelConfig) -> int:
  """The static response width R of `config`'s decoders and training rows: `response_len` for a
  model without fillers; room for B - 1 more tokens (rounded up as every static width) for a
  pivot-aligned one (gr2jax/diffusion/pivot.py)."""
  if config.pivot_filler_id is None:
    return response_len
  return lengths_lib.round_up(response_len + config.block_size - 1)


def make_policy(config: ModelConfig, spec: DecodeSpec, max_new_tokens: int,
                shrink: int = 1, verifier_config: ModelConfig | None = None) -> Policy:
  """The model's own decoder: ARPolicy for an AR model (no mask token), else DiffusionPolicy;
  with `verifier_config` (an AR model) the lossless LosslessPolicy, `config` drafting.

  The cap is the width of the model whose tokens are the output: a pivot-aligned `config` decoding
  alone gets room for its fillers (`response_width`); the lossless mode writes its verifier's
  tokens, so it stops at the verifier's own cap `max_new_tokens` whatever the drafter (a wider cap
  would let the verifier write past where its own decode stops)."""
  if verifier_config is not None:
    return LosslessPolicy(config, verifier_config, spec, max_new_tokens)
  max_new_tokens = response_width(max_new_tokens, config)
  if config.mask_token_id is None:
    return ARPolicy(config, spec, max_new_tokens)
  return DiffusionPolicy(config, spec, max_new_tokens, shrink)
