"""Tests for gr2jax/data/rqvae.py: losses, k-means, training, collision token, SID files."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax.data import embeddings, raw, rqvae

TINY = rqvae.RQVAEConfig(hidden=(32, 16), latent_dim=8, codebook_size=16, epochs=12,
                         batch_size=128, learning_rate=3e-3, kmeans_iters=10, reset_every=4)


def _clustered(n: int = 600, dim: int = 16, clusters: int = 24, seed: int = 0) -> np.ndarray:
  """[n, dim] unit vectors around `clusters` random centres."""
  rng = np.random.default_rng(seed)
  centres = rng.normal(size=(clusters, dim))
  x = centres[rng.integers(0, clusters, n)] + 0.3 * rng.normal(size=(n, dim))
  return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


@pytest.fixture(scope="module")
def trained():
  x = _clustered()
  params, stats = rqvae.train_rqvae(x, TINY, seed=0)
  return x, params, stats


def test_param_shapes_mirror_encoder():
  params = jax.eval_shape(lambda: rqvae.init_params(jax.random.key(0), rqvae.RQVAEConfig(), 256))
  shapes = jax.tree.map(jnp.shape, params)
  assert [shapes["encoder"][f"dense_{i}"]["kernel"] for i in range(4)] == [
      (256, 512), (512, 256), (256, 128), (128, 32)]
  assert [shapes["decoder"][f"dense_{i}"]["kernel"] for i in range(4)] == [
      (32, 128), (128, 256), (256, 512), (512, 256)]
  assert shapes["codebooks"] == (3, 256, 32)


def test_residual_quantize_codes_and_loss():
  books = jnp.array([[[0.0, 0.0], [4.0, 0.0]], [[0.0, 1.0], [0.0, -1.0]]])  # [L=2, K=2, d=2]
  z = jnp.array([[4.0, 1.5], [0.5, -1.0]])
  codes, quantized, residuals, loss = rqvae.residual_quantize(books, z, beta=0.25)
  np.testing.assert_array_equal(codes, [[1, 0], [0, 1]])
  np.testing.assert_allclose(quantized, [[4.0, 1.0], [0.0, -1.0]])
  np.testing.assert_allclose(residuals[1], [[0.0, 1.5], [0.5, -1.0]])
  # Level 0 errors: 1.5^2 and 0.5^2 + 1; level 1: 0.5^2 and 0.5^2. (1 + beta) * mean over batch.
  expected = 1.25 * ((2.25 + 1.25) / 2 + (0.25 + 0.25) / 2)
  np.testing.assert_allclose(loss, expected, rtol=1e-6)


def test_loss_gradients_straight_through_and_stop_gradient():
  config = dataclasses.replace(TINY, num_levels=2)
  x = jnp.asarray(_clustered(64))
  params = rqvae.init_params(jax.random.key(1), config, x.shape[1])
  params["codebooks"] = rqvae.kmeans_init_codebooks(params, config, x, jax.random.key(2))
  (_, aux), grads = jax.jit(jax.value_and_grad(
      lambda p: rqvae.loss_fn(p, config, x), has_aux=True))(params)
  # The encoder gets gradients from the reconstruction (straight-through) and the commitment.
  assert float(jnp.abs(grads["encoder"]["dense_0"]["kernel"]).sum()) > 0
  # The codebook gradient is only the codebook term: 2 (e - sg[r]) / B summed over its items.
  z = rqvae.encode(params, config, x)
  code0 = aux["codes"][:, 0]
  e0 = params["codebooks"][0][code0]
  expected = jnp.zeros_like(params["codebooks"][0]).at[code0].add(2 * (e0 - z) / x.shape[0])
  np.testing.assert_allclose(grads["codebooks"][0], expected, atol=1e-5)


def test_kmeans_finds_separated_clusters():
  rng = np.random.default_rng(0)
  centres = np.array([[10.0, 0.0], [0.0, 10.0], [-10.0, -10.0]])
  points = jnp.asarray(centres.repeat(50, 0) + 0.1 * rng.normal(size=(150, 2)), jnp.float32)
  found = np.asarray(rqvae.kmeans(jax.random.key(3), points, 3, iters=10))
  found = found[np.argsort(found[:, 0])]
  np.testing.assert_allclose(found, centres[np.argsort(centres[:, 0])], atol=0.1)


def test_train_rqvae_stats_and_unique_sids(trained):
  x, params, stats = trained
  codes = rqvae.encode_codes(params, TINY, x)
  assert codes.shape == (600, 3) and codes.dtype == np.int32
  assert codes.min() >= 0 and codes.max() < TINY.codebook_size
  assert stats == {**stats, **rqvae.code_stats(codes, TINY.codebook_size)}
  assert all(u >= 0.75 for u in stats["utilisation"]), stats
  assert stats["distinct_prefixes"][0] <= stats["distinct_prefixes"][1] <= stats[
      "distinct_prefixes"][2]
  assert len(stats["loss_history"]) == TINY.epochs
  assert stats["loss_history"][-1] < stats["loss_history"][0]
  assert stats["recon_loss"] > 0 and stats["train_seconds"] > 0
  sids = rqvae.semantic_ids(codes)
  assert sids.shape == (600, 4) and len(np.unique(sids, axis=0)) == 600
  assert sids[:, 3].max() + 1 == stats["max_collisions"]


def test_train_rqvae_deterministic(trained):
  x, params, _ = trained
  params2, _ = rqvae.train_rqvae(x, TINY, seed=0)
  np.testing.assert_array_equal(rqvae.encode_codes(params, TINY, x),
                                rqvae.encode_codes(params2, TINY, x))
  params3, _ = rqvae.train_rqvae(x, TINY, seed=1)
  assert not np.array_equal(rqvae.encode_codes(params, TINY, x),
                            rqvae.encode_codes(params3, TINY, x))


def test_train_rqvae_bad_input():
  with pytest.raises(ValueError, match="finite float"):
    rqvae.train_rqvae(np.full((100, 4), np.nan, np.float32), TINY)
  with pytest.raises(ValueError, match=r"data\.rqvae\.codebook_size=16 exceeds the 10 items.*"
                     r"codebook_size=10 or less"):
    rqvae.train_rqvae(_clustered(10), TINY)
  with pytest.raises(ValueError, match="optimizer"):
    rqvae.RQVAEConfig(optimizer="sgd")


def test_semantic_ids_enumerate_collisions_in_index_order():
  codes = np.array([[1, 2, 3], [0, 0, 0], [1, 2, 3], [1, 2, 4], [1, 2, 3]])
  np.testing.assert_array_equal(rqvae.semantic_ids(codes)[:, 3], [0, 0, 1, 0, 2])
  np.testing.assert_array_equal(rqvae.semantic_ids(codes)[:, :3], codes)
  stats = rqvae.code_stats(codes, codebook_size=8)
  assert stats["distinct_prefixes"] == [2, 2, 3]
  assert stats["utilisation"] == [2 / 8, 2 / 8, 3 / 8]
  assert stats["collision_rate"] == pytest.approx(2 / 5) and stats["max_collisions"] == 3
  with pytest.raises(ValueError, match=r"3 items share codes \[1, 2, 3\].*vocabulary 2"):
    rqvae.semantic_ids(codes, max_collisions=2)


def test_sid_files_round_trip_and_errors(tmp_path):
  sids = rqvae.semantic_ids(np.array([[1, 2, 3], [1, 2, 3], [0, 5, 7]]))
  rqvae.save_sids(tmp_path / "sids.npy", sids)
  np.testing.assert_array_equal(rqvae.load_sids(tmp_path / "sids.npy", num_items=3), sids)
  with pytest.raises(ValueError, match=r"sids\.npy: SIDs have 3 rows, expected num_items=4"):
    rqvae.load_sids(tmp_path / "sids.npy", num_items=4)
  np.save(tmp_path / "dup.npy", np.array([[1, 2, 3, 0], [1, 2, 3, 0]]))
  with pytest.raises(ValueError, match=r"dup\.npy: SIDs are not unique"):
    rqvae.load_sids(tmp_path / "dup.npy")
  np.save(tmp_path / "float.npy", np.zeros((2, 4)))
  with pytest.raises(ValueError, match=r"float\.npy: SIDs must be an integer"):
    rqvae.load_sids(tmp_path / "float.npy")
  with pytest.raises(ValueError, match=r"missing\.npy: cannot read"):
    rqvae.load_sids(tmp_path / "missing.npy")


@pytest.mark.slow
def test_real_data_sids_unique_and_deterministic():
  """The default pipeline on the shipped catalogue: 12,101 unique SIDs, same seed -> same SIDs."""
  emb = embeddings.item_embeddings(raw.load_catalog())
  config = rqvae.RQVAEConfig()
  runs = [rqvae.semantic_ids(rqvae.encode_codes(p, config, emb))
          for p, _ in (rqvae.train_rqvae(emb, config, seed=0) for _ in range(2))]
  assert runs[0].shape == (12_101, 4) and len(np.unique(runs[0], axis=0)) == 12_101
  np.testing.assert_array_equal(runs[0], runs[1])
