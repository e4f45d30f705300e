"""Emulated decodes for the speed benchmarks: a recorded run replayed on other weights.

A benchmark times a bigger model than the one trained by running the trained model's recorded
commit schedule on the bigger model's (random) weights, from a prefill done beforehand so that a
timing covers the decode alone. These emulations run the decoders' own loops with a recorded
strategy in place of the decoder's (decode.decode_loop with `RecordedCounts` as its commit
schedule; speculative.loop_step with `RecordedRules`, in a loop of their own that ends each row
after its recorded verify steps), so they cost what a decode costs, but their tokens are not a
model's output. The strategies live here: the library's decoders know only their interfaces
(decode.CommitSchedule, speculative.Rules) and build their own (decode.Threshold,
speculative.DecoderRules). `first_divergence` is the benchmarks' (and tests') check of where two
decodes that should agree part.

The timed replays on random weights (`random_model`, `run_entries`, `timed_replay`; the flags
of `define_replay_flags`) serve both studies that time them: experiments/studies/bench_speedup.py
(batch 1, over model sizes) and experiments/studies/batch_curve.py (its cpu section, over batch
sizes). bench_speculative.py replays draft-and-verify schedules with `speculative_replay`.
"""

import dataclasses
import functools
import json
import os
import time

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from absl import app, flags

from gr2jax import cli
from gr2jax.diffusion import commit, decode, speculative
from gr2jax.model import generate as gen
from gr2jax.model import params as params_lib
from gr2jax.model import qwen3, validate
from gr2jax.model.cache import KVCache, init_cache
from gr2jax.model.config import ModelConfig

FLAGS = flags.FLAGS

# ---- block diffusion -----------------------------------------------------------------------


@flax.struct.dataclass
class RecordedCounts(decode.CommitSchedule):
  """A recorded commit schedule (decode.CommitSchedule): row b's i-th denoising step, counted
  across its blocks, commits the first counts[b, i] open positions in the decode's commit order;
  past the schedule's end, and at the capped step, every open position.

  Attributes:
    counts: [B, S] int32 >= 0.
  """

  counts: jax.Array

  def select(self, proposed, open_, s, max_steps_per_block, order):
    """decode.CommitSchedule.select: the recorded count."""
    capped, tau = commit.capped_threshold(s.step, max_steps_per_block, -1.0)
    steps = self.counts.shape[1]
    at = jnp.minimum(s.denoise_steps, steps - 1)[:, None]
    n = jnp.take_along_axis(self.counts, at, axis=1)[:, 0]
    count = jnp.where(capped | (s.denoise_steps >= steps), s.canvas.shape[1], n)
    return commit.select(*proposed, s.canvas, open_, tau, order=order, count=count)


@functools.partial(jax.jit, static_argnames=("config", "static"))
def _replay(params, config, inputs, prefilled, *, static):
  """decode.decode_loop (inputs carry the recorded schedule), after the prefill or from
  `prefilled`."""
  if prefilled is None:
    logits, cache = decode.prefill(params, config, inputs, static)
  else:
    cache, logits = prefilled
  return decode.decode_loop(params, config, inputs, static, logits, cache)


def replay(params: dict, config: ModelConfig, prompt_tokens: jax.Array,
           prompt_lengths: jax.Array | None, decoding: decode.BlockDecoding, schedule, *,
           prefilled: tuple[KVCache, jax.Array] | None = None) -> decode.DiffusionOutput:
  """block_diffusion_generate with a recorded commit schedule in place of the threshold rule.

  Args:
    params, config, prompt_tokens, prompt_lengths, decoding: as block_diffusion_generate
      (decoding.threshold is not read but checked).
    schedule: [B, S] int >= 0, the commits of each of a row's denoising steps (indexed by the
      row's denoising steps so far, across blocks; steps past S and the capped step commit every
      open position), e.g. `schedule_from_trace` of a trained model's decode.
    prefilled: (cache, logits [B, V] f32) of an earlier prefill of these prompts
      (`qwen3.ragged_prefill` into a cache of decoding.cache_size slots): the prefill is
      skipped, so a timing covers the decode alone (the loop starts from a copy of the cache).

  Returns:
    DiffusionOutput (its tokens are not a model's output).

  Raises:
    TypeError / ValueError naming the argument: as block_diffusion_generate, a schedule that is
      not [B, S >= 1] int >= 0, prefilled of other rows, vocab or cache size.
  """
  where = "emulate.replay"
  if prefilled is not None and isinstance(decoding, decode.BlockDecoding):
    cache = prefilled[0]
    if not isinstance(cache, KVCache):
      raise TypeError(f"{where}: prefilled[0] must be a KVCache, got {type(cache).__name__}")
    if decoding.cache_size not in (None, cache.max_len):
      raise ValueError(f"{where}: cache_size={decoding.cache_size} != the prefilled cache's "
                       f"{cache.max_len} slots")
    decoding = dataclasses.replace(decoding, cache_size=cache.max_len)
  inputs, static = decode.check_inputs(where, config, prompt_tokens, prompt_lengths, decoding,
                                       None, decode.NO_STEERING)
  b = inputs.prompt_tokens.shape[0]
  schedule = jnp.asarray(schedule)
  if (not jnp.issubdtype(schedule.dtype, jnp.integer) or schedule.ndim != 2
      or schedule.shape[0] != b or schedule.shape[1] < 1):
    raise ValueError(f"{where}: schedule must be an int array [{b}, S >= 1], got "
                     f"{schedule.dtype} {schedule.shape}")
  if int(jnp.min(schedule)) < 0:
    raise ValueError(f"{where}: schedule has a negative commit count {int(jnp.min(schedule))}")
  if prefilled is not None:
    cache, logits = prefilled
    if cache.lengths.shape != (b,):
      raise TypeError(f"{where}: prefilled[0] must be a KVCache of {b} rows")
    if getattr(logits, "shape", None) != (b, config.vocab_size):
      raise ValueError(f"{where}: prefilled[1] must be logits [{b}, {config.vocab_size}], got "
                       f"{getattr(logits, 'shape', None)}")
  inputs = inputs._replace(schedule=RecordedCounts(schedule.astype(jnp.int32)))
  return _replay(params_lib.layer_list(params), config, inputs, prefilled, static=static)


def schedule_from_trace(commit_step, lengths, block_size: int) -> list[list[int]]:
  """Per row, the commits of each denoising step of a decode (the `schedule` `replay` replays).

  A row's steps are counted across its blocks in order; a step of the last block that committed
  only tokens past the row's length (after its stop token) counts 0, so a replay with
  max_new_tokens = length and no stop tokens runs exactly the recorded forwards.

  Args:
    commit_step: [B, N] DiffusionOutput.commit_step.
    lengths: [B] DiffusionOutput.lengths.
    block_size: B of the decode.

  Returns:
    B lists of per-step commit counts (each sums to the row's non-seed tokens).
  """
  out = []
  for steps, n in zip(np.asarray(commit_step), np.asarray(lengths), strict=True):
    row = []
    for first in range(0, int(n), block_size):
      block = steps[first:min(first + block_size, int(n))]
      block = block[block != decode.SEED_STEP]
      if block.size:
        row += np.bincount(block, minlength=int(block.max()) + 1).tolist()
    out.append(row)
  return out


# ---- draft-and-verify ----------------------------------------------------------------------


class RecordedRules(speculative.Rules):
  """speculative.Rules replaying a recorded schedule [B, S, 2] int32: (denoising steps,
  accepted drafts) of each verify step, -1 past the row's last (where the replay's loop ends
  the row: `end_rows`)."""

  def __init__(self, schedule: jax.Array, spec: speculative.DraftDecoding,
               mask_token_id: int | None):
    self.schedule, self.spec, self.mask_token_id = schedule, spec, mask_token_id

  def _recorded(self, step, field):
    at = jnp.minimum(step, self.schedule.shape[1] - 1)[:, None]
    return jnp.take_along_axis(self.schedule[:, :, field], at, axis=1)[:, 0]

  def draft_select(self, step, draft_step, proposed, window, open_):
    """The draft's recorded denoising steps (past the schedule: one), one token per step; the
    last step commits the rest."""
    cap = jnp.maximum(jnp.where(step < self.schedule.shape[1], self._recorded(step, 0), 1), 1)
    capped, tau = commit.capped_threshold(draft_step, cap, self.spec.draft_tau)
    return commit.select(*proposed, window, open_, tau, order=self.spec.commit_order,
                         count=jnp.where(capped, self.spec.k, 1))

  def accept(self, step, logits, drafts, q_logp, k_eff, key):
    """The recorded acceptances (at most K_eff), then the verifier's greedy token."""
    a = jnp.minimum(self._recorded(step, 1), k_eff)
    greedy = speculative.verifier_greedy(logits, self.mask_token_id)
    return a, jnp.take_along_axis(greedy, a[:, None], axis=1)[:, 0]

  def end_rows(self, s: speculative.LoopState) -> speculative.LoopState:
    """s with the rows that have run their recorded verify steps done."""
    return s._replace(done=s.done | (s.step >= jnp.sum(self.schedule[:, :, 0] >= 0, axis=1)))


_STATIC = ("config_d", "config_v", "caches")
_prefills = jax.jit(speculative.prefills, static_argnames=_STATIC)


@functools.partial(jax.jit, static_argnames=(*_STATIC, "spec"))
def _speculative_replay(params_d, params_v, prompt_tokens, prompt_lengths, stop_ids, key,
                        schedule, prefilled, *, config_d, config_v, spec, caches):
  """speculative.decode_loop's loop with RecordedRules, each row ending after its recorded
  verify steps."""
  if prefilled is None:
    prefilled = speculative.prefills(params_d, params_v, prompt_tokens, prompt_lengths,
                                     config_d=config_d, config_v=config_v, caches=caches)
  rules = RecordedRules(schedule, spec, config_v.mask_token_id)
  settings = speculative.Settings(config_d, config_v, spec)
  s = rules.end_rows(speculative.loop_start(prompt_lengths, stop_ids, key, prefilled, settings))
  step = lambda s: rules.end_rows(speculative.loop_step(params_d, params_v, prompt_lengths,
                                                         stop_ids, rules, settings, s))
  s = jax.lax.while_loop(lambda s: ~jnp.all(s.done), step, s)
  return speculative.loop_output(settings, s)[0]


def speculative_prefill(drafter: speculative.Model, verifier: speculative.Model, prompt_tokens,
                        prompt_lengths, spec: speculative.DraftDecoding):
  """Both prefills, as speculative_generate runs them: (verifier cache, verifier logits [B, V],
  drafter cache), for `speculative_replay(prefilled=)` (a timing of the decode alone).
  Arguments as speculative_generate's, checked as there."""
  c = speculative.check_inputs("emulate.speculative_prefill", drafter, verifier,
                               (prompt_tokens, prompt_lengths), spec)
  return _prefills(params_lib.layer_list(c.drafter.params),
                   params_lib.layer_list(c.verifier.params), c.prompt_tokens, c.prompt_lengths,
                   config_d=c.drafter.config, config_v=c.verifier.config, caches=c.slots)


def speculative_replay(drafter: speculative.Model, verifier: speculative.Model,
                       prompt_tokens: jax.Array, prompt_lengths: jax.Array,
                       spec: speculative.DraftDecoding, schedule: jax.Array, *,
                       prefilled: tuple | None = None) -> speculative.SpecOutput:
  """Runs a recorded draft-and-verify schedule on any weights (a speed emulation, not a decode).

  Verify step s of row b drafts as the decoder does (K_eff from the row's position) but with
  exactly `schedule[b, s, 0]` denoising steps (one token per step, the last one the rest), and
  accepts exactly min(schedule[b, s, 1], K_eff) drafts, whatever they are, plus the verifier's
  token; the row ends after its recorded steps. With the recording's spec.max_new_tokens (so K_eff
  follows the same positions) and no stop ids, replaying `schedule_from_output` of a decode runs
  exactly its drafter and verify forwards.

  Args:
    drafter, verifier, prompt_tokens, prompt_lengths: as speculative_generate.
    spec: its DraftDecoding (greedy; max_new_tokens N, the recording's).
    schedule: [B, S, 2] int: (denoising steps, accepted drafts) of each verify step, >= 0, then
      -1 past the row's last step.
    prefilled: optional `speculative_prefill(...)` of these prompts (the loop starts from it).

  Returns:
    SpecOutput (its tokens are not a model's output).
  """
  where = "speculative_replay"
  c = speculative.check_inputs(where, drafter, verifier, (prompt_tokens, prompt_lengths), spec)
  b = c.prompt_tokens.shape[0]
  schedule = validate.integer_array(where, "schedule", schedule, shape=(b, None, 2))
  validate.check_range(where, "schedule", schedule, -1, 2**30)
  if prefilled is not None:
    v_cache, v_logits, d_cache = prefilled
    for name, cache, size in (("prefilled[0]", v_cache, c.slots[0]),
                              ("prefilled[2]", d_cache, c.slots[1])):
      if not isinstance(cache, KVCache) or cache.lengths.shape != (b,) or cache.max_len != size:
        raise ValueError(f"{where}: {name} must be a KVCache of {b} rows and {size} slots "
                         "(speculative_prefill)")
    validate.check_shape(where, "prefilled[1]", v_logits, shape=(b, c.verifier.config.vocab_size))
  return _speculative_replay(
    params_lib.layer_list(c.drafter.params), params_lib.layer_list(c.verifier.params),
    c.prompt_tokens, c.prompt_lengths, c.stop_ids, c.key, jnp.asarray(schedule, jnp.int32),
    prefilled, config_d=c.drafter.config, config_v=c.verifier.config, spec=spec,
    caches=c.slots)


def schedule_from_output(out: speculative.SpecOutput,
                         block_size: int) -> list[list[tuple[int, int]]]:
  """Per row, (denoising steps, accepted drafts) of each verify step: what speculative_replay
  replays. The commit forwards are re-derived from the block alignment (a step opens with one
  when the accepted tokens completed the drafter's block and it drafts).

  Args:
    out: a SpecOutput (host arrays or device arrays).
    block_size: the drafter's B.

  Returns:
    B lists of (denoise, accepted) pairs.
  """
  rows = []
  for b in range(len(out.lengths)):
    n, start, row = 1, 0, []
    for s in range(int(out.verify_forwards[b])):
      drafted, accepted = int(out.step_drafted[b, s]), int(out.step_accepted[b, s])
      commits = int(n >= start + block_size and drafted > 0)
      start += block_size * commits
      row.append((int(out.step_draft_forwards[b, s]) - commits, accepted))
      n += accepted + 1
    rows.append(row)
  return rows




def first_divergence(verifier: speculative.Model, prompt_tokens, prompt_lengths, tokens,
                     reference) -> list:
  """Where two decodes of the same prompts first differ, and how close the verifier was to a tie.

  Args:
    verifier: the Model both decodes should follow.
    prompt_tokens: [B, P] right-padded prompts; prompt_lengths: [B].
    tokens: [B, N] one decode's tokens (e.g. speculative_generate's).
    reference: [B, N] the other's (e.g. generate's greedy tokens).

  Returns:
    One dict per differing row: row, index j, both tokens, and margin = |logit difference| of
    the two tokens at j under one cache-free causal forward of [prompt | reference[:j]] (a
    third rounding of the same numbers: a margin near 1e-6 is a float near-tie).
  """
  tokens, reference = np.asarray(tokens), np.asarray(reference)
  found = []
  for row in np.flatnonzero((tokens != reference).any(axis=1)):
    j = int(np.argmax(tokens[row] != reference[row]))
    n = int(prompt_lengths[row])
    seq = np.concatenate([np.asarray(prompt_tokens[row, :n]), reference[row, :j]])[None]
    logits = np.asarray(qwen3.forward(verifier.params, verifier.config, jnp.asarray(seq))[0])
    last = logits[0, -1]
    a, b = int(reference[row, j]), int(tokens[row, j])
    found.append({"row": int(row), "index": j, "reference": a, "token": b,
                  "margin": float(abs(last[a] - last[b]))})
  return found


# ---- timed replays on random weights (bench_speedup.py, batch_curve.py) ---------------------


def define_replay_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The flags the replays read (run_entries, timed_replay) and a recording writes (bench_speedup.py
  --record_ckpt), defined by each study that replays (under its name: adopt_module_key_flags)."""
  f = {"flag_values": flag_values}
  flags.DEFINE_string("schedules", "docs/results/benchmarks/speedup/schedules.json",
                      "Recorded schedules (written with --record_ckpt, read otherwise).", **f)
  cli.define_list("taus", [0.9, 0.6, 0.4], "Commit thresholds recorded / replayed.",
                  cli.number(0, 1, low_open=True), **f)
  cli.define_list("block_sizes", [4, 8, 16, 32], "Block sizes B.", cli.integer(1), **f)
  flags.DEFINE_list("runs", ["tiny/float32", "small/float32", "qwen3_0_6b/float32",
                             "qwen3_0_6b/bfloat16", "qwen3_1_7b/bfloat16"],
                    "SHAPE/DTYPE[@P1+P2[@T1+T2[@B1+B2]]] replays; SHAPE = a ModelConfig preset "
                    "or a key of HF_SHAPES; the @ fields narrow --prompt_lengths, --taus and "
                    "--block_sizes for that run (empty = all).", **f)
  cli.define_list("prompt_lengths", [256, 2200], "Random prompt lengths P of the replay.",
                  cli.integer(1), **f)
  flags.DEFINE_integer("head_buckets", 1, "LM-head widths of the diffusion decode (1 = all B "
                       "queries, the decoder's default; k adds B/2, ... B/2^(k-1)).",
                       lower_bound=1, **f)
  flags.DEFINE_integer("repeats", 2, "Timed rounds (fastest kept) after the warm-up call.",
                       lower_bound=1, **f)
  cli.define_list("spec_ks", [4, 8, 16, 32], "Draft-and-verify K recorded / replayed.",
                  cli.integer(1), **f)
  cli.define_list("spec_taus", [0.0, 0.6, 0.9], "Draft-and-verify tau_d recorded / replayed (0 = "
                  "one-step drafts).", cli.number(0, 1), **f)


HF_SHAPES = {  # HF config.json shapes of Qwen3 sizes without a ModelConfig preset
  "qwen3_1_7b": dict(vocab_size=151936, hidden_size=2048, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                     intermediate_size=6144, tie_word_embeddings=True, eos_token_id=151645),
}


def shape_config(shape: str, dtype: str) -> ModelConfig:
  """ModelConfig of a preset or an HF_SHAPES entry, with a mask token and no stop token."""
  if shape in HF_SHAPES:
    config = ModelConfig.from_hf_dict(HF_SHAPES[shape], param_dtype=dtype, compute_dtype=dtype)
  elif hasattr(ModelConfig, shape):
    config = getattr(ModelConfig, shape)(param_dtype=dtype, compute_dtype=dtype)
  else:
    raise app.UsageError(f"--runs: unknown shape {shape!r} (a ModelConfig preset or one of "
                         f"{sorted(HF_SHAPES)})")
  return dataclasses.replace(config, mask_token_id=config.vocab_size - 1, eos_token_ids=())


def _timed(fn) -> tuple[float, object]:
  start = time.perf_counter()
  out = jax.block_until_ready(fn())
  return time.perf_counter() - start, out


def random_model(shape: str, dtype: str):
  """(config, random params) of a shape, in the decoders' layout (params.layer_list: converted
  once here, not by every timed call; the stored stack is freed, so one copy is resident)."""
  config = shape_config(shape, dtype)
  params = jax.jit(params_lib.init_params, static_argnums=0)(config, jax.random.key(0))
  return config, jax.block_until_ready(params_lib.layer_list(params))


def timed_replay(config, params, run: str, entries: list[dict], spec_entries: list[dict],
                 prompt_len: int, batch: int = 1) -> list[dict]:
  """AR at each length, each diffusion entry's and each draft-and-verify entry's schedule
  replayed on a model's weights (module doc); one row each. At `batch` > 1 every row of the
  batch replays the same schedule (the rows step together; tokens/s counts every row's)."""
  shape, dtype = run.split("/")
  lengths = sorted({e["length"] for e in entries + spec_entries})
  blocks = {e["block"] for e in entries} or {1}
  cache_len = prompt_len + max(-(-n // b) * b for b in blocks for n in lengths)
  prompt = jax.random.randint(jax.random.key(1), (batch, prompt_len), 1, config.vocab_size - 1)
  prompt_lengths = jnp.full((batch,), prompt_len, jnp.int32)
  t_prefill, (logits, cache) = _timed(lambda: jax.jit(qwen3.ragged_prefill, static_argnums=1)(
    params, config, prompt, prompt_lengths, init_cache(config, batch, cache_len)))
  copy = lambda x: jax.block_until_ready(jax.tree.map(jnp.copy, x))
  print(f"[replay] {shape}/{dtype} P={prompt_len} batch {batch}: prefilled in {t_prefill:.1f} s",
        flush=True)

  def ar(length):
    def run():
      c, lg = copy((cache, logits))
      out, _ = gen.decode(params, config, c, lg, jax.random.key(0),
                          gen.ARDecoding(max_new_tokens=length, stop_token_ids=()))
      return out.tokens, out.nfe
    return run

  def diffusion(entry):
    cfg = dataclasses.replace(config, block_size=entry["block"])
    length = entry["length"]
    # Padded to L steps (a row never takes more): one compile per B, whatever the schedule.
    steps = entry["schedule"]
    schedule = jnp.asarray([steps + [1] * (length - len(steps))] * batch, jnp.int32)

    def run():
      out = replay(
        params, cfg, prompt, prompt_lengths, decode.BlockDecoding(
          threshold=entry["tau"], max_steps_per_block=64, max_new_tokens=length,
          stop_token_ids=(), head_buckets=FLAGS.head_buckets),
        schedule, prefilled=(cache, logits))
      return out.tokens, jnp.max(out.num_forwards) - 1
    return run

  def draft_verify(entry):
    drafter = speculative.Model(params, dataclasses.replace(config, block_size=entry["block"]))
    verifier = speculative.Model(params, config)
    # The recording's cap (the drafts' windows are those of the recording); padded to the
    # cap's steps (one compile per K and tau_d, whatever the schedule).
    cap, steps = entry["max_new_tokens"], entry["schedule"]
    spec = speculative.DraftDecoding(max_new_tokens=cap, k=entry["k"], draft_tau=entry["tau"],
                            draft_steps=entry["draft_steps"])
    schedule = jnp.asarray([steps + [[-1, -1]] * (cap - len(steps))] * batch, jnp.int32)
    prefilled = jax.block_until_ready(speculative_prefill(
      drafter, verifier, prompt, prompt_lengths, spec))

    def run():
      out = speculative_replay(drafter, verifier, prompt, prompt_lengths, spec, schedule,
                                       prefilled=copy(prefilled))
      return out.tokens, jnp.max(out.verify_forwards + out.draft_forwards)
    return run

  cases = [(("AR", n), None, ar(n)) for n in lengths]
  cases += [(("diffusion", (e["tau"], e["block"])), e, diffusion(e)) for e in entries]
  cases += [(("draft_verify", (e["k"], e["tau"])), e, draft_verify(e)) for e in spec_entries]
  first, best, forwards = {}, {}, {}
  for key, _, fn in cases:  # warm-up (compile) calls
    first[key], (_, nfe) = _timed(fn)
    forwards[key] = int(nfe)
    print(f"[replay] warm-up {key}: {first[key]:.1f} s", flush=True)
  for _ in range(FLAGS.repeats):
    for key, _, fn in cases:
      seconds, _ = _timed(fn)
      best[key] = min(best.get(key, np.inf), seconds)
  base = dict(shape=shape, dtype=dtype, params=params_lib.param_count(config),
              prompt_len=prompt_len, batch=batch, prefill_first_call_s=t_prefill,
              load_avg_1min=os.getloadavg()[0])  # the shared machine's load after the rounds
  rows = []
  for n in lengths:
    s, fwd = best[("AR", n)], forwards[("AR", n)]
    rows.append(dict(base, length=n, method="AR", block=1, tau=None, seconds=s, forwards=fwd,
                     tokens_per_s=batch * n / s, ms_per_forward=1e3 * s / fwd,
                     compile_s=max(first[("AR", n)] - s, 0.0)))
  for key, entry, _ in cases:
    if entry is None:
      continue
    method = key[0]
    recorded = (entry["forwards"] if method == "diffusion" else
                entry["verify_forwards"] + entry["draft_forwards"])
    if forwards[key] != recorded:
      raise AssertionError(f"replay of {key} ran {forwards[key]} forwards, the recording "
                           f"{recorded}")
    n, s = entry["length"], best[key]
    ar_s, ar_fwd = best[("AR", n)], forwards[("AR", n)]
    rows.append(dict(base, length=n, method=method, block=entry["block"], tau=entry["tau"],
                     **({"k": entry["k"]} if method == "draft_verify" else {}), seconds=s,
                     forwards=forwards[key], tokens_per_s=batch * n / s,
                     ms_per_forward=1e3 * s / forwards[key],
                     cost_ratio=(s / forwards[key]) / (ar_s / ar_fwd), speedup=ar_s / s,
                     compile_s=max(first[key] - s, 0.0)))
  for r in rows:
    print(json.dumps(r), flush=True)
  return rows


def _numbers(flag: str, values, kind, allowed=None, low=None, high=None) -> list:
  """The values of a list flag as numbers of `kind`, each allowed (a recorded one) or in
  [low, high]; else one line naming the flag and what it allows."""
  try:
    out = [kind(v) for v in values]
  except ValueError:
    out = None
  if allowed is not None:
    ok = out is not None and set(out) <= set(allowed)
    what = (f"no recorded schedule in {FLAGS.schedules} (recorded: "
            f"{', '.join(map(str, sorted(allowed))) or 'none'})")
  else:
    ok = out is not None and all(low <= v <= high for v in out)
    what = f"each must be a{'n' if kind is int else ''} {kind.__name__} in [{low}, {high}]"
  if not ok:
    raise app.UsageError(f"--{flag}={','.join(map(str, values))}: {what}")
  return out


def run_entries(schedules: dict, run: str) -> tuple[str, list[int], list, list]:
  """One --runs entry: (SHAPE/DTYPE, prompt lengths, its diffusion entries, its draft-and-verify
  entries), every tau / B / K checked against the recorded schedules."""
  name, *narrow = run.split("@")
  lens, run_taus, run_blocks = (narrow + ["", "", ""])[:3]
  shape, _, dtype = name.partition("/")
  if dtype not in ("float32", "bfloat16") or len(narrow) > 3:
    raise app.UsageError(f"--runs: {run!r} is not SHAPE/DTYPE[@P1+P2[@T1+T2[@B1+B2]]] with "
                         "DTYPE float32 or bfloat16")
  shape_config(shape, dtype)  # a known shape
  entries, spec_entries = schedules["entries"], schedules.get("spec_entries", [])
  taus = _numbers("taus", run_taus.split("+") if run_taus else FLAGS.taus, float,
                  allowed={e["tau"] for e in entries})
  blocks = _numbers("block_sizes", run_blocks.split("+") if run_blocks else FLAGS.block_sizes,
                    int, allowed={e["block"] for e in entries})
  prompt_lens = _numbers("prompt_lengths", lens.split("+") if lens else FLAGS.prompt_lengths,
                         int, low=1, high=1 << 20)
  chosen = [e for e in entries if e["tau"] in taus and e["block"] in blocks]
  spec_chosen = []
  if spec_entries or FLAGS["spec_ks"].present or FLAGS["spec_taus"].present:
    ks = _numbers("spec_ks", FLAGS.spec_ks, int, allowed={e["k"] for e in spec_entries})
    spec_taus = _numbers("spec_taus", FLAGS.spec_taus, float,
                         allowed={e["tau"] for e in spec_entries})
    spec_chosen = [e for e in spec_entries if e["k"] in ks and e["tau"] in spec_taus]
  return name, prompt_lens, chosen, spec_chosen
