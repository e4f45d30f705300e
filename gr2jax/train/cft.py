"""Masked block-diffusion fine-tuning (CFT) of the converted model; Diffusion-GR2, arXiv
2607.01170, CFT.

The paper gives the stage (masked-diffusion objective on the assistant message, GR2's decoupled
weights, 3 epochs, B = 32) but not the masking schedule; ours, after Fast-dLLM v2 and BD3-LM
(the BD3-LM / Fast-dLLM v2 / SDAR x_t + x_0 layout):

  - Per response block b a masking rate t_b ~ U(eps, 1) (eps = 1e-3); every position of the block
    except its seed (block index 0) is masked with probability t_b. `rate_power` p != 1 draws
    t_b = eps + (1 - eps) u^(1/p), u ~ U(0, 1) instead (density ~ t^(p-1): p > 1 favours heavily
    masked blocks, p < 1 lightly masked ones; p = 1 is the uniform default). The decoder never
    sees a seed masked: it is proposed by the previous forward and starts the block clean.
  - Complementary masking (on by default): a second noisy stream masks exactly the block
    positions the first leaves visible. Both streams share one prompt and one clean stream in
    ONE sequence of the shared layout (gr2jax/diffusion/layout.py, K = 2): every response token
    is supervised exactly once per pair. Fast-dLLM v2 puts the copy on the batch axis instead,
    which recomputes the prompt and the clean response.
  - Response slots after the response (padding up to the bucket and to a multiple of B) hold
    the mask token in every noisy stream and carry no loss (Fast-dLLM v2's "+pad" mask padding;
    the decoder's last block also holds masks after the stop token).
  - AR token shift: a masked token j is predicted by noisy query j - 1 (same block). A block's
    seed is predicted from the clean stream (the last token of the previous clean block, or the
    prompt's last token for block 0): exactly how the decoder seeds a block. No other clean query
    and no unmasked noisy position carries a loss; the last noisy position of a block does not
    predict the next block's seed (an open point of the published recipes: dropped, as the decoder
    never uses it).
  - Log-probs through `commit.token_log_probs` (mask token suppressed, temperature 1): training,
    decoding and replay share one distribution.

Certainty forcing (optional, `certainty` > 0; dParallel, arXiv 2509.26488): the loss adds
certainty * sum_j w_j H(softmax(log p_j / 0.5)) over the masked (non-seed) supervised tokens the
model already predicts right (arg-max = token): it sharpens what is already right, so a
threshold decoder commits it sooner, and leaves wrong predictions to the cross-entropy. The
self-distillation objective trains it on the model's own slow-decode answers
(train/self_distill.py).

Normalisation (our choice; the paper is silent): the plain weighted mean over supervised
tokens, loss = sum_j w_j * nll_j / sum_j w_j with w_j = lambda_r on reasoning, lambda_o on answer
tokens (`Batch.response_weights`), no 1/t weighting (Fast-dLLM v2; SDAR / BD3-LM use 1/t). With
complementary masks every real response token is supervised once, so the weight is exactly SFT's
sum_j w_j and the loss is on SFT's scale. With B = 1 every token is a seed read from the causal
clean stream: CFT is then exactly the SFT loss (tested).
"""

import jax
import jax.numpy as jnp

from gr2jax.data.batches import Batch
from gr2jax.diffusion import layout
from gr2jax.model.config import ModelConfig

EPS = 1e-3
# The Batch fields cft_loss reads.
FIELDS = ("prompt_tokens", "prompt_lengths", "response_tokens", "response_lengths",
          "response_weights", "example_mask")


def sample_noisy(
  key: jax.Array,
  response_lengths: jax.Array,
  *,
  width: int,
  block_size: int,
  eps: float = EPS,
  complementary: bool = True,
  rate_power: float = 1.0,
) -> jax.Array:
  """Samples CFT's noisy streams: per-block rate t ~ U(eps, 1), seeds never masked.

  Args:
    key: PRNG key.
    response_lengths: [B] int real response lengths.
    width: M, the response width of the batch.
    block_size: B (config.block_size).
    eps: lower bound of the masking rate.
    complementary: add the inverted copy (every real non-seed position masked in exactly one
      of the two streams).
    rate_power: p of the rate distribution t = eps + (1 - eps) u^(1/p) (1 = U(eps, 1)).

  Returns:
    [B, K, M] bool, True = mask token; K = 2 with complementary, else 1; K = 0 when
    block_size == 1 (every token is a seed: nothing can be masked).
  """
  b = response_lengths.shape[0]
  if block_size == 1:
    return jnp.zeros((b, 0, width), bool)
  if rate_power <= 0:
    raise ValueError(f"sample_noisy: rate_power={rate_power} must be > 0")
  r = layout.padded_width(width, block_size)
  key_t, key_u = jax.random.split(key)
  if rate_power == 1:
    rate = jax.random.uniform(key_t, (b, r // block_size), minval=eps, maxval=1.0)
  else:
    u = jax.random.uniform(key_t, (b, r // block_size))
    rate = eps + (1.0 - eps) * u ** (1.0 / rate_power)
  drawn = jax.random.uniform(key_u, (b, r)) < jnp.repeat(rate, block_size, axis=1)  # [B, R]
  j = jnp.arange(r, dtype=jnp.int32)[None, :]
  real = j < jnp.asarray(response_lengths, jnp.int32)[:, None]
  maskable = real & (j % block_size != 0)
  streams = [maskable & drawn] + ([maskable & ~drawn] if complementary else [])
  return jnp.stack([s | ~real for s in streams], axis=1)[:, :, :width]


def cft_inputs(config: ModelConfig, batch: Batch, noisy: jax.Array) -> layout.Layout:
  """The shared two-stream layout of a training batch under the given noisy streams.

  Args:
    config: the model.
    batch: the training batch (prompt_tokens [B, P], prompt_lengths [B], response_tokens [B, M],
      response_lengths [B]).
    noisy: [B, K, M] bool (sample_noisy).

  Returns:
    layout.Layout.
  """
  return layout.two_stream_inputs(
    config, batch.prompt_tokens, batch.prompt_lengths, batch.response_tokens,
    batch.response_lengths, noisy,
  )


def cft_targets(config: ModelConfig, batch: Batch, noisy: jax.Array):
  """Where each response token is read and whether it is supervised.

  A seed is read from the clean stream; any other token from the first noisy stream that masks
  it; a token masked in no stream, or after the response, is not supervised.

  Args:
    config: the model.
    batch: the training batch (see cft_inputs).
    noisy: [B, K, M] bool.

  Returns:
    (queries [B, M] int32 layout query indices, supervised [B, M] bool, seed [1, M] bool).
  """
  prompt_lengths = jnp.asarray(batch.prompt_lengths, jnp.int32)
  p = batch.prompt_tokens.shape[1]
  m = batch.response_tokens.shape[1]
  j = jnp.arange(m, dtype=jnp.int32)[None, :]
  seed = j % config.block_size == 0
  real = j < jnp.asarray(batch.response_lengths, jnp.int32)[:, None]
  if noisy.shape[1]:
    masked = jnp.any(noisy, axis=1) & ~seed  # [B, M]
    first = jnp.argmax(noisy, axis=1).astype(jnp.int32)
  else:
    masked = jnp.zeros_like(real)
    first = jnp.zeros(real.shape, jnp.int32)
  stream = jnp.where(seed, layout.CLEAN_STREAM, first)
  queries = layout.prediction_queries(
    stream, prompt_lengths, p, layout.padded_width(m, config.block_size)
  )
  return queries, (seed | masked) & real, seed


# dParallel's certainty temperature: the entropy is that of softmax(log p / 0.5).
CERTAINTY_TEMPERATURE = 0.5


def certainty_entropy(log_probs: jax.Array) -> jax.Array:
  """H(softmax(log_probs / CERTAINTY_TEMPERATURE)) per position (module docstring).

  Args:
    log_probs: [..., V] f32 log-probs (the mask token at -inf).

  Returns:
    [...] f32 entropies (a -inf column counts 0).
  """
  sharp = jax.nn.log_softmax(log_probs / CERTAINTY_TEMPERATURE, axis=-1)
  # exp(-inf) * -inf is nan, and so is its gradient even where a jnp.where drops it: the -inf
  # column's log-prob is replaced by 0 before the product (its probability is 0 either way).
  finite = jnp.where(jnp.isfinite(sharp), sharp, 0.0)
  return -jnp.sum(jnp.exp(sharp) * finite, axis=-1)


def cft_loss_from_noisy(params: dict, batch: Batch, noisy: jax.Array, *, config: ModelConfig,
                        certainty: float = 0.0):
  """CFT loss under given noisy streams (module docstring), as (sum, weight, aux sums).

  Args:
    params: the param pytree.
    batch: prompt_tokens [B, P], prompt_lengths [B], response_tokens [B, M], response_lengths
      [B], response_weights [B, M] f32 (lambda_r / lambda_o, 0 on padding), example_mask [B].
    noisy: [B, K, M] bool.
    config: the model.
    certainty: the certainty-forcing weight (module docstring; 0 = off).

  Returns:
    (loss_sum = sum_j w_j nll_j over supervised tokens (+ the certainty term), weight = sum_j
     w_j over them, aux {'seed_nll', 'noisy_nll', 'accuracy'}: the same weighted sums split by
     where the token is read, and sum_j w_j [arg-max == token]; with certainty, 'certainty':
     sum_j w_j H_j over the masked tokens predicted right).
  """
  inputs = cft_inputs(config, batch, noisy)
  queries, supervised, seed = cft_targets(config, batch, noisy)
  targets = jnp.asarray(batch.response_tokens, jnp.int32)
  logp, full = layout.score(params, config, inputs, queries, targets, return_log_probs=True)
  w = jnp.asarray(batch.response_weights, jnp.float32)
  w = w * supervised * jnp.asarray(batch.example_mask, jnp.float32)[:, None]  # [B, M]
  nll = -logp * w
  correct = jnp.argmax(full, axis=-1) == targets
  aux = {
    "seed_nll": jnp.sum(jnp.where(seed, nll, 0.0)),
    "noisy_nll": jnp.sum(jnp.where(seed, 0.0, nll)),
    "accuracy": jnp.sum(correct * w),
  }
  if not certainty:
    return jnp.sum(nll), jnp.sum(w), aux
  entropy = jnp.sum(jnp.where(correct & ~seed, certainty_entropy(full), 0.0) * w)
  aux["certainty"] = entropy
  return jnp.sum(nll) + certainty * entropy, jnp.sum(w), aux


def cft_loss(
  params: dict,
  batch: Batch,
  key: jax.Array,
  *,
  config: ModelConfig,
  eps: float = EPS,
  complementary: bool = True,
  rate_power: float = 1.0,
  certainty: float = 0.0,
):
  """The CFT loss of a training batch (train-step contract: bind config with functools.partial).

  Args:
    params: the param pytree.
    batch: the training batch (see cft_loss_from_noisy).
    key: PRNG key of the masks.
    config: the model (config.block_size is the block size).
    eps: lower bound of the per-block masking rate.
    complementary: train the inverted copy too.
    rate_power: the masking-rate distribution (sample_noisy; 1 = uniform).
    certainty: the certainty-forcing weight (module docstring; 0 = off).

  Returns:
    (loss_sum f32[], weight f32[], aux dict of f32[] sums); loss = loss_sum / weight.
  """
  noisy = sample_noisy(
    key, jnp.asarray(batch.response_lengths, jnp.int32),
    width=batch.response_tokens.shape[1], block_size=config.block_size, eps=eps,
    complementary=complementary, rate_power=rate_power,
  )
  return cft_loss_from_noisy(params, batch, noisy, config=config, certainty=certainty)
