"""The decoder choice of the server (`Choice`): `Fixed` (serve.mode='fixed') or `Auto`
(serve.mode='auto': the fastest exact decoder of each batch bucket, from a cost table).

`Fixed` serves every batch bucket with the model's own decoder. `Auto` is described below; the
engine asks its value which decoder serves a bucket (`decoder`), and nothing compares the mode's
name once the serve spec (spec.py) is built.

With serve.verify_with set the server holds a block-diffusion drafter and its AR verifier once,
and every one of these decoders writes the verifier's own greedy answers at the verifier's
response cap (the lossless mode's guarantee, gr2jax/diffusion/speculative.py), so which one
decodes a batch does not change an answer beyond float near-ties: each committed token is the
verifier's teacher-forced arg-max at that batch or within exactness.TOLERANCE of it
(gr2jax/decoding/exactness.py: in bf16 a near-tie may fall either way between decoders and
batch buckets, as it may for AR alone between batch sizes):

  'ar'             the verifier alone (model/generate.py: one forward per token)
  'lossless_k<K>'  draft-and-verify, K drafted tokens per verify forward, K in serve.draft_ks

Which is fastest depends on the batch: a verify forward scores K + 1 queries per row and a batch
runs until its slowest row, so drafting pays where a forward is bound by memory (small batches on
an accelerator) and stops paying as the batch grows. A cost table {bucket: {decoder: seconds per
batch}} settles it per compiled batch bucket (`choose`). The server measures it at warm-up
(`measure`: each bucket's precompiled programs timed on a warm-up batch of distinct requests) or
reads it from serve.cost_table (`read_cost_table`), e.g. one measured on the serving hardware.
"""

import dataclasses
import json
import math
import time
from collections.abc import Callable, Mapping
from typing import ClassVar

from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.diffusion import speculative

TIMING_REPEATS = 3  # a decoder's cost is the fastest of this many timed warm-up batches

CostTable = dict[int, dict[str, float]]  # bucket -> decoder -> seconds per batch


def refuse_without_verifier() -> None:
  """'auto' needs a drafter and its AR verifier.

  Raises:
    ValueError: naming serve.mode and serve.verify_with.
  """
  raise ValueError("serve.mode='auto' chooses among the exact decoders of a drafter and its AR "
                   "verifier: set serve.verify_with (an AR export of the same data build, e.g. "
                   "'{workdir}/ar_rl/export'), or serve.mode='fixed'")


@dataclasses.dataclass(frozen=True)
class Fixed:
  """serve.mode='fixed': the model's own decoder serves every bucket (with serve.verify_with:
  draft-and-verify at decode.draft_k)."""

  mode: ClassVar[str] = "fixed"

  @classmethod
  def of_block(cls, draft_ks: tuple[int, ...], cost_table: str) -> "Fixed":
    """serve.mode='fixed' (draft_ks unused; a cost table is refused by name)."""
    del draft_ks
    if cost_table:
      raise ValueError(f"serve.cost_table={cost_table!r} chooses serve.mode='auto''s "
                       f"decoders; serve.mode={cls.mode!r} has one: pass cost_table=''")
    return cls()

  def check_verifier(self, verify_with: str) -> None:
    """Any model decodes alone."""
    del verify_with

  def decoders(self, reranker: reranker_lib.Reranker) -> dict[str, reranker_lib.Reranker]:
    """{its decoder's name (the policy's name): the reranker}."""
    return {reranker.policy.name: reranker}

  def decoder(self, bucket: int, decoders: Mapping) -> str:
    """The one decoder there is, whatever the bucket."""
    del bucket
    return next(iter(decoders))

  def chosen(self, buckets, decoders: Mapping) -> dict[int, str]:
    """bucket -> the decoder that serves it."""
    return {b: self.decoder(b, decoders) for b in buckets}

  def read_costs(self, buckets, decoders) -> CostTable | None:
    """No cost table: one decoder."""
    del buckets, decoders

  def settled(self, injected: CostTable | None, time_bucket: Callable[[int], dict],
              buckets) -> "Fixed":
    """Itself: nothing to time."""
    del injected, time_bucket, buckets
    return self

  def with_costs(self, table: CostTable) -> "Fixed":
    """Refused: one decoder, nothing to choose."""
    raise ValueError(f"serve.mode='fixed' serves one decoder: no cost table ({table!r})")

  def report(self) -> None:
    """/healthz's "cost_table": none."""


@dataclasses.dataclass(frozen=True)
class Auto:
  """serve.mode='auto': per bucket the cheapest of the verifier alone and draft-and-verify at
  each of draft_ks, from a cost table (built from the checked serve block: spec.ServeSpec).

  Attributes:
    draft_ks: the K's of draft-and-verify it chooses among (serve.draft_ks).
    cost_table: a JSON file of costs (serve.cost_table; '' = timed at warm-up).
    costs: the cost table the choice comes from ({} until the warm-up settles it).
  """

  draft_ks: tuple[int, ...]
  cost_table: str = ""
  costs: Mapping[int, Mapping[str, float]] = dataclasses.field(default_factory=dict)

  mode: ClassVar[str] = "auto"

  @classmethod
  def of_block(cls, draft_ks: tuple[int, ...], cost_table: str) -> "Auto":
    """serve.mode='auto' with serve.draft_ks and serve.cost_table."""
    return cls(draft_ks, cost_table)

  def check_verifier(self, verify_with: str) -> None:
    """Refuses 'auto' without a verifier, before any model loads."""
    if not verify_with:
      refuse_without_verifier()

  def decoders(self, reranker: reranker_lib.Reranker) -> dict[str, reranker_lib.Reranker]:
    """exact_decoders of the reranker at draft_ks."""
    return exact_decoders(reranker, self.draft_ks)

  def decoder(self, bucket: int, decoders: Mapping) -> str:
    """The cheapest decoder of the bucket in the cost table."""
    del decoders
    choice = choose(self.costs)
    if bucket not in choice:
      raise ValueError(f"serve.mode='auto': no cost for batch bucket {bucket} (use_costs)")
    return choice[bucket]

  def chosen(self, buckets, decoders: Mapping) -> dict[int, str]:
    """bucket -> the decoder that serves it, for the buckets the cost table has."""
    choice = choose(self.costs)
    return {b: choice[b] for b in buckets if b in choice}

  def read_costs(self, buckets, decoders) -> CostTable | None:
    """The cost_table file's costs (read_cost_table), or None where they are timed."""
    return read_cost_table(self.cost_table, buckets, decoders) if self.cost_table else None

  def with_costs(self, table: CostTable) -> "Auto":
    """The same choice over `table`."""
    return dataclasses.replace(self, costs=table)

  def settled(self, injected: CostTable | None, time_bucket: Callable[[int], dict],
              buckets) -> "Auto":
    """Over the injected table, else each bucket timed by time_bucket(bucket)."""
    return self.with_costs(injected or {b: time_bucket(b) for b in buckets})

  def report(self) -> dict:
    """/healthz's "cost_table": its source and seconds."""
    return {"source": self.cost_table or "measured at warm-up",
            "seconds": {str(b): c for b, c in self.costs.items()}}


Choice = Fixed | Auto  # the server's decoder choice (ServeSpec.choice, Engine.choice)
FIXED = Fixed()  # the one fixed choice (the engine's default)
CHOICES = {"fixed": Fixed, "auto": Auto}  # serve.mode -> its type


def exact_decoders(reranker: reranker_lib.Reranker,
                   draft_ks: tuple[int, ...]) -> dict[str, reranker_lib.Reranker]:
  """The verifier alone and draft-and-verify at each K, sharing the reranker's params.

  Args:
    reranker: a lossless Reranker (policy.LosslessPolicy, params {"drafter", "verifier"}).
    draft_ks: the K's to draft with (each <= the drafter's block size).

  Returns:
    {'ar': ..., 'lossless_k<K>': ...} (each policy's name), each a Reranker over the same param
    arrays (and tokenizer lock).

  Raises:
    ValueError: the reranker is not lossless (naming serve.verify_with); a K the pair cannot
      draft (naming serve.draft_ks).
  """
  policy = reranker.policy
  if policy.kind != "lossless":
    refuse_without_verifier()  # a model that decodes alone
  verifier = policy_lib.ARPolicy(policy.verifier_config, policy.spec, policy.max_new_tokens)
  out = {verifier.name: dataclasses.replace(reranker, params=reranker.params["verifier"],
                                            policy=verifier)}
  for k in draft_ks:
    speculative.check_pair(f"serve.draft_ks={tuple(draft_ks)!r}", policy.config,
                           policy.verifier_config, k)
    drafting = dataclasses.replace(policy, spec=dataclasses.replace(policy.spec, draft_k=k))
    out[drafting.name] = dataclasses.replace(reranker, policy=drafting)
  return out


def choose(table: CostTable) -> dict[int, str]:
  """The cheapest decoder of each bucket (a tie goes to the first name in sort order)."""
  return {bucket: min(costs, key=lambda name: (costs[name], name))
          for bucket, costs in sorted(table.items())}


def measure(run: Callable[[str], object], decoders, repeats: int = TIMING_REPEATS,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, float]:
  """Seconds per call of run(decoder) for each decoder, the fastest of `repeats` (the
  decoders interleaved, so a slow spell of the machine does not fall on one of them)."""
  best = dict.fromkeys(decoders, math.inf)
  for _ in range(repeats):
    for name in best:
      start = clock()
      run(name)
      best[name] = min(best[name], clock() - start)
  return best


def read_cost_table(path: str, buckets: tuple[int, ...], decoders) -> CostTable:
  """A cost table from a JSON file {"<bucket>": {"<decoder>": seconds per batch}}.

  Args:
    path: the file (serve.cost_table).
    buckets: the compiled batch buckets: each must have an entry, and no other.
    decoders: the decoder names an entry may give costs for (at least one each).

  Raises:
    ValueError: one line naming serve.cost_table, the file and the bucket or decoder at fault.
  """
  where = f"serve.cost_table={path}"
  try:
    with open(path) as f:
      raw = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{where}: cannot read it as JSON ({e})") from None
  if not isinstance(raw, dict):
    raise ValueError(f"{where}: must be a JSON object {{bucket: {{decoder: seconds}}}}")
  table = {}
  for key, costs in raw.items():
    if not (key.isdigit() and int(key) in buckets):
      raise ValueError(f"{where}: bucket {key!r} is not a compiled batch bucket "
                       f"{tuple(buckets)} (serve.batch_buckets)")
    if not isinstance(costs, dict) or not costs:
      raise ValueError(f"{where}: bucket {key} must map decoder names to seconds")
    for name, seconds in costs.items():
      if name not in decoders:
        raise ValueError(f"{where}: bucket {key}: unknown decoder {name!r} (this server's: "
                         f"{', '.join(decoders)})")
      if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not (
          0 < seconds < math.inf):
        raise ValueError(f"{where}: bucket {key}, {name}: {seconds!r} must be seconds > 0")
    table[int(key)] = {name: float(s) for name, s in costs.items()}
  missing = [b for b in buckets if b not in table]
  if missing:
    raise ValueError(f"{where}: no costs for the batch buckets {missing} (serve.batch_buckets)")
  return table
