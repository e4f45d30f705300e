"""Tests for gr2jax/data/raw.py on the shipped data and on corrupted copies."""

import gzip
import json

import numpy as np
import pytest

from gr2jax.data import raw

_ITEM = {"asin": "A1", "title": "t", "brand": "b", "categories": ["Beauty", "Makeup"], "price": 1.5}


@pytest.fixture(scope="module")
def catalog():
  return raw.load_catalog()


def _write_items(path, records):
  with gzip.open(path, "wt", encoding="utf-8") as f:
    for r in records:
      f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
  return path


def test_shipped_catalog(catalog):
  assert catalog.num_items == 12_101
  assert catalog.asins[0] == "B004756YJA"
  assert raw.num_missing_titles(catalog) == 7
  assert sum(b is not None for b in catalog.brands) == 10_003
  assert int(np.isfinite(catalog.prices).sum()) == 11_516
  assert all(c[0] == "Beauty" and 2 <= len(c) <= 6 for c in catalog.categories)


def test_shipped_sequences(catalog):
  seqs = raw.load_sequences(catalog=catalog)
  assert len(seqs) == 22_363
  assert sum(len(s) for s in seqs) == 198_502
  assert all(s.dtype == np.int32 for s in seqs)
  assert min(len(s) for s in seqs) == 5 and max(len(s) for s in seqs) == 204
  assert [catalog.asins[i] for i in seqs[0]] == [
      "B004756YJA", "B004ZT0SSG", "B0020YLEYK", "7806397051", "B002WLWX82"]


@pytest.mark.parametrize("bad, match", [
    ("{not json", r"items.jsonl.gz:2: corrupt JSON"),
    ({k: v for k, v in _ITEM.items() if k != "brand"} | {"asin": "A2"}, r":2: missing .*brand"),
    (_ITEM, r":2: duplicate ASIN 'A1' \(first on line 1\)"),
    (_ITEM | {"asin": "A2", "categories": []}, r":2: field 'categories'"),
    (_ITEM | {"asin": "A2", "price": "cheap"}, r":2: field 'price'"),
])
def test_catalog_errors(tmp_path, bad, match):
  path = _write_items(tmp_path / "items.jsonl.gz", [_ITEM, bad])
  with pytest.raises(raw.RawDataError, match=match):
    raw.load_catalog(path)


def test_truncated_items_file(tmp_path):
  full = gzip.compress(gzip.decompress(
      raw.ITEMS_PATH.read_bytes())[:200_000])
  path = tmp_path / "items.jsonl.gz"
  path.write_bytes(full[: len(full) // 2])
  with pytest.raises(raw.RawDataError, match=r"items.jsonl.gz: unreadable after line \d+"):
    raw.load_catalog(path)


def test_untitled_items_counted(tmp_path):
  path = _write_items(tmp_path / "items.jsonl.gz", [_ITEM, _ITEM | {"asin": "A2", "title": None}])
  catalog = raw.load_catalog(path)
  assert catalog.titles == ("t", None)
  assert raw.num_missing_titles(catalog) == 1


@pytest.mark.parametrize("line, match", [
    ("U2", r"seq.txt:2: corrupt line"),
    ("U2 A1 ZZZ", r"seq.txt:2: unknown ASIN 'ZZZ'"),
    ("U2 A1 A1", r"seq.txt:2: user 'U2' has a repeated item"),
])
def test_sequence_errors(tmp_path, line, match):
  catalog = raw.load_catalog(_write_items(tmp_path / "items.jsonl.gz",
                                          [_ITEM, _ITEM | {"asin": "A2"}]))
  path = tmp_path / "seq.txt"
  path.write_text(f"U1 A1 A2\n{line}\n")
  with pytest.raises(raw.RawDataError, match=match):
    raw.load_sequences(path, catalog)
