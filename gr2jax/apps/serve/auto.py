"""serve.mode = 'auto': the fastest exact decoder of each batch bucket, from a cost table.

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
from collections.abc import Callable

from gr2jax.decoding import policy as policy_lib
from gr2jax.decoding import reranker as reranker_lib
from gr2jax.diffusion import speculative

MODES = ("fixed", "auto")
TIMING_REPEATS = 3  # a decoder's cost is the fastest of this many timed warm-up batches

CostTable = dict[int, dict[str, float]]  # bucket -> decoder -> seconds per batch


def check_mode(mode: str, verify_with: str) -> None:
  """Refuses 'auto' without a verifier, before any model loads.

  Raises:
    ValueError: naming serve.mode and serve.verify_with.
  """
  if mode == "auto" and not verify_with:
    raise ValueError("serve.mode='auto' chooses among the exact decoders of a drafter and its AR "
                     "verifier: set serve.verify_with (an AR export of the same data build, e.g. "
                     "'{workdir}/ar_rl/export'), or serve.mode='fixed'")


def decoder_name(policy) -> str:
  """'ar', 'diffusion' or 'lossless_k<K>': the decoder a policy decodes with."""
  if isinstance(policy, policy_lib.LosslessPolicy):
    return f"lossless_k{policy.spec.draft_k}"
  return "ar" if policy.config.mask_token_id is None else "diffusion"


def exact_decoders(reranker: reranker_lib.Reranker,
                   draft_ks: tuple[int, ...]) -> dict[str, reranker_lib.Reranker]:
  """The verifier alone and draft-and-verify at each K, sharing the reranker's params.

  Args:
    reranker: a lossless Reranker (policy.LosslessPolicy, params {"drafter", "verifier"}).
    draft_ks: the K's to draft with (each <= the drafter's block size).

  Returns:
    {'ar': ..., 'lossless_k<K>': ...}, each a Reranker over the same param arrays.

  Raises:
    ValueError: the reranker is not lossless (naming serve.verify_with); a K the pair cannot
      draft (naming serve.draft_ks).
  """
  policy = reranker.policy
  if not isinstance(policy, policy_lib.LosslessPolicy):
    check_mode("auto", verify_with="")  # a model that decodes alone: the same refusal
  out = {"ar": dataclasses.replace(
    reranker, params=reranker.params["verifier"],
    policy=policy_lib.ARPolicy(policy.verifier_config, policy.spec, policy.max_new_tokens))}
  for k in draft_ks:
    spec = dataclasses.replace(policy.spec, draft_k=k)
    speculative.check_pair(f"serve.draft_ks={tuple(draft_ks)!r}", policy.config,
                           policy.verifier_config, spec.draft)
    out[f"lossless_k{k}"] = dataclasses.replace(
      reranker, policy=dataclasses.replace(policy, spec=spec))
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
