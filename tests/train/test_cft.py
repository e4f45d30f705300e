"""CFT loss on a tiny 1-layer model (fp32, CPU): masks, information flow, SFT equivalence."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.data.batches import Batch
from gr2jax.diffusion import commit, layout
from gr2jax.model import qwen3
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from gr2jax.train import cft

MASK, B = 63, 4
CONFIG = ModelConfig.tiny(
  vocab_size=64, num_layers=1, block_size=B, mask_token_id=MASK, eos_token_ids=(), pad_token_id=0
)
PROMPT_LENGTHS = np.array([8, 5], np.int32)
RESPONSE_LENGTHS = np.array([12, 10], np.int32)


def _batch():
  """Ragged prompts and responses; every real token id is unique within the batch."""
  prompts = np.zeros((2, 8), np.int32)
  prompts[0, :8] = np.arange(1, 9)
  prompts[1, :5] = np.arange(9, 14)
  responses = np.zeros((2, 12), np.int32)
  responses[0] = np.arange(20, 32)
  responses[1, :10] = np.arange(40, 50)
  real = np.arange(12)[None, :] < RESPONSE_LENGTHS[:, None]
  weights = np.where(real, 0.5, 0.0).astype(np.float32)
  weights[0, 9:12] = 1.0  # an "answer" span weighs lambda_o
  weights[1, 7:10] = 1.0
  return Batch(prompt_tokens=prompts, prompt_lengths=PROMPT_LENGTHS, response_tokens=responses,
               response_lengths=RESPONSE_LENGTHS, response_weights=weights,
               example_mask=np.array([True, True]))


@pytest.fixture(scope="module")
def params():
  return init_params(CONFIG, jax.random.key(0))


def _block_weights(batch, block, only=None):
  """The batch with weight only on response block `block` (optionally only its seed / rest)."""
  j = np.arange(12)
  keep = j // B == block
  if only == "seed":
    keep &= j % B == 0
  elif only == "rest":
    keep &= j % B != 0
  return batch.replace(response_weights=batch.response_weights * keep[None, :])


@jax.jit
def _loss_and_embed_grad(params, batch, noisy):
  """(cft_loss_from_noisy's outputs, d loss_sum / d embed [V, D]): one compile for the module."""
  def f(p):
    loss_sum, weight, aux = cft.cft_loss_from_noisy(p, batch, noisy, config=CONFIG)
    return loss_sum, (loss_sum, weight, aux)

  grads, out = jax.grad(f, has_aux=True)(params)
  return out, grads["embed"]


def _embed_grad(params, batch, noisy):
  return np.asarray(_loss_and_embed_grad(params, batch, noisy)[1])


_targets = jax.jit(cft.cft_targets, static_argnums=0)
_sample = jax.jit(cft.sample_noisy, static_argnames=("width", "block_size", "complementary",
                                                    "rate_power"))


def _row_norms(grad, ids):
  return np.linalg.norm(grad[np.asarray(ids)], axis=-1)


def test_seeds_never_masked_and_complementary_pairs_supervise_every_token_once():
  lengths = jnp.asarray(RESPONSE_LENGTHS)
  j = np.arange(12)
  real = j[None, :] < RESPONSE_LENGTHS[:, None]
  rates = []
  for i in range(8):
    noisy = np.asarray(_sample(jax.random.key(i), lengths, width=12, block_size=B))
    assert noisy.shape == (2, 2, 12)
    assert not noisy[:, :, j % B == 0][np.broadcast_to(real[:, None], noisy.shape)[
      :, :, j % B == 0]].any()
    count = noisy.sum(axis=1)  # streams masking each position
    np.testing.assert_array_equal(count[real & (j % B != 0)], 1)
    assert noisy[~np.broadcast_to(real[:, None], noisy.shape)].all()  # padding = mask tokens
    _, supervised, _ = _targets(CONFIG, _batch(), noisy)
    np.testing.assert_array_equal(supervised, real)
    rates.append(noisy[:, 0][real & (j % B != 0)].mean())
  assert 0.3 < np.mean(rates) < 0.7  # E[t] = (1 + eps) / 2
  single = _sample(jax.random.key(0), lengths, width=12, block_size=B, complementary=False)
  assert single.shape == (2, 1, 12)


def test_normalisation_is_the_weighted_mean_over_supervised_tokens(params):
  batch = _batch()
  noisy = _sample(jax.random.key(3), jnp.asarray(RESPONSE_LENGTHS), width=12, block_size=B)
  (loss_sum, weight, aux), _ = _loss_and_embed_grad(params, batch, noisy)
  # Complementary pairs supervise every real token once: the weight is SFT's sum of weights.
  np.testing.assert_allclose(weight, batch.response_weights.sum(), rtol=1e-6)
  np.testing.assert_allclose(aux["seed_nll"] + aux["noisy_nll"], loss_sum, rtol=1e-5)
  assert abs(float(loss_sum / weight) - np.log(63)) < 1.0  # ~uniform at init
  half = batch.replace(example_mask=np.array([True, False]))
  (_, weight0, _), _ = _loss_and_embed_grad(params, half, noisy)
  np.testing.assert_allclose(weight0, batch.response_weights[0].sum(), rtol=1e-6)


def test_block_loss_ignores_later_blocks(params):
  batch = _batch()
  noisy = _sample(jax.random.key(1), jnp.asarray(RESPONSE_LENGTHS), width=12, block_size=B)
  for block in (0, 1):
    grad = _embed_grad(params, _block_weights(batch, block), noisy)
    later = batch.response_tokens[:, (block + 1) * B:]
    later = later[later > 0]
    assert _row_norms(grad, later).max() == 0.0
    assert _row_norms(grad, batch.prompt_tokens[0]).min() > 0  # control: prompt matters


def test_block_loss_ignores_its_own_clean_copy_except_the_seed(params):
  batch = _batch()
  j = np.arange(12)
  block = 1
  own = (j // B == block) & (j % B != 0)
  noisy = np.zeros((2, 2, 12), bool)
  noisy[:, 0] = own  # stream 0 masks block 1's non-seeds, stream 1 (the complement) shows them
  noisy[:, 1] = (j % B != 0) & ~own
  noisy |= j[None, None, :] >= RESPONSE_LENGTHS[:, None, None]
  grad = _embed_grad(params, _block_weights(batch, block), noisy)
  resp = batch.response_tokens
  # Block 1's non-seed tokens are visible only in the clean stream (and in stream 1's block 1,
  # which scores nothing of block 1): no gradient reaches them.
  assert _row_norms(grad, resp[:, own].ravel()).max() == 0.0
  # Its seed is visible in the noisy block, and its seed loss reads the clean block 0.
  assert _row_norms(grad, resp[:, block * B]).min() > 0
  assert _row_norms(grad, resp[:, :B].ravel()).min() > 0
  # The seed path: block 2's seed is predicted from the clean copy of block 1.
  grad2 = _embed_grad(params, _block_weights(batch, block + 1, only="seed"), noisy)
  assert _row_norms(grad2, resp[:, own].ravel()).min() > 0
  # Perturbing block 1's clean copy (inputs only) leaves block 1's log-probs unchanged.
  inputs = cft.cft_inputs(CONFIG, batch, noisy)
  queries, supervised, _ = cft.cft_targets(CONFIG, batch, noisy)
  p = batch.prompt_tokens.shape[1]
  clean_slots = p + np.flatnonzero(j // B == block)
  other = inputs.tokens.at[:, clean_slots].set(7)
  score = jax.jit(layout.score, static_argnums=1)
  base, _ = score(params, CONFIG, inputs, queries, resp)
  pert, _ = score(params, CONFIG, inputs._replace(tokens=other), queries, resp)
  upto = j < (block + 1) * B
  np.testing.assert_allclose(pert[:, upto], base[:, upto], atol=1e-6)
  assert not np.allclose(pert[:, (block + 1) * B], base[:, (block + 1) * B])


def test_block_size_one_equals_sft(params):
  config = dataclasses.replace(CONFIG, block_size=1)
  batch = _batch()
  loss_fn = jax.jit(functools.partial(cft.cft_loss, config=config))
  loss_sum, weight, _ = loss_fn(params, batch, jax.random.key(0))
  # Plain AR weighted cross-entropy on the right-padded [prompt | response] rows, the mask token
  # removed from the distribution (commit.token_log_probs, what every diffusion stage scores).
  seqs = np.zeros((2, 20), np.int32)
  for row in range(2):
    pl, rl = PROMPT_LENGTHS[row], RESPONSE_LENGTHS[row]
    seqs[row, : pl + rl] = np.concatenate(
      [batch.prompt_tokens[row, :pl], batch.response_tokens[row, :rl]]
    )
  logits, _ = jax.jit(qwen3.forward, static_argnums=1)(params, config, jnp.asarray(seqs))
  logp = np.asarray(commit.token_log_probs(logits, MASK, 0.0))  # [2, 20, V], causal
  total, total_w = 0.0, 0.0
  for row in range(2):
    pl, rl = PROMPT_LENGTHS[row], RESPONSE_LENGTHS[row]
    w = batch.response_weights[row, :rl]
    picked = logp[row, pl - 1 + np.arange(rl), seqs[row, pl : pl + rl]]
    total += float(-(picked * w).sum())
    total_w += float(w.sum())
  np.testing.assert_allclose(loss_sum, total, rtol=1e-5)
  np.testing.assert_allclose(weight, total_w, rtol=1e-6)


def test_rate_power_shifts_the_masking_rate():
  lengths = jnp.full((64,), 12, jnp.int32)
  j = np.arange(12)

  def mean_rate(power):
    noisy = np.asarray(_sample(jax.random.key(0), lengths, width=12, block_size=B,
                               complementary=False, rate_power=power))
    return noisy[:, 0][:, j % B != 0].mean()

  # E[t] = eps + (1 - eps) p / (p + 1): ~1/2 at p = 1, ~3/4 at p = 3, ~1/4 at p = 1/3.
  assert mean_rate(3.0) > 0.65 and mean_rate(1 / 3) < 0.35 and 0.4 < mean_rate(1.0) < 0.6
  with pytest.raises(ValueError, match="rate_power=0.0 must be > 0"):
    cft.sample_noisy(jax.random.key(0), lengths, width=12, block_size=B, rate_power=0.0)


def test_certainty_term_is_the_entropy_of_the_masked_tokens_predicted_right(params):
  """certainty > 0 adds w * H(softmax(log p / 0.5)) over the masked (non-seed), right-predicted
  supervised tokens; 0 leaves the loss as it was. With a zero output layer every logit ties, the
  arg-max is token 0 and H = log(63) (the mask token removed): responses of token 0 are all
  predicted right."""
  batch = _batch()
  noisy = _sample(jax.random.key(3), jnp.asarray(RESPONSE_LENGTHS), width=12, block_size=B)
  plain = cft.cft_loss_from_noisy(params, batch, noisy, config=CONFIG)
  off = cft.cft_loss_from_noisy(params, batch, noisy, config=CONFIG, certainty=0.0)
  assert float(off[0]) == float(plain[0]) and "certainty" not in off[2]
  flat = dict(params, lm_head=jnp.zeros_like(params["lm_head"]))
  zeros = batch.replace(response_tokens=np.zeros_like(batch.response_tokens))
  loss, weight, aux = cft.cft_loss_from_noisy(flat, zeros, noisy, config=CONFIG, certainty=2.0)
  base = cft.cft_loss_from_noisy(flat, zeros, noisy, config=CONFIG)
  queries, supervised, seed = _targets(CONFIG, zeros, noisy)
  masked_w = np.sum(np.where(np.asarray(supervised & ~seed), zeros.response_weights, 0.0))
  np.testing.assert_allclose(aux["certainty"], np.log(63) * masked_w, rtol=1e-5)
  np.testing.assert_allclose(loss, base[0] + 2.0 * aux["certainty"], rtol=1e-6)
  np.testing.assert_allclose(weight, base[1])
  logp = jnp.log(jnp.array([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
  np.testing.assert_allclose(cft.certainty_entropy(logp), [np.log(2), 0.0], atol=1e-6)


def test_certainty_gradient_is_finite_with_the_mask_column_at_minus_inf(params):
  """The mask token's log-prob is -inf in every row: the entropy's gradient must still be finite
  (exp(-inf) * -inf is nan, and a jnp.where around it does not stop the nan reaching the
  gradient), and equal the analytic one, -sum_v q_v (log q_v + H) d log q_v, on a finite row."""
  batch = _batch()
  noisy = _sample(jax.random.key(3), jnp.asarray(RESPONSE_LENGTHS), width=12, block_size=B)

  def f(p):
    return cft.cft_loss_from_noisy(p, batch, noisy, config=CONFIG, certainty=2.0)[0]

  grads = jax.grad(f)(params)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  row = jnp.array([0.3, -1.0, 2.0, -jnp.inf])
  g = jax.grad(lambda x: cft.certainty_entropy(jax.nn.log_softmax(x)))(row)
  t = cft.CERTAINTY_TEMPERATURE
  finite = row[:3]
  q = jax.nn.softmax(jax.nn.log_softmax(finite) / t)
  h = -jnp.sum(q * jnp.log(q))
  # dH/dz for H(softmax(z)), z = log_softmax(x) / t; dz/dx = (I - softmax(x) 1^T) / t.
  dh_dz = -q * (jnp.log(q) + h)
  expected = (dh_dz - jax.nn.softmax(finite) * dh_dz.sum()) / t
  np.testing.assert_allclose(g[:3], expected, rtol=1e-5, atol=1e-6)
  assert g[3] == 0.0
