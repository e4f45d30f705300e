"""Tests for gr2jax/data/embeddings.py: item text, TF-IDF + SVD embeddings, the .npy loader."""

import numpy as np
import pytest

from gr2jax.data import embeddings, raw
from gr2jax.data.records import Catalog


def _catalog(n: int = 40) -> Catalog:
  """A small synthetic catalogue: 4 brands x 2 category paths, some missing fields."""
  paths = [("Beauty", "Makeup", "Nails", "Nail Polish"), ("Beauty", "Hair Care", "Shampoos")]
  return Catalog(
      asins=tuple(f"A{i}" for i in range(n)),
      titles=tuple(None if i == 3 else f"{['red', 'blue'][i % 2]} polish shampoo item {i % 7}"
                   for i in range(n)),
      brands=tuple(None if i == 5 else f"brand{i % 4}" for i in range(n)),
      categories=tuple(paths[i % 2] for i in range(n)),
      prices=np.array([np.nan if i == 7 else 1.0 + i for i in range(n)], np.float32),
  )


def test_item_texts_fields_in_tiger_order():
  texts = embeddings.item_texts(_catalog())
  assert texts[0] == ("Title: red polish shampoo item 0. Price: $1.00 price_tier_1. Brand: brand0. "
                      "Categories: Beauty > Makeup > Nails > Nail Polish.")
  assert texts[3].startswith(f"Title: {embeddings.MISSING_TITLE}.")
  assert "Brand: unknown." in texts[5]
  assert "Price: price_unknown." in texts[7]


def test_item_embeddings_deterministic_unit_norm():
  catalog = _catalog()
  emb = embeddings.item_embeddings(catalog, dim=8, seed=0)
  assert emb.shape == (40, 8) and emb.dtype == np.float32
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(emb, embeddings.item_embeddings(catalog, dim=8, seed=0))
  # Items with the same brand and category path are closer than items differing in both.
  sim = emb @ emb.T
  assert sim[0, 4] > sim[0, 1]


def test_item_embeddings_dim_too_large():
  with pytest.raises(ValueError, match=r"data\.embedding_dim=500 .*--config\.data\.embedding_dim="):
    embeddings.item_embeddings(_catalog(), dim=500)


def test_item_embeddings_shipped_catalog():
  # At 32 dimensions: the SVD at the default 256 is ~4x the time and checks nothing more here
  # (the shipped catalogue's TF-IDF vocabulary is ~25k); the default-size embeddings are built
  # by scripts/test.sh's Table 2 smoke (its data build trains the RQ-VAE on them).
  emb = embeddings.item_embeddings(raw.load_catalog(), dim=32)
  assert emb.shape == (12_101, 32) and emb.dtype == np.float32
  assert np.isfinite(emb).all()
  np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)


def test_load_item_embeddings(tmp_path):
  good = np.random.default_rng(0).normal(size=(5, 3))
  np.save(tmp_path / "good.npy", good)
  loaded = embeddings.load_item_embeddings(tmp_path / "good.npy", 5)
  assert loaded.dtype == np.float32 and loaded.shape == (5, 3)

  cases = {
      "rows.npy": (good[:4], r"rows\.npy: .*shape \[num_items=5, d\], got \(4, 3\)"),
      "flat.npy": (good[:, 0], r"flat\.npy: .*got \(5,\)"),
      "int.npy": (np.ones((5, 3), np.int64), r"int\.npy: .*floating point, got dtype int64"),
      "nan.npy": (np.where(np.arange(5)[:, None] == 2, np.nan, good),
                  r"nan\.npy: .*NaN/inf in 1 rows \(first: item 2\)"),
  }
  for name, (array, message) in cases.items():
    np.save(tmp_path / name, array)
    with pytest.raises(ValueError, match=message):
      embeddings.load_item_embeddings(tmp_path / name, 5)
  with pytest.raises(ValueError, match=r"missing\.npy: cannot read"):
    embeddings.load_item_embeddings(tmp_path / "missing.npy", 5)
  (tmp_path / "text.npy").write_text("not an array")
  with pytest.raises(ValueError, match=r"text\.npy: cannot read"):
    embeddings.load_item_embeddings(tmp_path / "text.npy", 5)
