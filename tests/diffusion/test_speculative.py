"""Draft-and-verify decoding on small random models (fp32, CPU).

Shape A (ModelConfig.tiny at vocab 256) shares its weights between drafter and verifier, with the
attention output scaled down so a token's prediction depends mostly on the token itself: the
block-diffusion drafter then agrees with the AR verifier often, and full, partial and rejected
drafts, commit forwards and rollbacks all occur. Shape B (ModelConfig.tiny_wide, tied
embeddings) has an independent random drafter (nearly every draft rejected). The decoder
compiles once per static shape: the default run compiles it once (shape A, batch 4, ragged);
batch 1, shape B, sampling end to end, the self-speculative mode and the replay are `slow`.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import scipy.stats

from experiments import emulate
from gr2jax.diffusion import decode
from gr2jax.diffusion import speculative as sp
from gr2jax.model import generate, masks, qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import init_params
from tests.diffusion import helpers

V = 256
MASK = V - 1
MAX_NEW = 40
AR_A = ModelConfig.tiny(vocab_size=V, eos_token_ids=(), pad_token_id=0)
AR_B = ModelConfig.tiny_wide(vocab_size=V, tie_word_embeddings=True, eos_token_ids=(),
                             pad_token_id=0)
SPEC = sp.DraftDecoding(max_new_tokens=MAX_NEW, k=4, draft_tau=0.9, draft_steps=8)
PROMPTS = np.asarray(jax.random.randint(jax.random.key(1), (4, 12), 1, MASK), np.int32)
LENGTHS = np.asarray([12, 7, 3, 9], np.int32)


def _diffusion(config, block_size=8):
  return dataclasses.replace(config, block_size=block_size, mask_token_id=MASK)


@pytest.fixture(scope="module")
def pair_a():
  """(drafter, verifier) of shape A: one set of weights, attention output x 0.05."""
  params = init_params(AR_A, jax.random.key(0))
  params = {**params, "layers": {**params["layers"], "o": params["layers"]["o"] * 0.05}}
  return sp.Model(params, _diffusion(AR_A)), sp.Model(params, AR_A)


@pytest.fixture(scope="module")
def run_a(pair_a):
  """Shape A, batch 4, ragged prompts: (SpecOutput, verifier cache, drafter cache)."""
  drafter, verifier = pair_a
  return sp._generate("test", drafter, verifier, PROMPTS, LENGTHS, SPEC, None)


def _assert_generates_the_same(verifier, prompts, lengths, out):
  ref = generate.generate(verifier.params, verifier.config, prompts, lengths,
                          generate.ARDecoding(max_new_tokens=MAX_NEW))
  diverged = emulate.first_divergence(verifier, prompts, lengths, out.tokens, ref.tokens)
  assert not diverged, f"speculative != generate (first divergent token, logit margin): {diverged}"
  np.testing.assert_array_equal(out.lengths, ref.lengths)


def test_greedy_equals_generate_with_accepted_and_rejected_drafts(pair_a, run_a):
  out = run_a[0]
  _assert_generates_the_same(pair_a[1], PROMPTS, LENGTHS, out)
  steps = np.asarray(out.verify_forwards)
  drafted, accepted = np.asarray(out.step_drafted), np.asarray(out.step_accepted)
  real = np.arange(MAX_NEW)[None, :] < steps[:, None]
  assert ((accepted == drafted) & (drafted > 0) & real).any()  # a whole draft accepted
  assert ((accepted < drafted) & real).any()  # a rejection (rollback)
  np.testing.assert_array_equal(accepted.sum(1), out.accepted)
  np.testing.assert_array_equal(out.lengths, 1 + steps + np.asarray(out.accepted))
  np.testing.assert_array_equal(np.asarray(out.step_draft_forwards).sum(1), out.draft_forwards)
  assert int(out.num_steps) == steps.max()
  # token_step: the first token from the prefill, then each step's tokens in order.
  ts = np.asarray(out.token_step)
  assert (ts[:, 0] == sp.FIRST_STEP).all() and (np.diff(ts, axis=1) >= 0).all()
  for b in range(4):
    np.testing.assert_array_equal(np.bincount(ts[b, 1:], minlength=steps[b])[:steps[b]],
                                  accepted[b, :steps[b]] + 1)


def test_greedy_equals_generate_with_a_distinct_order_drafter(pair_a):
  spec = dataclasses.replace(SPEC, draft_tau=0.01, commit_order="distinct")
  out = sp.speculative_generate(*pair_a, PROMPTS, LENGTHS, spec)
  _assert_generates_the_same(pair_a[1], PROMPTS, LENGTHS, out)


def _pair_b():
  verifier = sp.Model(init_params(AR_B, jax.random.key(2)), AR_B)
  return sp.Model(init_params(_diffusion(AR_B), jax.random.key(3)), _diffusion(AR_B)), verifier


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["a", "b"])
def test_greedy_equals_generate_at_batch_1(pair_a, shape):
  drafter, verifier = pair_a if shape == "a" else _pair_b()
  for b in range(4):  # each prompt alone
    out = sp.speculative_generate(drafter, verifier, PROMPTS[b:b + 1], LENGTHS[b:b + 1], SPEC)
    _assert_generates_the_same(verifier, PROMPTS[b:b + 1], LENGTHS[b:b + 1], out)


@pytest.mark.slow
def test_greedy_equals_generate_shape_b_batch_4():
  drafter, verifier = _pair_b()
  out = sp.speculative_generate(drafter, verifier, PROMPTS, LENGTHS, SPEC)
  _assert_generates_the_same(verifier, PROMPTS, LENGTHS, out)


def _valid_slots(cache, row: int, n: int) -> np.ndarray:
  """[2, L, K, n, H] keys and values of a row's first n slots (the one reader of cache.k / .v)."""
  k = len(cache.v[0]) // cache.batch
  rows = slice(row * k, (row + 1) * k)
  return np.stack([np.stack([np.asarray(x[rows, :, :n]).swapaxes(1, 2) for x in cache.k]),
                   np.stack([np.asarray(x[rows, :n]) for x in cache.v])])


_fresh = jax.jit(qwen3.forward, static_argnums=1, static_argnames="update_cache")


def test_caches_after_rollback_equal_a_fresh_prefill(pair_a, run_a):
  """Verifier: prompt + every token but the last, causal. Drafter: prompt causal + its complete
  blocks block-bidirectional (exactly decode.py's commit forwards). Both fresh caches are one
  forward of the four rows, right-padded."""
  drafter, verifier = pair_a
  out, v_cache, d_cache = run_a
  tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
  width = PROMPTS.shape[1] + MAX_NEW
  seqs = np.zeros((4, width), np.int32)
  for b in range(4):
    seqs[b, :LENGTHS[b] + MAX_NEW] = np.concatenate([PROMPTS[b, :LENGTHS[b]], tokens[b]])
  v_valid = LENGTHS + lengths - 1  # prompt + every token but the last
  d_valid = np.asarray(d_cache.lengths)
  np.testing.assert_array_equal(v_cache.lengths, v_valid)
  assert ((d_valid - LENGTHS) % 8 == 0).all() and (d_valid - LENGTHS <= lengths).all()
  pos = jnp.broadcast_to(jnp.arange(width), (4, width))
  fresh = {}
  for name, model, valid, block in (("verifier", verifier, v_valid, 1),
                                    ("drafter", drafter, d_valid, 8)):
    mask = masks.make_attention_mask(pos, pos, masks.padding_mask(valid, width), LENGTHS, block)
    empty = jnp.zeros((4, width, width), bool)  # the fresh cache's slots: nothing to attend to
    fresh[name] = _fresh(model.params, model.config, seqs, pos,
                         jnp.concatenate([empty, mask], -1), init_cache(model.config, 4, width),
                         update_cache=True)[1]
  worst = {name: max(float(np.abs(_valid_slots(cache, b, n) - _valid_slots(fresh[name], b, n))
                           .max()) for b, n in enumerate(valid))
           for name, cache, valid in (("verifier", v_cache, v_valid),
                                      ("drafter", d_cache, d_valid))}
  assert max(worst.values()) < 1e-5, worst


def _toy_distributions(rng, v, shape):
  return rng.dirichlet(np.full(v, 0.7), size=shape)


def test_speculative_sampling_rule_reproduces_the_verifier_distribution():
  """Toy vocab of 4, K = 2: drafts from prefix-dependent q, the rule, then the verifier's own
  conditionals past the committed tokens: the 3-token joint must be the verifier's (chi-square).
  The same check with a wrong q (the ratio uses another distribution) must fail."""
  rng = np.random.default_rng(0)
  v, m = 4, 1 << 16
  p1, p2, p3 = (_toy_distributions(rng, v, s) for s in ((), (v,), (v, v)))
  q1, q2 = _toy_distributions(rng, v, ()), _toy_distributions(rng, v, (v,))
  q1[0] = 1e-9  # the drafter almost never proposes a token the verifier likes
  q1 /= q1.sum()
  d1 = rng.choice(v, size=m, p=q1)
  d2 = np.minimum((rng.random(m)[:, None] > np.cumsum(q2[d1], axis=1)).sum(1), v - 1)
  num = rng.integers(0, 3, size=m)  # K_eff in 0..2
  p_logp = np.log(np.stack([np.broadcast_to(p1, (m, v)), p2[d1], p3[d1, d2]], axis=1))
  exact = p1[:, None, None] * p2[:, :, None] * p3
  accept = jax.jit(sp.speculative_accept)

  def joint(q_logp):
    a, bonus = (np.asarray(x) for x in accept(jnp.asarray(p_logp, jnp.float32),
                                              jnp.asarray(q_logp, jnp.float32),
                                              jnp.asarray(np.stack([d1, d2], 1), jnp.int32),
                                              jnp.asarray(num, jnp.int32), jax.random.key(0)))
    assert (a <= num).all()
    seq = np.stack([d1, d2, np.zeros(m, int)], axis=1)
    seq[np.arange(m), a] = bonus
    for i in range(3):  # past the step's tokens: the verifier's own samples
      todo = np.flatnonzero(a < i)
      cond = [p1, p2, p3][i][tuple(seq[todo, :i].T)] if i else np.broadcast_to(p1, (len(todo), v))
      draw = rng.random(len(todo))[:, None] > np.cumsum(cond, axis=1)
      seq[todo, i] = np.minimum(draw.sum(1), v - 1)
    return np.bincount(seq @ np.array([v * v, v, 1]), minlength=v ** 3)

  q_logp = np.log(np.stack([np.broadcast_to(q1, (m, v)), q2[d1]], axis=1))
  expected = exact.ravel() * m
  assert scipy.stats.chisquare(joint(q_logp), expected).pvalue > 1e-3
  wrong = np.log(np.full((m, 2, v), 1 / v))
  assert scipy.stats.chisquare(joint(wrong), expected).pvalue < 1e-6


@pytest.mark.slow
def test_sampled_decode_is_distributed_as_the_verifier():
  """End to end at temperature 1: a left-to-right multi-step draft of K = 2 on a vocab of 8; the
  joint of response tokens 1 and 2 (the ones drafts decide) over 8,192 rows vs the verifier's
  exact marginal, from its conditionals."""
  v, m = 8, 8192
  ar = ModelConfig.tiny(vocab_size=v, eos_token_ids=(), pad_token_id=0)
  diff = dataclasses.replace(ar, block_size=4, mask_token_id=v - 1)
  verifier = sp.Model(init_params(ar, jax.random.key(4)), ar)
  drafter = sp.Model(init_params(diff, jax.random.key(5)), diff)
  prompt = np.array([[1, 2, 3]], np.int32)
  spec = sp.DraftDecoding(max_new_tokens=4, temperature=1.0, k=2, draft_tau=0.3, draft_steps=2,
                          commit_order="left_to_right")
  out = sp.speculative_generate(drafter, verifier, np.repeat(prompt, m, 0), None, spec,
                                key=jax.random.key(6))
  assert int(np.asarray(out.accepted).sum()) > 0
  seqs = np.stack(np.meshgrid(*[np.arange(v)] * 3, indexing="ij"), -1).reshape(-1, 3)
  logits = qwen3.forward(verifier.params, ar, jnp.asarray(np.concatenate(
    [np.repeat(prompt, len(seqs), 0), seqs], 1)))[0]
  probs = np.asarray(jax.nn.softmax(logits, -1))  # [V^3, 6, V]
  p0 = probs[0, 2]
  p1 = probs[::v * v, 3]  # [V] x0 -> p(x1 | x0)
  p2 = probs[::v, 4].reshape(v, v, v)  # (x0, x1) -> p(x2 | x0, x1)
  exact = np.einsum("a,ab,abc->bc", p0.astype(np.float64), p1, p2).ravel()
  exact /= exact.sum()  # the f32 marginal sums to 1 within ~1e-7; chisquare wants 1.5e-8
  tokens = np.asarray(out.tokens)
  counts = np.bincount(tokens[:, 1] * v + tokens[:, 2], minlength=v * v)
  assert scipy.stats.chisquare(counts, exact * m).pvalue > 1e-3


@pytest.mark.slow
def test_self_speculative_equals_the_drafters_block_size_one_decode(pair_a):
  drafter = pair_a[0]
  verifier = helpers.self_verifier(drafter)
  out = sp.speculative_generate(drafter, verifier, PROMPTS, LENGTHS, SPEC)
  ref = decode.block_diffusion_generate(verifier.params, verifier.config, PROMPTS, LENGTHS,
                                        decode.BlockDecoding(threshold=1.0, max_steps_per_block=1,
                                                             max_new_tokens=MAX_NEW))
  np.testing.assert_array_equal(out.tokens, ref.tokens)


@pytest.mark.slow
def test_replay_runs_the_recorded_forwards_on_other_weights(pair_a, run_a):
  out = jax.device_get(run_a[0])
  rows = emulate.schedule_from_output(out, 8)
  width = max(map(len, rows))
  schedule = np.full((4, width + 3, 2), -1, np.int32)
  for b, row in enumerate(rows):
    schedule[b, :len(row)] = row
  other = init_params(AR_A, jax.random.key(9))
  drafter, verifier = sp.Model(other, _diffusion(AR_A)), sp.Model(other, AR_A)
  replayed = emulate.speculative_replay(drafter, verifier, PROMPTS, LENGTHS, SPEC, schedule)
  for field in ("lengths", "verify_forwards", "draft_forwards", "accepted", "step_drafted",
                "step_accepted", "step_draft_forwards"):
    np.testing.assert_array_equal(getattr(replayed, field), getattr(out, field), err_msg=field)


def _bad(pair, **change):
  drafter, verifier = pair
  args = dict(drafter=drafter, verifier=verifier, prompt_tokens=PROMPTS, prompt_lengths=LENGTHS,
              decoding=SPEC)
  args.update(change)
  return args


def _spec(**fields):
  return dataclasses.replace(SPEC, **fields)


@pytest.mark.parametrize("change, error, match", [
  (lambda d, v: dict(drafter=v), ValueError, "drafter has no mask token"),
  (lambda d, v: dict(verifier=d), ValueError, "verifier has block_size=8"),
  (lambda d, v: dict(verifier=sp.Model(v.params, dataclasses.replace(v.config,
                                                                     eos_token_ids=(3,)))),
   ValueError, r"eos_token_ids=\(\) differs from the verifier's \(3,\)"),
  (lambda d, v: dict(verifier=sp.Model(v.params, dataclasses.replace(v.config, pad_token_id=1))),
   ValueError, "pad_token_id=0 differs"),
  (lambda d, v: dict(verifier=sp.Model(v.params, dataclasses.replace(v.config, vocab_size=512))),
   ValueError, r"verifier.params\['embed'\]"),
  (lambda d, v: dict(decoding=_spec(k=16)), ValueError, "k=16 exceeds the drafter's block size 8"),
  (lambda d, v: dict(decoding=(4, 0.9, 8)), TypeError,
   "decoding must be of type DraftDecoding, got tuple"),
  (lambda d, v: dict(decoding=_spec(temperature=-1.0)), ValueError,
   "temperature=-1.0 must be >= 0"),
  (lambda d, v: dict(decoding=_spec(temperature=1.0, commit_order="left_to_right")), ValueError,
   "needs a PRNG key"),
  (lambda d, v: dict(decoding=_spec(temperature=1.0), key=jax.random.key(0)), ValueError,
   "commit_order='confidence' and 8 draft steps is not lossless"),
  (lambda d, v: dict(decoding=_spec(temperature=1.0, commit_order="distinct")), ValueError,
   "commit_order='distinct' and 8 draft steps is not lossless"),
  (lambda d, v: dict(decoding=_spec(max_new_tokens=0)), ValueError,
   "max_new_tokens=0 must be >= 1"),
  (lambda d, v: dict(decoding=_spec(stop_token_ids=(3, V))), ValueError,
   r"stop_token_ids\[1\] = 256 is outside the vocab"),
  (lambda d, v: dict(prompt_lengths=np.array([12, 7, 3, 13])), ValueError, "prompt_lengths"),
  (lambda d, v: dict(drafter=(d.params,)), TypeError, "drafter must be a Model"),
])
def test_bad_arguments_are_named_before_tracing(pair_a, change, error, match):
  with pytest.raises(error, match=match):
    sp.speculative_generate(**_bad(pair_a, **change(*pair_a)))


@pytest.mark.parametrize("fields, error, match", [
  (dict(k=0), ValueError, "k=0 must be >= 1"),
  (dict(draft_tau=1.5), ValueError, r"draft_tau=1.5 must be in \[0, 1\]"),
  (dict(draft_tau=float("nan")), ValueError, "draft_tau=nan must be finite"),
  (dict(draft_steps=0), ValueError, "draft_steps=0 must be >= 1"),
  (dict(commit_order="random"), ValueError, "commit_order='random' not in"),
  (dict(max_new_tokens=True), TypeError, "max_new_tokens must be an int"),
])
def test_bad_draft_decoding(fields, error, match):
  with pytest.raises(error, match=match):
    sp.DraftDecoding(**{"max_new_tokens": MAX_NEW, **fields})
