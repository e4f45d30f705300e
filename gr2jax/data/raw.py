"""Amazon Beauty loaders: the item catalogue and the users' interaction sequences.

Both files are read line by line; any problem raises `RawDataError` naming the file, the 1-based
line number and the field, never a silently wrong record. Formats: see data/amazon_beauty/README.md.
"""

import gzip
import json
import math
import pathlib
from collections.abc import Iterator

import numpy as np

from gr2jax.data.records import Catalog

DATA_DIR = pathlib.Path(__file__).resolve().parents[2] / "data" / "amazon_beauty"
ITEMS_PATH = DATA_DIR / "items.jsonl.gz"
SEQUENCES_PATH = DATA_DIR / "sequences.txt.gz"


class RawDataError(ValueError):
  """Bad raw data; the message names the file and line."""


def _lines(path: pathlib.Path) -> Iterator[tuple[int, str]]:
  """Yields (1-based line number, line without newline); gzip when the name ends in .gz.

  Raises:
    RawDataError: the file is missing, not gzip, truncated or not UTF-8.
  """
  opener = gzip.open if path.suffix == ".gz" else open
  lineno = 0
  try:
    with opener(path, "rt", encoding="utf-8") as f:
      for lineno, line in enumerate(f, start=1):
        yield lineno, line.rstrip("\n")
  except FileNotFoundError as e:
    raise RawDataError(f"{path}: file not found") from e
  except (EOFError, gzip.BadGzipFile, OSError, UnicodeDecodeError) as e:
    raise RawDataError(
        f"{path}: unreadable after line {lineno} (truncated or corrupt file?): {e}") from e


def _optional_str(record: dict, field: str, where: str) -> str | None:
  value = record[field]
  if value is not None and not isinstance(value, str):
    raise RawDataError(f"{where}: field {field!r} must be a string or null, got {value!r}")
  return value


def load_catalog(path: str | pathlib.Path = ITEMS_PATH) -> Catalog:
  """Reads `items.jsonl.gz`: one JSON object per item; the line order defines the item index.

  Args:
    path: the items file (`.jsonl.gz` or plain `.jsonl`).

  Returns:
    The Catalog (titles / brands None where null, prices NaN where null).

  Raises:
    RawDataError: corrupt JSON, a missing or mistyped field, an empty category path, a duplicate
      ASIN, or a truncated file; the message names the file and line.
  """
  path = pathlib.Path(path)
  asins, titles, brands, categories, prices = [], [], [], [], []
  seen: dict[str, int] = {}
  for lineno, line in _lines(path):
    where = f"{path}:{lineno}"
    try:
      record = json.loads(line)
    except json.JSONDecodeError as e:
      raise RawDataError(f"{where}: corrupt JSON line: {e}") from e
    if not isinstance(record, dict):
      raise RawDataError(f"{where}: expected a JSON object, got {type(record).__name__}")
    missing = [f for f in ("asin", "title", "brand", "categories", "price") if f not in record]
    if missing:
      raise RawDataError(f"{where}: missing field(s) {missing}")
    asin = record["asin"]
    if not isinstance(asin, str) or not asin:
      raise RawDataError(f"{where}: field 'asin' must be a non-empty string, got {asin!r}")
    if asin in seen:
      raise RawDataError(f"{where}: duplicate ASIN {asin!r} (first on line {seen[asin]})")
    seen[asin] = lineno
    cats = record["categories"]
    if (not isinstance(cats, list) or not cats
        or not all(isinstance(c, str) and c for c in cats)):
      raise RawDataError(f"{where}: field 'categories' must be a non-empty list of strings, "
                         f"got {cats!r}")
    price = record["price"]
    if price is not None and (isinstance(price, bool) or not isinstance(price, int | float)
                              or not math.isfinite(price)):
      raise RawDataError(f"{where}: field 'price' must be a finite number or null, got {price!r}")
    asins.append(asin)
    titles.append(_optional_str(record, "title", where))
    brands.append(_optional_str(record, "brand", where))
    categories.append(tuple(cats))
    prices.append(math.nan if price is None else float(price))
  if not asins:
    raise RawDataError(f"{path}: no items")
  return Catalog(asins=tuple(asins), titles=tuple(titles), brands=tuple(brands),
                 categories=tuple(categories), prices=np.asarray(prices, np.float32))


def num_missing_titles(catalog: Catalog) -> int:
  """Number of items without a title (rendered with a placeholder downstream)."""
  return sum(t is None or not t for t in catalog.titles)


def load_sequences(path: str | pathlib.Path = SEQUENCES_PATH,
                   catalog: Catalog | None = None) -> list[np.ndarray]:
  """Reads `sequences.txt.gz`: `USER_ID ASIN ASIN ...` per line, oldest item first.

  Args:
    path: the sequences file (`.txt.gz` or plain text).
    catalog: maps ASINs to item indices; `load_catalog()` of the shipped data when None.

  Returns:
    One int32 array of item indices per user (line order), oldest first.

  Raises:
    RawDataError: a line without items, an ASIN not in the catalogue, an item repeated within a
      user, or a truncated file; the message names the file and line.
  """
  path = pathlib.Path(path)
  catalog = load_catalog() if catalog is None else catalog
  index = {a: i for i, a in enumerate(catalog.asins)}
  sequences = []
  for lineno, line in _lines(path):
    where = f"{path}:{lineno}"
    fields = line.split()
    if len(fields) < 2:
      raise RawDataError(f"{where}: corrupt line, expected 'USER_ID ASIN ...', got {line[:80]!r}")
    try:
      items = [index[a] for a in fields[1:]]
    except KeyError as e:
      raise RawDataError(f"{where}: unknown ASIN {e.args[0]!r} (not in the catalogue)") from e
    if len(set(items)) != len(items):
      raise RawDataError(f"{where}: user {fields[0]!r} has a repeated item")
    sequences.append(np.asarray(items, np.int32))
  if not sequences:
    raise RawDataError(f"{path}: no users")
  return sequences


def name_users(path: str | pathlib.Path, users: dict[int, str], limit: int = 5) -> str:
  """`file:line: user 'ID' <why>` for the first `limit` of `users`, then how many more.

  Args:
    path: the sequences file the users were read from (`load_sequences`: user u is line u + 1).
    users: {0-based user index: why it is named}, e.g. "has 3 items".
    limit: users named in full.

  Returns:
    One '; '-joined string.
  """
  path = pathlib.Path(path)
  wanted = sorted(users)[:limit]
  ids, look_for = {}, set(wanted)
  for lineno, line in _lines(path):
    if lineno - 1 in look_for:
      ids[lineno - 1] = line.split(maxsplit=1)[0]
    if len(ids) == len(wanted):
      break
  named = [f"{path}:{u + 1}: user {ids.get(u, '?')!r} {users[u]}" for u in wanted]
  more = f"; ... and {len(users) - len(wanted)} more" if len(users) > len(wanted) else ""
  return "; ".join(named) + more
