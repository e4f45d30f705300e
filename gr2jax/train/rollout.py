"""THE rollout: the one interface of the on-policy stages (AR RL, OPD, RL), built on the model's
own decoder (decoding/policy.py) at the stage's own rollout settings (its sampling temperature
and, for a diffusion model, its commit threshold tau; stage_registry `StageBlock.rollout`).

A rollout (the anchors: tunix `BaseRollout.generate` / `get_per_token_logps`, kept apart from
its `generate/`) samples what a policy learns from and scores it again, behind two methods and
the Batch fields the second reads:

  sample(params, prompt_tokens, prompt_lengths, key, *, chunk_rows, sharding) -> (rollouts, stats)
      host side: on-policy samples at the rollout's temperature with their traces, in row chunks
      (gr2jax/chunks.py), as numpy [B, ...] fields:
        response_tokens [B, M] int32  the response, pad after the stop (what rewards parse)
        response_lengths [B] int32    tokens per row, the stop token included (what losses weigh)
      plus the rollout's trace fields.
  log_probs(params, batch, *, temperature=None, return_log_probs=False)
      -> (logp [B, M] f32, log_probs [B, M, V] f32 | None)
      traced (jit, grad): the log-probs of the batch's response tokens in the context the sampler
      drew them in (commit.token_log_probs at `temperature`, default the rollout's), and the
      full distributions when asked.
  fields: the Batch fields (gr2jax/data/batches.py) log_probs reads.

Two implementations, chosen by the model (`make_rollout`, the only place the choice is made):
  ARRollout         an AR policy: model.generate at its temperature (no top-k / top-p);
                    log-probs from the causal scorer (policy.causal_log_probs).
  DiffusionRollout  a block-diffusion policy: block_diffusion_generate at its tau, the spec's
                    step cap and its temperature; trace fields trace_tokens, commit_step,
                    commit_logprob [B, M], forwards [B] (the decoder's forwards per row) and
                    replay_rounds = replay.Rounds(S), the replay's static round count;
                    log-probs from the differentiable replay of the trace
                    (gr2jax/diffusion/replay.py), `shrink` steps per round.
"""

import dataclasses
from typing import Protocol

import jax
import numpy as np

from gr2jax import chunks
from gr2jax.data.batches import Batch
from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding.spec import DecodeSpec
from gr2jax.diffusion import decode, replay
from gr2jax.model import generate
from gr2jax.model.config import ModelConfig

# The Batch fields of "the response given the prompt": what the causal scorer (an ARRollout's
# log_probs, the OPD teacher) reads.
SCORED_FIELDS = ("prompt_tokens", "prompt_lengths", "response_tokens", "response_lengths")


class Rollout(Protocol):
  """The rollout interface (module docstring); ARRollout and DiffusionRollout implement it."""

  policy: policy_lib.Policy
  temperature: float
  fields: tuple[str, ...]

  @property
  def config(self) -> ModelConfig: ...

  @property
  def spec(self) -> DecodeSpec: ...

  def sample(self, params: dict, prompt_tokens, prompt_lengths, key: jax.Array, *,
             chunk_rows: int = 0, sharding=None) -> tuple[dict, dict]: ...

  def log_probs(self, params: dict, batch: Batch, *, temperature: float | None = None,
                return_log_probs: bool = False) -> tuple[jax.Array, jax.Array | None]: ...


class _OfPolicy:
  """The policy's model, spec and response cap, read through (one place holds them)."""

  @property
  def config(self) -> ModelConfig:
    return self.policy.config

  @property
  def spec(self) -> DecodeSpec:
    return self.policy.spec

  @property
  def max_new_tokens(self) -> int:
    return self.policy.max_new_tokens

  def _map_prompts(self, rollouts, prompt_tokens, prompt_lengths, key, chunk_rows, sharding):
    return chunks.map_row_chunks(
      rollouts, {"prompt_tokens": prompt_tokens, "prompt_lengths": prompt_lengths}, chunk_rows,
      sharding=sharding, key=key)


@dataclasses.dataclass(frozen=True)
class ARRollout(_OfPolicy):
  """An AR policy's rollouts: model.generate at `temperature`; the causal scorer.

  Attributes:
    policy: the AR policy (its config, spec and response cap M).
    temperature: the sampling temperature (the log-probs' by default).
  """

  policy: policy_lib.ARPolicy
  temperature: float
  fields = SCORED_FIELDS

  def sample(self, params, prompt_tokens, prompt_lengths, key, *, chunk_rows=0, sharding=None):
    """Rollouts {response_tokens, response_lengths} (module docstring) and no stats."""
    decoding = self.policy.decoding(self.temperature)
    params = self.policy.decoding_params(params)  # once for every chunk

    def rollouts(chunk, chunk_key):
      out = generate.generate(params, self.config, chunk["prompt_tokens"],
                              chunk["prompt_lengths"], decoding, key=chunk_key)
      return {"response_tokens": out.tokens, "response_lengths": out.lengths}

    out = self._map_prompts(rollouts, prompt_tokens, prompt_lengths, key, chunk_rows, sharding)
    return {**out, "response_lengths": out["response_lengths"].astype(np.int32)}, {}

  def log_probs(self, params, batch, *, temperature=None, return_log_probs=False):
    """The causal scorer on the batch's prompts and responses."""
    return policy_lib.causal_log_probs(
      params, self.config, batch.prompt_tokens, batch.prompt_lengths, batch.response_tokens,
      batch.response_lengths,
      temperature=self.temperature if temperature is None else temperature,
      return_log_probs=return_log_probs)


@dataclasses.dataclass(frozen=True)
class DiffusionRollout(_OfPolicy):
  """A block-diffusion policy's rollouts with their traces, scored by replaying the trace.

  Attributes:
    policy: the diffusion policy (its config, spec and response cap M); rollouts take at most
      spec.max_steps_per_block steps per block.
    temperature: the sampling temperature (the log-probs' by default).
    tau: the rollouts' commit threshold.
    shrink: replay step shrinkage (replay.py; 1 = exact).
  """

  policy: policy_lib.DiffusionPolicy
  temperature: float
  tau: float
  shrink: int = 1
  fields = ("prompt_tokens", "prompt_lengths", "trace_tokens", "commit_step",
            "response_lengths", "replay_rounds")

  @property
  def max_rounds(self) -> int:
    """The most replay rounds a trace of this decode setting can need (replay.rounds_needed)."""
    return replay.rounds_needed(self.config.block_size, self.spec.max_steps_per_block,
                                self.shrink)

  def sample(self, params, prompt_tokens, prompt_lengths, key, *, chunk_rows=0, sharding=None):
    """Rollouts with their traces, checked to fit the replay (module docstring); stats
    {'forwards_per_token'}: the decoder's forwards (prefill, denoising and commit) per token."""
    params = self.policy.decoding_params(params)  # once for every chunk
    decoding = self.policy.decoding(self.tau, self.temperature)

    def rollouts(chunk, chunk_key):
      out = decode.block_diffusion_generate(
        params, self.config, chunk["prompt_tokens"], chunk["prompt_lengths"], decoding,
        key=chunk_key)
      return {"trace_tokens": out.trace_tokens, "commit_step": out.commit_step,
              "response_lengths": out.lengths, "response_tokens": out.tokens,
              "commit_logprob": out.commit_logprob, "nfe": out.nfe}

    out = self._map_prompts(rollouts, prompt_tokens, prompt_lengths, key, chunk_rows, sharding)
    replay.check_rounds(out["commit_step"], self.max_rounds, self.shrink)
    forwards = out.pop("nfe").astype(np.int32)
    lengths = out["response_lengths"].astype(np.int32)
    rounds = replay.Rounds(replay.round_bucket(out["commit_step"], self.max_rounds, self.shrink))
    stats = {"forwards_per_token": float(forwards.sum() / max(lengths.sum(), 1))}
    return {**out, "response_lengths": lengths, "replay_rounds": rounds,
            "forwards": forwards}, stats

  def log_probs(self, params, batch, *, temperature=None, return_log_probs=False):
    """The replay of the batch's traces over batch.replay_rounds.count rounds."""
    trace = replay.Trace(batch.prompt_tokens, batch.prompt_lengths, batch.trace_tokens,
                         batch.commit_step, batch.response_lengths)
    res = replay.replay(
      params, self.config, trace, num_rounds=batch.replay_rounds.count,
      temperature=self.temperature if temperature is None else temperature,
      shrink=self.shrink, return_log_probs=return_log_probs)
    return res.logp, res.log_probs


def of_policy(policy: policy_lib.Policy, *, temperature: float, tau: float | None = None,
              shrink: int = 1) -> Rollout:
  """The rollout of a model's own policy: ARRollout of an ARPolicy, DiffusionRollout (at
  commit threshold `tau`, replaying `shrink` steps per round) of a DiffusionPolicy, both sampling
  at `temperature`; ValueError for any other (a LosslessPolicy's output is its verifier's: it
  has no rollouts of its own) or a diffusion rollout without a tau."""
  if policy.kind == "ar":
    return ARRollout(policy, temperature)
  if policy.kind == "diffusion":
    if tau is None:
      raise ValueError("rollout.of_policy: a diffusion rollout needs its commit threshold tau")
    return DiffusionRollout(policy, temperature, tau, shrink)
  raise ValueError(f"rollout.of_policy: no rollout of a {type(policy).__name__} (the on-policy "
                   "stages sample the model's own policy, make_policy without a verifier)")


def make_rollout(config: ModelConfig, spec: DecodeSpec, max_new_tokens: int, shrink: int = 1,
                 *, temperature: float, tau: float | None = None) -> Rollout:
  """The rollout of the model's own policy (policy.make_policy: its decoder and response width,
  the spec's step cap) at the stage's rollout settings (`temperature`, a diffusion model's
  `tau`); `shrink` replay steps per round for a diffusion model."""
  return of_policy(policy_lib.make_policy(config, spec, max_new_tokens), temperature=temperature,
                   tau=tau, shrink=shrink)
