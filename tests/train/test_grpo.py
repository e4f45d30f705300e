"""GRPO: ratio 1 at theta = theta_old, the policy gradient, dropped groups, clipping."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.train import grpo


def test_group_advantages_z_score_and_zero_variance_dropped():
  rewards = np.array([[1.0, 0.0, 0.5, -1.0], [0.2, 0.2, 0.2, 0.2]])
  adv, keep = grpo.group_advantages(rewards)
  np.testing.assert_allclose(adv[0], (rewards[0] - rewards[0].mean()) / rewards[0].std(),
                             rtol=1e-6)
  assert keep.tolist() == [True, False]
  assert np.all(adv[1] == 0)


def test_components_are_normalised_apart_and_weighed():
  """Rank, validity and speed components: each z-scored inside its group on its own; a
  component without spread adds 0; a group whose weighted components all agree is dropped;
  weights (1, 0, 0) are the plain z-score of the first column."""
  rank = np.array([[1.0, 0.0, 0.5, -1.0], [0.2, 0.2, 0.2, 0.2], [0.3, 0.3, 0.3, 0.3]])
  valid = np.array([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
  speed = np.array([[3.0, 30.0, 3.0, 0.0], [2.0, 4.0, 2.0, 4.0], [1.0, 1.0, 1.0, 1.0]])
  rewards = np.stack([rank, valid, speed], axis=2)
  z = lambda r: (r - r.mean()) / r.std()
  adv, keep = grpo.group_advantages(rewards, (1.0, 0.5, 0.25))
  np.testing.assert_allclose(adv[0], z(rank[0]) + 0.5 * z(valid[0]) + 0.25 * z(speed[0]),
                             rtol=1e-6)
  np.testing.assert_allclose(adv[1], 0.25 * z(speed[1]), rtol=1e-6)  # rank, valid: no spread
  assert keep.tolist() == [True, True, False]
  assert np.all(adv[2] == 0)
  plain, plain_keep = grpo.group_advantages(rank)
  alone, alone_keep = grpo.group_advantages(rewards, (1.0, 0.0, 0.0))
  np.testing.assert_array_equal(alone, plain)  # a 0 weight neither moves nor keeps a group
  assert alone_keep.tolist() == plain_keep.tolist() == [True, False, False]
  for bad in ((1.0, -0.5, 0.0), (1.0, float("nan"), 0.0), (1.0, 0.0)):
    with pytest.raises(ValueError, match="weights"):
      grpo.group_advantages(rewards, bad)


def test_ratio_one_and_gradient_is_advantage_weighted_logprob_gradient():
  key = jax.random.key(0)
  theta = jax.random.normal(key, (3, 5, 7))  # [B, M, V] logits as parameters
  tokens = jax.random.randint(jax.random.key(1), (3, 5), 0, 7)
  adv = jnp.array([1.0, -0.5, 2.0])
  w = jnp.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], jnp.float32)
  logp_of = lambda t: jnp.take_along_axis(jax.nn.log_softmax(t), tokens[..., None], -1)[..., 0]
  old = logp_of(theta)

  def loss(t):
    total, weight, aux = grpo.policy_loss(logp_of(t), old, adv, w)
    return total / weight, aux

  (value, aux), grad = jax.value_and_grad(loss, has_aux=True)(theta)
  assert float(aux["ratio"]) == float(jnp.sum(w))  # every ratio is exactly 1
  expected = jax.grad(lambda t: -jnp.sum(logp_of(t) * adv[:, None] * w) / jnp.sum(w))(theta)
  np.testing.assert_allclose(grad, expected, atol=1e-6)
  np.testing.assert_allclose(value, -jnp.sum(adv[:, None] * w) / jnp.sum(w), rtol=1e-6)


def test_dropped_group_contributes_nothing():
  logp = jnp.log(jnp.array([[0.5, 0.4], [0.3, 0.2]]))
  w = jnp.array([[1.0, 1.0], [0.0, 0.0]])  # row 1 belongs to a dropped group
  g = jax.grad(lambda lp: grpo.policy_loss(lp, logp, jnp.array([1.0, 5.0]), w)[0])(logp)
  assert np.all(np.asarray(g[1]) == 0)


def test_clipping_engages_past_eps():
  old = jnp.log(jnp.full((1, 3), 0.5))
  new = jnp.log(jnp.array([[0.5 * 1.1, 0.5 * 1.5, 0.5 * 0.5]]))  # ratios 1.1, 1.5, 0.5
  w = jnp.ones((1, 3))
  total, _, aux = grpo.policy_loss(new, old, jnp.array([1.0]), w, eps_low=0.2, eps_high=0.2)
  # A > 0: min(rho A, clip(rho) A) = 1.1, 1.2 (clipped), 0.5 (unclipped is smaller)
  np.testing.assert_allclose(-total, 1.1 + 1.2 + 0.5, rtol=1e-5)
  assert float(aux["clip_frac"]) == 1.0
  grads = jax.grad(lambda lp: grpo.policy_loss(lp, old, jnp.array([1.0]), w)[0])(new)
  assert float(grads[0, 1]) == 0.0 and float(grads[0, 0]) != 0.0
