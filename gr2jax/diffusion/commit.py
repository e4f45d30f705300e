"""Confidence-threshold commit rule for block-diffusion decoding (vectorised, jit-friendly).

One denoising step proposes a token for every still-masked position (arg-max at temperature 0,
a sample otherwise) and commits every masked position whose confidence -- the probability of
its proposed token -- is strictly above tau, plus the single most confident masked position
(forced, so at least one token commits per step). The strict `>` (Fast-dLLM v2's rule) makes
tau = 1.0 commit exactly one token per step: a confidence is at most 1.0, and on a peaked
distribution fp32 rounds several to exactly 1.0, which `>=` would all commit at once.

This is dInfer's `threshold = min(tau, max_conf - 1e-5)` except for near-ties: that form also
commits every position within 1e-5 of the maximum, which for near-uniform distributions (a
random or undertrained model, confidences ~1/V) commits almost the whole block at once even at
tau = 1.0; forcing exactly the arg-max position does not. The mask token itself is never
proposed: its logit is set to -inf before sampling. Committed positions never change.

Logits here are already shifted: `logits[:, i]` is the distribution of `canvas[:, i]` (the
decoder takes it from the forward's position i - 1).
"""

import abc
from typing import NamedTuple

import jax
import jax.numpy as jnp

from gr2jax import settings
from gr2jax.model import generate


class CommitResult(NamedTuple):
  """The outcome of one commit step.

  Attributes:
    canvas: [B, T] int32 tokens, newly committed ones written in.
    masked: [B, T] bool, still-masked positions after this step.
    committed: [B, T] bool, the positions committed by this step.
    logprob: [B, T] f32 log-prob of the proposed token (meaningful where `committed`).
  """

  canvas: jax.Array
  masked: jax.Array
  committed: jax.Array
  logprob: jax.Array


def token_log_probs(logits: jax.Array, mask_token_id: int | None, temperature: float) -> jax.Array:
  """The policy's log-probs: mask token suppressed, divided by the temperature (1 when greedy).

  The decoder, the replay, AR RL and diffusion RL all score tokens with this one function (an AR
  model passes mask_token_id=None): the same temperature convention as the samplers.

  Args:
    logits: [..., V] raw logits.
    mask_token_id: the id of the mask token (its logit becomes -inf), or None (AR: no mask).
    temperature: sampling temperature; 0 means greedy and scores at temperature 1.

  Returns:
    [..., V] f32 log-probs.
  """
  logits = logits.astype(jnp.float32)
  if mask_token_id is not None:
    logits = logits.at[..., mask_token_id].set(-jnp.inf)
  if temperature > 0:
    logits = logits / temperature
  return jax.nn.log_softmax(logits, axis=-1)


def propose(
  logits: jax.Array, mask_token_id: int, temperature: float, key: jax.Array | None
) -> tuple[jax.Array, jax.Array]:
  """Proposes a token per position: arg-max at temperature 0, a sample otherwise.

  Args:
    logits: [B, T, V] raw (shifted) logits.
    mask_token_id: never proposed.
    temperature: 0 for greedy, else the sampling temperature.
    key: PRNG key, required when temperature > 0.

  Returns:
    tokens [B, T] int32 and their log-probs [B, T] f32 under `token_log_probs`.
  """
  logp = token_log_probs(logits, mask_token_id, temperature)  # [B, T, V]
  if temperature > 0:
    if key is None:
      raise ValueError(f"temperature={temperature} > 0 needs a PRNG key, got key=None")
    # Gumbel-max, as jax.random.categorical(key, logp) computes it, with the fast arg-max.
    tokens = generate.first_argmax(jax.random.gumbel(key, logp.shape, logp.dtype) + logp)
  else:
    tokens = generate.first_argmax(logp)
  tokens = tokens.astype(jnp.int32)
  return tokens, jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


def commit_step(
  logits: jax.Array,
  canvas: jax.Array,
  masked: jax.Array,
  *,
  threshold: float | jax.Array,
  mask_token_id: int,
  temperature: float = 0.0,
  key: jax.Array | None = None,
) -> CommitResult:
  """Commits every masked position above the per-example threshold (>= 1 per example).

  Args:
    logits: [B, T, V] shifted logits (`logits[:, i]` predicts `canvas[:, i]`).
    canvas: [B, T] int32 current tokens (mask token at masked positions).
    masked: [B, T] bool, positions still open; an example with none commits nothing.
    threshold: tau, a scalar or [B]: confidence > tau commits (a value < 0 commits every masked
      position, 1.0 only the forced one).
    mask_token_id: id of the mask token, never committed.
    temperature: 0 for greedy, else the sampling temperature.
    key: PRNG key for temperature > 0.

  Returns:
    CommitResult (see its docstring).
  """
  if logits.ndim != 3 or logits.shape[:2] != canvas.shape or canvas.shape != masked.shape:
    raise ValueError(
      f"commit_step: logits {logits.shape} must be [B, T, V] over canvas {canvas.shape} and "
      f"masked {masked.shape} [B, T]"
    )
  tokens, logprob = propose(logits, mask_token_id, temperature, key)  # [B, T]
  return select(tokens, logprob, canvas, masked, threshold)


class CommitOrder(abc.ABC):
  """A commit order: which open positions of a denoising step commit first (`select`).

  One small object per order (the registry `BY_NAME`), looked up once from its recorded name
  where a decode's settings are checked (`lookup`); `select` calls its two methods and never
  branches on a name. Instances are stateless singletons (hashable: a static jit argument).

  Attributes:
    name: the recorded value (DecodeSpec.commit_order, export metadata, recipes).
    left_to_right: each step commits a leftmost run of open positions, decided on confidences
      alone: a sampled draft's distribution then conditions only on the drafts before it
      (speculative.py's lossless sampling).
  """

  name: str = ""
  left_to_right: bool = False

  @abc.abstractmethod
  def rank(self, tokens, conf, canvas, masked) -> tuple[jax.Array, jax.Array | None]:
    """(rank [B, T] int: 0 commits first -- the order a count replay commits in; eligible
    [B, T] bool or None: the open positions the threshold may commit, None = all)."""

  @abc.abstractmethod
  def by_threshold(self, conf, tau, rank, eligible, masked) -> jax.Array:
    """[B, T] bool committed by the threshold rule: conf [B, T] (-inf where closed), tau [B]."""

  def __repr__(self):
    return f"CommitOrder({self.name!r})"


def _confidence_rank(conf: jax.Array) -> jax.Array:
  """[B, T] int32 rank of each position by confidence [B, T] (0 = the most confident)."""
  by_conf = jnp.argsort(-conf, axis=-1, stable=True)
  return jnp.argsort(by_conf, axis=-1, stable=True)


class Confidence(CommitOrder):
  """'confidence', the paper's rule: every open position above tau plus the most confident one
  (forced, so a step commits at least one)."""

  name = "confidence"

  def rank(self, tokens, conf, canvas, masked):
    del tokens, canvas, masked
    return _confidence_rank(conf), None

  def by_threshold(self, conf, tau, rank, eligible, masked):
    del rank
    forced = jax.nn.one_hot(jnp.argmax(conf, axis=-1), conf.shape[1], dtype=bool)  # [B, T]
    above = conf > tau[:, None]
    if eligible is not None:
      above = (above & eligible) | (tau[:, None] < 0)
    return masked & (above | forced)


class Distinct(Confidence):
  """'distinct': 'confidence', except that an open position whose proposed token is not yet in
  the block (at a closed position of the canvas) and is also proposed at a more confident open
  position waits for a later step (where it sees that token committed): one step never writes a
  token new to the block at two places. A token already in the block (a separator after its
  first) commits under the paper's rule. Not the paper's rule, and not a constraint: a token may
  still repeat across steps, and tau < 0 (the capped step) commits every position."""

  name = "distinct"

  def rank(self, tokens, conf, canvas, masked):
    t = conf.shape[1]
    rank = _confidence_rank(conf)
    repeat = _new_repeats(tokens, canvas, masked, rank)  # [B, T]
    # First occurrences in confidence order, then the repeats, then closed positions (the
    # ranking a count replay commits in).
    key = jnp.where(masked, jnp.where(repeat, rank + t, rank), rank + 2 * t)
    return jnp.argsort(jnp.argsort(key, axis=-1, stable=True), axis=-1, stable=True), ~repeat


class LeftToRight(CommitOrder):
  """'left_to_right': the leftmost open position plus the run of open positions right after it
  whose confidences are all above tau (AR order inside the block; tau = 1.0 writes the block
  exactly left to right)."""

  name = "left_to_right"
  left_to_right = True

  def rank(self, tokens, conf, canvas, masked):
    del tokens, conf, canvas
    return jnp.cumsum(masked, axis=-1) - 1, None  # [B, T] position among the open ones

  def by_threshold(self, conf, tau, rank, eligible, masked):
    del eligible
    t = conf.shape[1]
    fails = masked & (conf <= tau[:, None]) & (rank >= 1)
    first_fail = jnp.min(jnp.where(fails, rank, t), axis=-1)  # [B] >= 1
    return masked & (rank < first_fail[:, None])


BY_NAME = {o.name: o for o in (Confidence(), LeftToRight(), Distinct())}
ORDERS = tuple(BY_NAME)  # the recorded names
CONFIDENCE = BY_NAME["confidence"]


def lookup(where: str, name: str, order: "str | CommitOrder") -> CommitOrder:
  """The commit order named `order` (a CommitOrder is returned as is): the one check of a name.

  Raises:
    ValueError: `{where}: {name}=... not in ORDERS` (settings.check_choice).
  """
  if isinstance(order, CommitOrder):
    return order
  settings.check_choice(where, name, order, ORDERS)
  return BY_NAME[order]


def order_field(*, doc: str):
  """A decoder settings field holding a CommitOrder or its name (default CONFIDENCE), checked by
  `lookup`; the decoder's `check` then holds the object (decode_core.keep)."""
  return settings.value(CONFIDENCE, doc=doc, what=f"a CommitOrder or one of {ORDERS}",
                        check=lookup)


def capped_threshold(step: jax.Array, max_steps: jax.Array | int,
                     threshold: jax.Array | float) -> tuple[jax.Array, jax.Array]:
  """The threshold of a denoising step under a step cap (block decoding and drafting alike).

  Args:
    step: [B] int32 denoising steps done (in the block / the draft).
    max_steps: [] or [B] int the step cap: the step with index max_steps - 1 commits all.
    threshold: tau, [] or [B].

  Returns:
    (capped [B] bool, tau [B] f32: -1.0 (every open position) where capped, else threshold).
  """
  capped = step >= max_steps - 1
  return capped, jnp.where(capped, -1.0, threshold)


def select(
  tokens: jax.Array,
  logprob: jax.Array,
  canvas: jax.Array,
  masked: jax.Array,
  threshold: float | jax.Array,
  *,
  order: "str | CommitOrder" = CONFIDENCE,
  count: jax.Array | None = None,
) -> CommitResult:
  """The threshold rule on given proposals (the decoder proposes only where it needs to).

  Args:
    tokens: [B, T] int32 proposed tokens.
    logprob: [B, T] f32 their log-probs (confidence = exp(logprob)).
    canvas: [B, T] int32 current tokens.
    masked: [B, T] bool, positions still open.
    threshold: tau, a scalar or [B].
    order: which open positions commit first: a CommitOrder (Confidence, the paper's rule;
      LeftToRight; Distinct) or its name (looked up).
    count: optional [B] int: commit exactly the first `count` open positions in `order` instead
      of the threshold rule (0 commits nothing; the replay of a recorded commit schedule).

  Returns:
    CommitResult.
  """
  order = lookup("select", "order", order)
  conf = jnp.where(masked, jnp.exp(logprob), -jnp.inf)  # [B, T]
  tau = jnp.broadcast_to(jnp.asarray(threshold, jnp.float32), conf.shape[:1])
  rank, eligible = order.rank(tokens, conf, canvas, masked)
  if count is not None:
    committed = masked & (rank < jnp.asarray(count, jnp.int32)[:, None])
  else:
    committed = order.by_threshold(conf, tau, rank, eligible, masked)
  return CommitResult(
    canvas=jnp.where(committed, tokens, canvas),
    masked=masked & ~committed,
    committed=committed,
    logprob=logprob,
  )


def _new_repeats(tokens: jax.Array, canvas: jax.Array, masked: jax.Array,
                 rank: jax.Array) -> jax.Array:
  """[B, T] bool: open positions whose proposed token is not at a closed position of the row's
  canvas and is also proposed at an open position of lower rank (more confident)."""
  same = tokens[:, :, None] == tokens[:, None, :]  # [B, T(i), T(j)]
  before = masked[:, None, :] & (rank[:, None, :] < rank[:, :, None])
  present = jnp.any((tokens[:, :, None] == canvas[:, None, :]) & ~masked[:, None, :], axis=-1)
  return masked & ~present & jnp.any(same & before, axis=-1)
