"""Hand-made catalog, SIDs and re-ranking examples shared by the prompt/tokenizer/batch tests."""

import numpy as np

from gr2jax.data.records import Catalog, Citation, RerankExample

BRANDS = ("Maybelline", "Revlon", None, "L'Oreal Paris", "Burt's Bees")
LEAVES = ("Mascara", "Lipstick", "Shampoos", "Concealers & Neutralizers", "Lip Balms")


def toy_catalog(num_items: int = 40) -> Catalog:
  """A catalog with every 7th title missing and a few brands missing."""
  titles = tuple(None if i % 7 == 3 else f"Product {i} deluxe edition with long words ä {i % 5}"
                 for i in range(num_items))
  return Catalog(
    asins=tuple(f"B{i:09d}" for i in range(num_items)),
    titles=titles,
    brands=tuple(BRANDS[i % len(BRANDS)] for i in range(num_items)),
    categories=tuple(("Beauty", "Makeup" if i % 2 else "Hair Care", LEAVES[i % len(LEAVES)])
                     for i in range(num_items)),
    prices=np.full((num_items,), 9.99, np.float32))


def toy_sids(num_items: int = 40) -> np.ndarray:
  """[num_items, 4] int32 unique SIDs using high codes (255) too."""
  rng = np.random.default_rng(0)
  sids = rng.integers(0, 256, size=(num_items, 3))
  sids[0] = 255
  last = np.arange(num_items) % 3
  return np.concatenate([sids, last[:, None]], axis=1).astype(np.int32)


def toy_example(user: int = 0, num_candidates: int = 10, with_teacher: bool = True,
                seed: int = 0) -> RerankExample:
  """One example over the toy catalog: 8 history items, N candidates, two citations."""
  rng = np.random.default_rng(seed + user)
  items = rng.permutation(40)
  history = items[:8].astype(np.int32)
  candidates = items[8:8 + num_candidates].astype(np.int32)
  ranking = rng.permutation(num_candidates).astype(np.int32) if with_teacher else None
  citations = ((Citation(slot=2, kind="brand", value="Maybelline", history_positions=(7, 1)),
                Citation(slot=5, kind="leaf", value="Mascara", history_positions=(6,)))
               if with_teacher else ())
  return RerankExample(
    user=user, split="train", history=history, candidates=candidates,
    target_position=int(rng.integers(num_candidates)),
    retriever_scores=np.sort(rng.random(num_candidates).astype(np.float32))[::-1],
    evidence=rng.integers(0, 5, size=(num_candidates, 3)).astype(np.int32),
    teacher_ranking=ranking, citations=citations)
