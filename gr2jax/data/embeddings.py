"""Item content embeddings: the input of the RQ-VAE (TIGER; TIGER, Rajput et al., NeurIPS 2023).

TIGER embeds each item's "title, price, brand, category" text with Sentence-T5. We cannot load a
sentence encoder offline, so the default is a deterministic stand-in built from the shipped
metadata: TF-IDF over word 1-2 grams of the same text, TruncatedSVD to `dim` dimensions (latent
semantic analysis), then L2 normalisation. Precomputed embeddings (e.g. Sentence-T5 computed on
another box) plug in through `load_item_embeddings` (`--item_embeddings=FILE.npy`).
"""

import math
import pathlib

import numpy as np
from sklearn.decomposition import TruncatedSVD
from sklearn.feature_extraction.text import TfidfVectorizer

from gr2jax.data.records import Catalog

MISSING_TITLE = "(no title)"


def _price_text(price: float) -> str:
  """'$5.04 price_tier_2' (tier = floor(log2(1 + price))), or 'price_unknown' when NaN.

  The tier word gives the bag-of-words model a coarse price signal that the raw number (split into
  unrelated digit tokens) does not; Sentence-T5 reads the number directly.
  """
  if math.isnan(price):
    return "price_unknown"
  return f"${price:.2f} price_tier_{math.floor(math.log2(1.0 + price))}"


def item_texts(catalog: Catalog) -> list[str]:
  """The text embedded for each item: TIGER's fields, in order title, price, brand, category.

  Args:
    catalog: the item catalogue.

  Returns:
    [I] strings, e.g. 'Title: WAWO 15 Color ... Palette. Price: $5.04 price_tier_2. Brand: COKA.
    Categories: Beauty > Makeup > Face > Concealers & Neutralizers.' Missing titles render as
    '(no title)', missing brands as 'unknown'.
  """
  return [
      f"Title: {title if title is not None else MISSING_TITLE}. "
      f"Price: {_price_text(float(price))}. "
      f"Brand: {brand if brand is not None else 'unknown'}. "
      f"Categories: {' > '.join(categories)}."
      for title, price, brand, categories in zip(
          catalog.titles, catalog.prices, catalog.brands, catalog.categories, strict=True)
  ]


def item_embeddings(catalog: Catalog, dim: int = 256, seed: int = 0) -> np.ndarray:
  """Deterministic TF-IDF + TruncatedSVD + L2 item embeddings (the offline Sentence-T5 stand-in).

  TF-IDF over lower-cased word 1-2 grams seen in at least 2 items, sublinear tf; randomized SVD
  with `random_state=seed`; each row scaled to unit L2 norm.

  Args:
    catalog: the item catalogue.
    dim: embedding dimension (number of SVD components).
    seed: SVD random state.

  Returns:
    float32 [I, dim], unit-norm rows.
  """
  texts = item_texts(catalog)
  tfidf = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, dtype=np.float32)
  counts = tfidf.fit_transform(texts)  # [I, vocab] sparse
  if dim >= min(counts.shape):
    raise ValueError(f"data.embedding_dim={dim} must be < min(items, TF-IDF vocabulary) = "
                     f"{min(counts.shape)} (TF-IDF matrix {counts.shape}): set "
                     f"--config.data.embedding_dim={min(counts.shape) - 1} or less")
  svd = TruncatedSVD(n_components=dim, algorithm="randomized", n_iter=7, random_state=seed)
  emb = svd.fit_transform(counts).astype(np.float32)  # [I, dim]
  norms = np.linalg.norm(emb, axis=1, keepdims=True)
  return emb / np.maximum(norms, 1e-12)


def load_item_embeddings(path: str | pathlib.Path, num_items: int) -> np.ndarray:
  """Loads precomputed item embeddings (`--item_embeddings=FILE.npy`), rows in item-index order.

  Args:
    path: a `.npy` file holding a floating array [num_items, d].
    num_items: the catalogue size I.

  Returns:
    float32 [I, d].

  Raises:
    ValueError: the file is missing or unreadable, or the array is not floating, not 2-D, has the
      wrong number of rows or holds NaN / inf; the message names the file.
  """
  path = pathlib.Path(path)
  try:
    emb = np.load(path, allow_pickle=False)
  except (OSError, ValueError) as e:
    raise ValueError(f"{path}: cannot read item embeddings as a .npy array: {e}") from e
  if not np.issubdtype(emb.dtype, np.floating):
    raise ValueError(f"{path}: item embeddings must be floating point, got dtype {emb.dtype}")
  if emb.ndim != 2 or emb.shape[0] != num_items or emb.shape[1] == 0:
    raise ValueError(
        f"{path}: item embeddings must have shape [num_items={num_items}, d], got {emb.shape}")
  bad = ~np.isfinite(emb).all(axis=1)
  if bad.any():
    raise ValueError(f"{path}: item embeddings hold NaN/inf in {int(bad.sum())} rows "
                     f"(first: item {int(np.argmax(bad))})")
  return emb.astype(np.float32)
