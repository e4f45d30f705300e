"""Lossless draft-and-verify decoding: a block-diffusion drafter proposes, an AR verifier decides.

Speculative decoding (Leviathan et al., arXiv 2211.17192 §2; Chen et al., arXiv 2302.01318
Alg. 2) with a block-diffusion drafter (the draft-then-verify direction Diffusion-GR2, arXiv
2607.01170, leaves to future work). One verify step, for every row at once:

  1. Draft. The drafter (config.mask_token_id set, config.block_size = B) keeps its own block
     alignment (blocks of B aligned to the response start, gr2jax/diffusion/decode.py) and its
     cache holds the prompt and the *complete* accepted blocks. Its canvas is the current block:
     the accepted tokens of the block, then mask tokens. It proposes the next K_eff = min(K,
     tokens left in the block, tokens left in the response - 1) tokens with its own denoising
     steps (`commit.select` at `draft_tau`, at most `draft_steps` steps; the last one commits
     the rest; draft_tau = 0 is a one-step draft). A draft never crosses its block's end. When
     the accepted tokens complete the block, the drafter first runs its commit forward over the
     clean block (block-bidirectional, as decode.py: it writes the block's K/V into its cache)
     and, if the new block has no accepted token yet, takes that forward's last logit as the
     draft's first token (decode.py's seed).
  2. Verify. The verifier (an AR model, block_size 1) keeps a cache of every accepted token but
     the last. One causal forward over [last accepted token, d_1 .. d_K] (K + 1 queries at their
     positions) gives K + 1 next-token distributions. Greedy: the longest prefix of drafts equal
     to the verifier's arg-max is accepted, then the verifier's own next token is appended, so a
     step commits 1 .. K_eff + 1 tokens and the output is the verifier's greedy output.
  3. Roll back. Both caches are cut to the accepted length by their `lengths` alone: the
     verifier's advances by the tokens kept, the drafter's only by a commit forward. A rejected
     draft's K/V stay in slots >= lengths, invisible to every mask and overwritten later: no
     reallocation, no recompile.

Sampling (temperature > 0) uses the speculative-sampling rule (`speculative_accept`): d_i is
accepted with probability min(1, p_i(d_i) / q_i(d_i)); the first rejected position is resampled
from norm(max(0, p_i - q_i)); when every draft is accepted the bonus is drawn from p_{K_eff + 1}.
The output is then distributed as the verifier's own sampling (`generate` at that temperature)
only if q_i, the distribution d_i was drawn from, is a function of the prefix (accepted tokens
and d_<i) alone. Exact here:
  - one-step drafts (draft_tau = 0 or draft_steps = 1): every d_i from one forward of the prefix;
  - commit_order 'left_to_right': each step commits the leftmost open position and the run after
    it, decided on the proposals' *maximum* probabilities (not the sampled tokens'), so which
    positions commit never depends on the values drawn, and d_i's forward saw only d_<i.
Not exact, and refused: 'confidence' (or 'distinct') order with several steps, which commits
later positions first, so d_i's distribution conditions on d_>i. Greedy decoding is exact with
any drafter.

Lock-step batches: each verify step is one iteration of the outer `lax.while_loop`; its draft is
an inner `lax.while_loop` of drafter forwards (one per iteration for all rows: commit forwards
and denoising steps together, as in decode.py) until every row has its draft. Rows accept
different lengths; a finished row is frozen (its caches, tokens and counts stop changing).
The drafter's LM head runs at the K queries that predict the draft window only.

Self-speculative variant: the drafter's own weights at block size 1 verify (Model(drafter.params,
its config at block_size 1)); the output is then exactly that model's own left-to-right decoding
(block_diffusion_generate at B = 1), not another model's.

Floating point: the verify forward scores K + 1 queries where `generate` scores one, so their
matmuls and softmax sums round differently (~1e-7 relative in fp32; far more in bf16, where AR at
batch 1 and at batch 16 differ too). A greedy choice between two logits closer than that can
fall either way, so "the verifier's greedy output" means exact as gr2jax/decoding/exactness.py
defines it: every committed token is the verifier's teacher-forced arg-max at that batch, or a
near-tie within exactness.TOLERANCE of the position's logit scale. tests/diffusion/
test_speculative.py and experiments/studies/bench_speculative.py report where a decode leaves
`generate`'s (first divergent token, logit margin); the GPU check measures the bf16 flip rate.
"""

import abc
import dataclasses
import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from gr2jax import settings
from gr2jax.diffusion import commit, decode
from gr2jax.model import decode_core, generate, qwen3, validate
from gr2jax.model.cache import KVCache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import layer_list

FIRST_STEP = -1  # token_step of the first token (the verifier's prefill proposes it)
NO_STEP = 2**30  # token_step after a row's length


@dataclasses.dataclass(frozen=True, kw_only=True)
class DraftDecoding(decode_core.Decoding):
  """How a draft-and-verify decode runs (decode_core.Decoding's fields, then how the drafter
  drafts; static under jit); a recipe's is `DecodeSpec.draft(max_new_tokens)`. Stop ids
  (None: the verifier's config.eos_token_ids) end a row as the verifier's.

  The draft defaults are the recipe defaults: gr2jax/decoding/spec.py's DecodeSpec takes its
  draft_k, draft_tau and draft_steps defaults from here (the one place they are written; this
  floor cannot import that one). commit_order is looked up once, here (the field then holds the
  commit.CommitOrder); with temperature > 0 only a left-to-right order or a one-step draft keep
  the output the verifier's (module docstring).
  """

  WHERE = "DraftDecoding"

  k: int = settings.integer(16, doc="K, tokens drafted per verify step (<= the drafter's block "
                            "size)", minimum=1)
  draft_tau: float = settings.real(0.0, doc="the drafter's commit threshold (0 = a one-step "
                                   "draft: every position of the window from one forward)",
                                   low=0, high=1, note=" (0 = a one-step draft)")
  draft_steps: int = settings.integer(8, doc="denoising-step budget of one draft (the last "
                                      "allowed step commits the rest of the window)", minimum=1)
  commit_order: commit.CommitOrder = commit.order_field(
    doc="the drafter's commit order, a commit.CommitOrder or its name")

  def check(self, where: str) -> None:
    """Holds the commit order's object; refuses a sampled draft that is not lossless."""
    super().check(where)
    decode_core.keep(self, commit_order=commit.lookup(where, "commit_order", self.commit_order))
    if self.temperature > 0 and not (self.commit_order.left_to_right or self.one_step):
      raise ValueError(
        f"{settings.label(where, 'temperature')}={self.temperature} with commit_order="
        f"{self.commit_order.name!r} and {self.draft_steps} draft steps is not lossless (a later"
        " position commits first, so a draft's distribution conditions on the drafts after "
        "it); use commit_order='left_to_right', draft_tau=0 or draft_steps=1")

  @property
  def one_step(self) -> bool:
    """Every draft comes from one forward (draft_tau 0 commits every position at once)."""
    return self.draft_tau == 0 or self.draft_steps == 1


class Model(NamedTuple):
  """A model: its param pytree and its config."""

  params: dict
  config: ModelConfig


class SpecOutput(NamedTuple):
  """What speculative_generate returns (N = max_new_tokens).

  Attributes:
    tokens: [B, N] int32 generated tokens, pad_token_id after `lengths`.
    lengths: [B] int32 tokens per row, the stop token included.
    verify_forwards: [B] int32 verify forwards of the row (the verifier's prefill not counted).
    draft_forwards: [B] int32 drafter forwards that worked on the row: denoising steps and
      commit forwards (its prefill not counted).
    accepted: [B] int32 drafted tokens accepted (the rest of `lengths` are verifier tokens).
    token_step: [B, N] int32 the row's verify step that committed each token (FIRST_STEP for
      the first token, NO_STEP after `lengths`); token j was a drafted one iff token j + 1 has
      the same step.
    step_drafted: [B, N] int32 per verify step s of the row: K_eff, tokens drafted.
    step_accepted: [B, N] int32 per verify step: drafted tokens accepted.
    step_draft_forwards: [B, N] int32 per verify step: drafter forwards (commit + denoising).
    num_steps: [] int32 batched verify forwards (outer loop iterations).
    num_draft_forwards: [] int32 batched drafter forwards.
  """

  tokens: jax.Array
  lengths: jax.Array
  verify_forwards: jax.Array
  draft_forwards: jax.Array
  accepted: jax.Array
  token_step: jax.Array
  step_drafted: jax.Array
  step_accepted: jax.Array
  step_draft_forwards: jax.Array
  num_steps: jax.Array
  num_draft_forwards: jax.Array


# ---- the verify rules ----------------------------------------------------------------------


def verifier_greedy(logits: jax.Array, mask_token_id: int | None) -> jax.Array:
  """The verifier's greedy tokens, exactly as its own decoder picks them.

  Args:
    logits: [..., V] f32 raw logits.
    mask_token_id: None for an AR verifier (`generate`: first arg-max of the raw logits), else
      the mask id of a diffusion model at block size 1 (decode.py: commit.propose, the mask
      token never picked).

  Returns:
    [...] int32 tokens.
  """
  if mask_token_id is None:
    return generate.first_argmax(logits)
  return commit.propose(logits, mask_token_id, 0.0, None)[0]


def _leading_true(x: jax.Array) -> jax.Array:
  """[B, K] bool -> [B] int32, the length of each row's leading run of True."""
  return jnp.sum(jnp.cumprod(x.astype(jnp.int32), axis=-1), axis=-1)


def greedy_accept(greedy: jax.Array, drafts: jax.Array, num_drafts: jax.Array):
  """Accepts the longest prefix of drafts equal to the verifier's greedy choices.

  Args:
    greedy: [B, K + 1] int32 the verifier's greedy token at each verify query (query i predicts
      the token after d_i; query 0 the one after the last accepted token).
    drafts: [B, K] int32 d_1 .. d_K.
    num_drafts: [B] int32 K_eff, the real drafts (the rest are placeholders, never accepted).

  Returns:
    (accepted a [B] int32 in 0..K_eff, bonus [B] int32 = greedy[a], the verifier's token).
  """
  k = drafts.shape[1]
  real = jnp.arange(k)[None, :] < num_drafts[:, None]
  a = _leading_true((drafts == greedy[:, :k]) & real)
  return a, jnp.take_along_axis(greedy, a[:, None], axis=1)[:, 0]


def speculative_accept(p_logp: jax.Array, q_logp: jax.Array, drafts: jax.Array,
                       num_drafts: jax.Array, key: jax.Array):
  """The speculative-sampling rule (Leviathan et al., arXiv 2211.17192 §2.3, Alg. 1).

  Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)) while every earlier one was accepted;
  the first rejected position draws its token from norm(max(0, p_i - q_i)); after K_eff
  acceptances the bonus is drawn from p_{K_eff + 1}. The committed tokens are then distributed as
  the verifier's own samples, whatever q is, as long as q_i is the distribution d_i was drawn
  from given the prefix (module docstring).

  Args:
    p_logp: [B, K + 1, V] f32 the verifier's log-probs at each verify query.
    q_logp: [B, K, V] f32 the drafter's log-probs d_1 .. d_K were sampled from.
    drafts: [B, K] int32.
    num_drafts: [B] int32 K_eff.
    key: PRNG key.

  Returns:
    (accepted a [B] int32 in 0..K_eff, bonus [B] int32: the token committed after them).
  """
  b, k = drafts.shape
  accept_key, bonus_key = jax.random.split(key)
  p_d = jnp.take_along_axis(p_logp[:, :k], drafts[:, :, None], axis=-1)[..., 0]  # [B, K]
  q_d = jnp.take_along_axis(q_logp, drafts[:, :, None], axis=-1)[..., 0]
  u = jax.random.uniform(accept_key, (b, k), jnp.float32)
  real = jnp.arange(k)[None, :] < num_drafts[:, None]
  a = _leading_true((jnp.log(u) < p_d - q_d) & real)
  p_a = jnp.exp(jnp.take_along_axis(p_logp, a[:, None, None], axis=1)[:, 0])  # [B, V]
  q_pad = jnp.concatenate([q_logp, jnp.full_like(q_logp[:, :1], -jnp.inf)], axis=1)
  q_a = jnp.exp(jnp.take_along_axis(q_pad, a[:, None, None], axis=1)[:, 0])
  q_a = jnp.where((a < num_drafts)[:, None], q_a, 0.0)  # all accepted: the bonus is from p
  residual = jnp.maximum(p_a - q_a, 0.0)
  residual = jnp.where(jnp.sum(residual, -1, keepdims=True) > 0, residual, p_a)  # p == q
  bonus = jax.random.categorical(bonus_key, jnp.log(residual), axis=-1).astype(jnp.int32)
  return a, bonus


# ---- the decoder ---------------------------------------------------------------------------


class _Draft(NamedTuple):
  """The inner (drafting) loop's carry; W = K window slots."""

  cache: KVCache  # the drafter's
  committing: jax.Array  # [B] the next forward is this row's commit forward
  window: jax.Array  # [B, W] drafted tokens (mask token where open)
  open: jax.Array  # [B, W] window slots still to draft
  q_logp: jax.Array | None  # [B, W, V] distributions the drafts came from (sampling only)
  step: jax.Array  # [B] denoising steps of this draft
  forwards: jax.Array  # [B] drafter forwards of this draft
  num_forwards: jax.Array  # []
  key: jax.Array


class LoopState(NamedTuple):
  """The outer (verify) loop's carry; R = response slots."""

  v_cache: KVCache  # every accepted token but the last
  d_cache: KVCache  # the prompt and the complete blocks before d_start
  last: jax.Array  # [B] the last accepted token
  n: jax.Array  # [B] accepted tokens (the row's length once done)
  d_start: jax.Array  # [B] response index of the drafter's current block
  done: jax.Array  # [B]
  out: jax.Array  # [B, R]
  token_step: jax.Array  # [B, R]
  step: jax.Array  # [B] verify steps of the row
  step_rec: jax.Array  # [B, N, 3] per verify step: drafted, accepted, drafter forwards
  num_forwards: jax.Array  # [2] batched verify, drafter forwards
  key: jax.Array


def _at_step(buf: jax.Array, step: jax.Array, value: jax.Array, write: jax.Array) -> jax.Array:
  """buf [B, N, C] with buf[b, step[b]] = value[b] ([B, C]) where write[b]."""
  rows = jnp.arange(buf.shape[0])
  return buf.at[rows, step].set(jnp.where(write[:, None], value, buf[rows, step]), mode="drop")


class Rules(abc.ABC):
  """How a verify step drafts and accepts: the strategy `loop_step` runs (traced, inside the
  while loops). The decoder's is DecoderRules; a replay of a recorded run brings its own
  (experiments/emulate.py).
  """

  @abc.abstractmethod
  def draft_select(self, step: jax.Array, draft_step: jax.Array,
                   proposed: tuple[jax.Array, jax.Array], window: jax.Array,
                   open_: jax.Array) -> commit.CommitResult:
    """The commits of one denoising step of a draft.

    Args:
      step: [B] int32 the row's verify step.
      draft_step: [B] int32 denoising steps this draft has run.
      proposed: (tokens [B, W] int32, their log-confidences [B, W] f32: the proposals'
        log-probs, or when sampling the log of their distributions' maxima, module docstring).
      window: [B, W] int32 the draft window (mask token where open).
      open_: [B, W] bool the window slots that may commit.

    Returns:
      commit.CommitResult of the window.
    """

  @abc.abstractmethod
  def accept(self, step: jax.Array, logits: jax.Array, drafts: jax.Array,
             q_logp: jax.Array | None, k_eff: jax.Array,
             key: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(accepted drafts a [B] in 0..k_eff, the token committed after them [B]) of verify step
    `step` [B] from the verifier's logits [B, K + 1, V], the drafts [B, K], the distributions
    they were drawn from (q_logp [B, K, V], sampling only) and K_eff [B]."""


class DecoderRules(Rules):
  """The decoder's rules (module docstring): a draft commits by commit.select's threshold rule
  at spec.draft_tau, its step with index spec.draft_steps - 1 the rest; a verify step accepts
  by greedy_accept, or by speculative_accept when sampling."""

  def __init__(self, spec: DraftDecoding, mask_token_id: int | None):
    self.spec, self.mask_token_id = spec, mask_token_id

  def draft_select(self, step, draft_step, proposed, window, open_):
    """Rules.draft_select: the threshold at draft_tau under the draft_steps cap."""
    del step
    _, tau = commit.capped_threshold(draft_step, self.spec.draft_steps, self.spec.draft_tau)
    return commit.select(*proposed, window, open_, tau, order=self.spec.commit_order)

  def accept(self, step, logits, drafts, q_logp, k_eff, key):
    """Rules.accept: greedy_accept, or speculative_accept when sampling."""
    del step
    if self.spec.temperature > 0:
      return speculative_accept(commit.token_log_probs(logits, self.mask_token_id,
                                                       self.spec.temperature),
                                q_logp, drafts, k_eff, key)
    return greedy_accept(verifier_greedy(logits, self.mask_token_id), drafts, k_eff)


def _draft(params, config, s: LoopState, prompt_lengths, spec: DraftDecoding, rules: Rules,
           key):
  """The drafts of one verify step (inner while loop, module docstring).

  Returns:
    (drafts [B, K], q_logp [B, K, V] | None, K_eff [B], the drafter cache, d_start [B],
    drafter forwards [B], batched forwards []).
  """
  b, t, k = s.out.shape[0], config.block_size, spec.k
  temperature = spec.temperature
  max_new = s.step_rec.shape[1]
  mask_id = config.mask_token_id
  active = ~s.done
  complete = s.n >= s.d_start + t
  start = jnp.where(complete, s.d_start + t, s.d_start)  # the block the draft lies in
  j = s.n - start  # accepted tokens of that block (0 only right after a commit)
  k_eff = jnp.clip(jnp.minimum(jnp.minimum(k, t - j), max_new - s.n - 1), 0, k)
  k_eff = jnp.where(active, k_eff, 0)
  committing = complete & (k_eff > 0)
  slots = jnp.arange(k, dtype=jnp.int32)[None, :]  # [1, W]
  in_window = slots < k_eff[:, None]
  old_block = decode_core.read_rows(s.out, s.d_start, t)  # [B, T], complete where committing
  block_idx = jnp.arange(t, dtype=jnp.int32)[None, :]
  prefix = jnp.where(start[:, None] + block_idx < s.n[:, None],
                     decode_core.read_rows(s.out, start, t), mask_id)  # [B, T] accepted, masks
  rows = jnp.arange(b)[:, None]
  queries = jnp.clip(j[:, None] - 1 + slots, 0, t - 1)  # query i - 1 predicts window slot i

  def body(d: _Draft) -> _Draft:
    key, sub = jax.random.split(d.key)
    drafting = jnp.any(d.open, axis=-1) & ~d.committing
    place = jnp.where(in_window, j[:, None] + slots, t)  # out of range: dropped
    canvas = jnp.where(d.committing[:, None], old_block,
                       prefix.at[rows, place].set(d.window, mode="drop"))
    at = jnp.where(d.committing[:, None], t - 1, queries)
    logits, written = decode.block_forward(params, config, d.cache, canvas, prompt_lengths, at)
    tokens, token_logp = commit.propose(logits, mask_id, temperature, sub)  # [B, W]
    logp = conf = None
    if temperature > 0:  # q, and confidences of the maxima (module docstring)
      logp = commit.token_log_probs(logits, mask_id, temperature)  # [B, W, V]
      conf = jnp.max(logp, axis=-1)
    # Commit forward: the new block's first token, when it has no accepted one, is the seed.
    seed = (d.committing & (j == 0))[:, None] & (slots == 0)
    window = jnp.where(seed, tokens[:, :1], d.window)
    open_ = d.open & ~seed
    # Denoising step: the rules' (the decoder's: the threshold at draft_tau, capped).
    res = rules.draft_select(s.step, d.step, (tokens, token_logp if conf is None else conf),
                             window, open_ & drafting[:, None])
    q_logp = d.q_logp
    if temperature > 0:
      q_logp = jnp.where((seed | res.committed)[..., None], logp, q_logp)
    return d._replace(
      cache=written.replace(lengths=d.cache.lengths + t * d.committing),
      committing=jnp.zeros_like(d.committing), window=res.canvas,
      open=jnp.where(drafting[:, None], res.masked, open_),
      q_logp=q_logp, step=d.step + drafting, forwards=d.forwards + (drafting | d.committing),
      num_forwards=d.num_forwards + 1, key=key)

  zeros = jnp.zeros((b,), jnp.int32)
  v = config.vocab_size
  init = _Draft(cache=s.d_cache, committing=committing, window=jnp.full((b, k), mask_id, jnp.int32),
                open=in_window,
                q_logp=jnp.zeros((b, k, v), jnp.float32) if temperature > 0 else None,
                step=zeros, forwards=zeros, num_forwards=jnp.zeros((), jnp.int32), key=key)
  d = lax.while_loop(lambda d: jnp.any(d.committing | jnp.any(d.open, axis=-1)), body, init)
  drafts = jnp.where(in_window, d.window, config.pad_token_id)
  return (drafts, d.q_logp, k_eff, d.cache, jnp.where(committing, start, s.d_start), d.forwards,
          d.num_forwards)


def prefills(params_d, params_v, prompt_tokens, prompt_lengths, *, config_d, config_v, caches):
  """Both prompt prefills (traceable; params in the decoders' layout): (verifier cache,
  verifier logits [B, V] f32, drafter cache), of caches = (verifier, drafter) slots."""
  v_logits, v_cache = decode_core.prefill(params_v, config_v, prompt_tokens, prompt_lengths,
                                          caches[0])
  _, d_cache = decode_core.prefill(params_d, config_d, prompt_tokens, prompt_lengths, caches[1])
  return v_cache, v_logits, d_cache


@functools.partial(jax.jit, static_argnames=("config_d", "config_v", "spec", "caches"))
def _decode(params_d, params_v, prompt_tokens, prompt_lengths, stop_ids, key, *, config_d,
            config_v, spec, caches):
  """The jitted decoder (module docstring); `caches` = (verifier slots, drafter slots).

  Returns:
    (SpecOutput, the verifier cache, the drafter cache).
  """
  prefilled = prefills(params_d, params_v, prompt_tokens, prompt_lengths, config_d=config_d,
                       config_v=config_v, caches=caches)
  return decode_loop(params_d, params_v, prompt_lengths, stop_ids, key, prefilled,
                     DecoderRules(spec, config_v.mask_token_id),
                     Settings(config_d, config_v, spec))


class Settings(NamedTuple):
  """The static settings of a draft-and-verify loop (hashable)."""

  config_d: ModelConfig
  config_v: ModelConfig
  spec: DraftDecoding


def decode_loop(params_d, params_v, prompt_lengths, stop_ids, key, prefilled, rules: Rules,
                settings: Settings):
  """The decode after the prefills (traceable; module docstring): one while_loop of
  `loop_step` from `loop_start`, read out by `loop_output`.

  Args:
    params_d, params_v: the drafter's and the verifier's params (the decoders' layout).
    prompt_lengths: [B] int32.
    stop_ids: [S] int32 (-1 for none).
    key: PRNG key.
    prefilled: `prefills(...)` of the prompts.
    rules: how each verify step drafts and accepts (the decoder's: DecoderRules).
    settings: the static settings (the configs, the DraftDecoding).

  Returns:
    (SpecOutput, the verifier cache, the drafter cache).
  """
  s = loop_start(prompt_lengths, stop_ids, key, prefilled, settings)
  s = lax.while_loop(lambda s: ~jnp.all(s.done), lambda s: loop_step(
    params_d, params_v, prompt_lengths, stop_ids, rules, settings, s), s)
  return loop_output(settings, s)


def loop_start(prompt_lengths, stop_ids, key, prefilled, settings: Settings) -> LoopState:
  """The loop's first state (traceable): the verifier's first token from its prefill's logits;
  arguments as decode_loop's."""
  config_d, config_v, spec = settings
  max_new_tokens, temperature = spec.max_new_tokens, spec.temperature
  b = prompt_lengths.shape[0]
  k, t, n_max = spec.k, config_d.block_size, max_new_tokens
  # response slots: every block window and verify write
  r = decode_core.padded_width(n_max, t) + t + k + 1
  key, first_key = jax.random.split(key)
  v_cache, v_logits, d_cache = prefilled
  mask_v = config_v.mask_token_id
  if temperature > 0:
    logp = commit.token_log_probs(v_logits, mask_v, temperature)
    first = jax.random.categorical(first_key, logp, axis=-1).astype(jnp.int32)
  else:
    first = verifier_greedy(v_logits, mask_v)
  zeros = jnp.zeros((b,), jnp.int32)
  return LoopState(
    v_cache=v_cache, d_cache=d_cache, last=first, n=jnp.ones((b,), jnp.int32), d_start=zeros,
    done=jnp.isin(first, stop_ids) | (n_max == 1),
    out=jnp.zeros((b, r), jnp.int32).at[:, 0].set(first),
    token_step=jnp.full((b, r), NO_STEP, jnp.int32).at[:, 0].set(FIRST_STEP), step=zeros,
    step_rec=jnp.zeros((b, n_max, 3), jnp.int32), num_forwards=jnp.zeros((2,), jnp.int32),
    key=key)


def loop_step(params_d, params_v, prompt_lengths, stop_ids, rules: Rules, settings: Settings,
              s: LoopState) -> LoopState:
  """One verify step of every active row (traceable; module docstring): draft, verify, roll
  back; arguments as decode_loop's, s the state (loop_start's or a loop_step's)."""
  config_d, config_v, spec = settings
  k, n_max = spec.k, spec.max_new_tokens
  key, draft_key, verify_key = jax.random.split(s.key, 3)
  active = ~s.done
  drafts, q_logp, k_eff, d_cache, d_start, d_fwd, d_num = _draft(
    params_d, config_d, s, prompt_lengths, spec, rules, draft_key)
  logits, v_written = qwen3.forward(params_v, config_v,
                                    jnp.concatenate([s.last[:, None], drafts], axis=1),
                                    cache=s.v_cache, update_cache=True)  # [B, K + 1, V]
  a, bonus = rules.accept(s.step, logits, drafts, q_logp, k_eff, verify_key)
  slots = jnp.arange(k + 1, dtype=jnp.int32)[None, :]
  committed = jnp.where(slots < a[:, None], jnp.pad(drafts, ((0, 0), (0, 1))), bonus[:, None])
  kept = slots <= a[:, None]  # [B, K + 1]
  stop_at = decode_core.first_stop(committed, kept, stop_ids)  # [B], K + 1 where none
  count = jnp.minimum(a + 1, stop_at + 1)  # tokens this step commits
  n = jnp.where(active, s.n + count, s.n)
  keep = active[:, None] & (slots < count[:, None])
  window = decode_core.read_rows(s.out, s.n, k + 1)
  place = decode_core.write_rows
  out = place(s.out, jnp.where(keep, committed, window), s.n)
  old_steps = decode_core.read_rows(s.token_step, s.n, k + 1)
  token_step = place(s.token_step, jnp.where(keep, s.step[:, None], old_steps), s.n)
  accepted = jnp.minimum(a, count)  # drafts kept (a stop token among them ends the row)
  done = s.done | (stop_at <= a) | (n >= n_max)
  return s._replace(
    v_cache=v_written.replace(lengths=s.v_cache.lengths + jnp.where(active, count, 0)),
    d_cache=d_cache, last=jnp.where(active, bonus, s.last), n=n, d_start=d_start,
    done=done, out=out, token_step=token_step,
    step=s.step + active,
    step_rec=_at_step(s.step_rec, s.step, jnp.stack([k_eff, accepted, d_fwd], -1), active),
    num_forwards=s.num_forwards + jnp.stack([jnp.int32(1), d_num]), key=key)


def loop_output(settings: Settings, s: LoopState):
  """(SpecOutput, the verifier cache, the drafter cache) of the loop's last state
  (traceable)."""
  n_max, pad = settings.spec.max_new_tokens, settings.config_v.pad_token_id
  keep = jnp.arange(n_max)[None, :] < s.n[:, None]
  drafted, accepted, d_forwards = (s.step_rec[..., i] for i in range(3))
  out = SpecOutput(
    tokens=jnp.where(keep, s.out[:, :n_max], pad), lengths=s.n,
    verify_forwards=s.step, draft_forwards=jnp.sum(d_forwards, -1),
    accepted=jnp.sum(accepted, -1), token_step=jnp.where(keep, s.token_step[:, :n_max], NO_STEP),
    step_drafted=drafted, step_accepted=accepted, step_draft_forwards=d_forwards,
    num_steps=s.num_forwards[0], num_draft_forwards=s.num_forwards[1])
  return out, s.v_cache, s.d_cache


# ---- the entry points ----------------------------------------------------------------------


def cache_slots(where: str, config_v: ModelConfig, config_d: ModelConfig, prompt_len: int,
                max_new_tokens: int) -> tuple[int, int]:
  """(verifier, drafter) cache slots: P + N as `generate` (verify writes past it are dropped;
  every accepted token fits), P + whole drafter blocks as block_diffusion_generate; each within
  its model's positions (decode_core.check_positions)."""
  return (decode_core.check_positions(where, config_v, prompt_len, max_new_tokens,
                                      model="the verifier"),
          decode_core.check_positions(where, config_d, prompt_len, max_new_tokens,
                                      model="the drafter"))


def _as_model(where: str, name: str, model) -> Model:
  if not (isinstance(model, tuple) and len(model) == 2 and isinstance(model[1], ModelConfig)):
    raise TypeError(f"{where}: {name} must be a Model(params, config), got "
                    f"{type(model).__name__}")
  params, config = model
  embed = params.get("embed") if isinstance(params, dict) else None
  if embed is None:
    raise TypeError(f"{where}: {name}.params must be the param dict (gr2jax.model.params)")
  validate.check_shape(where, f"{name}.params['embed']", embed,
                       shape=(config.vocab_size, config.hidden_size))
  return Model(params, config)


def check_pair(where: str, cd: ModelConfig, cv: ModelConfig, k: int) -> None:
  """The drafter (config cd) is a block-diffusion model, the verifier (cv) an AR one, on the
  same tokens, and K = k fits the drafter's block.

  Raises:
    ValueError / TypeError: starting with `where`, naming the model and the field.
  """
  if cd.mask_token_id is None:
    raise ValueError(f"{where}: the drafter has no mask token (config.mask_token_id is None): "
                     "it must be a block-diffusion model")
  if not 0 <= cd.mask_token_id < cd.vocab_size:
    raise ValueError(f"{where}: the drafter's mask_token_id={cd.mask_token_id} is outside the "
                     f"vocab [0, {cd.vocab_size - 1}]")
  if cv.block_size != 1:
    raise ValueError(f"{where}: the verifier has block_size={cv.block_size}; it must be an AR "
                     "model (block_size 1; the drafter's weights at block_size 1 for the "
                     "self-speculative mode)")
  for field in ("vocab_size", "eos_token_ids", "pad_token_id"):
    if getattr(cd, field) != getattr(cv, field):
      raise ValueError(f"{where}: the drafter's config.{field}={getattr(cd, field)!r} differs "
                       f"from the verifier's {getattr(cv, field)!r} (one tokenizer for both)")
  if k > cd.block_size:
    raise ValueError(f"{where}: k={k} exceeds the drafter's block size {cd.block_size} (a "
                     "draft never crosses its block)")


class Checked(NamedTuple):
  """The arguments of a draft-and-verify decode, checked (`check_inputs`)."""

  drafter: Model
  verifier: Model
  prompt_tokens: jax.Array  # [B, P] int32
  prompt_lengths: jax.Array  # [B] int32
  key: jax.Array
  stop_ids: jax.Array  # [S] int32 the stop ids (-1 for none)
  slots: tuple[int, int]  # cache_slots


def check_inputs(where, drafter, verifier, prompts, decoding, key=None) -> Checked:
  """Checks every argument of speculative_generate before tracing (its Raises); prompts =
  (prompt_tokens, prompt_lengths)."""
  prompt_tokens, prompt_lengths = prompts
  drafter = _as_model(where, "drafter", drafter)
  verifier = _as_model(where, "verifier", verifier)
  stop, key = decode_core.check_call(where, decoding, DraftDecoding, verifier.config, key)
  check_pair(where, drafter.config, verifier.config, decoding.k)
  prompt_tokens, prompt_lengths = validate.prompts(where, verifier.config, prompt_tokens,
                                                   prompt_lengths)
  return Checked(drafter, verifier, prompt_tokens, prompt_lengths, key,
                 decode_core.stop_id_array(stop),
                 cache_slots(where, verifier.config, drafter.config, prompt_tokens.shape[1],
                             decoding.max_new_tokens))


def _generate(where, drafter, verifier, prompt_tokens, prompt_lengths, decoding, key):
  """Checks every argument (before tracing), then runs `_decode`: (SpecOutput, verifier cache,
  drafter cache)."""
  c = check_inputs(where, drafter, verifier, (prompt_tokens, prompt_lengths), decoding, key)
  return _decode(layer_list(c.drafter.params), layer_list(c.verifier.params), c.prompt_tokens,
                 c.prompt_lengths, c.stop_ids, c.key, config_d=c.drafter.config,
                 config_v=c.verifier.config, spec=decoding, caches=c.slots)


def speculative_generate(drafter: Model, verifier: Model, prompt_tokens: jax.Array,
                         prompt_lengths: jax.Array | None, decoding: DraftDecoding, *,
                         key: jax.Array | None = None) -> SpecOutput:
  """Draft-and-verify generation (module docstring; decode_core.Decoding's convention): the
  verifier's output, faster.

  Greedy (temperature 0): the tokens equal `generate(verifier, ...)`'s greedy tokens up to float
  near-ties (exact as gr2jax/decoding/exactness.py defines it, module docstring); stop ids are
  decoding's, else the verifier's config.eos_token_ids.

  Args:
    drafter: Model(params, config) of a block-diffusion model (config.mask_token_id set,
      config.block_size = B).
    verifier: Model of an AR model (block_size 1) with the drafter's vocab, eos and pad ids.
    prompt_tokens: [B, P] int right-padded prompts.
    prompt_lengths: [B] int real lengths in 1..P (None: P for every row).
    decoding: DraftDecoding (max_new_tokens N; temperature: 0 = greedy, > 0 samples as
      `generate` at that temperature, speculative sampling, which needs a lossless draft, module
      docstring; K <= B, draft_tau, draft_steps, commit_order).
    key: PRNG key, required when decoding.temperature > 0.

  Returns:
    SpecOutput.

  Raises:
    TypeError / ValueError naming the argument, before tracing: a drafter without a mask token,
      a verifier with block_size > 1, different vocab / eos / pad ids, K > B, decoding that is
      not a DraftDecoding (its fields, sampling with a multi-step 'confidence' draft included,
      are checked when it is built), prompts and lengths as `generate`, stop ids outside the
      vocab, no key when sampling or a key that is not a PRNG key, P + max_new_tokens past
      either model's max_position_embeddings (decode_core.check_positions).
  """
  return _generate("speculative_generate", drafter, verifier, prompt_tokens, prompt_lengths,
                   decoding, key)[0]
