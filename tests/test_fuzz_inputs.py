"""Fuzz of the public entry points with random shapes, dtypes and out-of-range values.

Each call either returns finite output of the documented shape (when its input is valid by the
entry point's contract) or raises ValueError / TypeError whose message names the bad argument:
never NaN from valid-looking input, never a raw JAX / numpy / orbax error, never a valid input
refused. Entry points: qwen3.forward, qwen3.ragged_prefill, generate.generate,
decode.block_diffusion_generate, exports.load_model and data.answer.parse_answer (the re-ranking
tool's request reader is fuzzed in tests/test_rerank.py::test_fuzz_reader_never_raises).
The `tiny` preset with V = 32, fixed seeds, and one valid shape per entry point (so each
compiles once) keep the file fast.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from gr2jax import exports, load
from gr2jax.data import answer
from gr2jax.hf import table as hf_table
from gr2jax.model import generate, qwen3
from gr2jax.model.cache import init_cache
from gr2jax.model.config import ModelConfig
from gr2jax.model.params import abstract_params
from tests.diffusion import helpers
from tests.hf import safetensors_files

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

V, MASK = 32, 31
CONFIG = ModelConfig.tiny(vocab_size=V, hidden_size=32, head_dim=8, intermediate_size=64,
                          eos_token_ids=(2,), pad_token_id=0, mask_token_id=MASK, block_size=4)
B, T = 2, 3  # the one valid [B, T] shape


@pytest.fixture(scope="module")
def params():
  """Random params drawn with numpy (init_params' first eager call compiles for seconds)."""
  rng = np.random.default_rng(0)
  return jax.tree_util.tree_map_with_path(
    lambda path, s: jnp.asarray(1.0 + 0.1 * rng.standard_normal(s.shape) if "norm" in
                                path[-1].key else 0.1 * rng.standard_normal(s.shape), s.dtype),
    abstract_params(CONFIG))


def _int_arg(rng, name, shape, low, high, bad, *, allow_none=False):
  """(value, problem) for an integer-array argument valid as `shape` with values in [low, high).

  A valid value (any integer dtype, a list or a jax array) when not `bad`, else a random invalid
  one; problem is then the argument name (what the error must name), else None.
  """
  values = rng.integers(low, high, shape)
  if not bad:
    kind = rng.choice(["int32", "int64", "uint8", "list", "jax"])
    if kind == "list":
      return values.tolist(), None
    if kind == "jax":
      return jnp.asarray(values, jnp.int32), None
    return values.astype(kind), None
  forms = ["too_big", "negative", "huge", "float", "bool", "empty", "rank", "str", "ragged"]
  form = rng.choice(forms if allow_none else forms + ["none"])
  if form == "none":
    return None, name
  if form == "str":
    return "1 2 3", name
  if form == "ragged":
    return [[1, 2, 3], [1]], name
  flat = values.reshape(-1)
  if form in ("too_big", "negative", "huge"):
    flat = flat.astype(np.int64)
    flat[rng.integers(flat.size)] = {"too_big": high + rng.integers(3),
                                     "negative": low - 1 - rng.integers(3), "huge": 2**40}[form]
    return flat.reshape(shape), name
  if form == "float":
    return values.astype(np.float32), name
  if form == "bool":
    return values.astype(bool), name
  if form == "empty":
    empty = list(shape)
    empty[rng.integers(len(shape))] = 0
    return np.zeros(empty, np.int32), name
  return (values.reshape(shape + (1,)) if rng.random() < 0.5 else flat[:1].reshape(())), name


def _pick(rng, valid, invalid, name, bad):
  """(value, problem): a random valid value, or when `bad` a random invalid one (named)."""
  if bad:
    return invalid[rng.integers(len(invalid))], name
  return valid[rng.integers(len(valid))], None


def _target(rng, names):
  """Which argument this iteration corrupts: one of `names`, or None (a valid call) 1/3 of the
  time."""
  return None if rng.random() < 1 / 3 else names[rng.integers(len(names))]


def _call(fn, problems):
  """Runs fn(); returns its output when `problems` is empty, else checks the error names one."""
  problems = [p for p in problems if p]
  try:
    out = fn()
  except (ValueError, TypeError) as e:
    assert problems, f"a valid input was refused: {type(e).__name__}: {e}"
    assert any(p in str(e) for p in problems), f"{e!r} does not name any of {problems}"
    return None
  except Exception as e:  # noqa: BLE001 - exactly what the contract forbids
    pytest.fail(f"raw {type(e).__name__} (expected a named ValueError/TypeError for {problems}): "
                f"{e}")
  assert not problems, f"accepted invalid {problems}"
  return out


def _finite(x):
  assert np.isfinite(np.asarray(x)).all(), "NaN/inf from a valid input"


def test_forward(params):
  rng = np.random.default_rng(0)
  causal = np.tril(np.ones((T, T), bool))[None].repeat(B, 0)
  for _ in range(20):
    bad = _target(rng, ["tokens", "logits_at", "mask"])
    tokens, p1 = _int_arg(rng, "tokens", (B, T), 0, V, bad == "tokens")
    logits_at, p2 = _int_arg(rng, "logits_at", (B, 1 + rng.integers(2)), 0, T,
                             bad == "logits_at", allow_none=True)
    if bad != "logits_at" and rng.random() < 0.5:
      logits_at = None
    mask, p3 = _pick(rng, [None, causal], [causal.astype(np.float32), causal[:, :2], "causal"],
                     "mask", bad == "mask")
    out = _call(lambda: qwen3.forward(params, CONFIG, tokens, mask=mask,  # noqa: B023
                                      logits_at=logits_at), [p1, p2, p3])  # noqa: B023
    if out is not None:
      logits, _ = out
      assert logits.shape == (B, T if logits_at is None else np.asarray(logits_at).shape[1], V)
      _finite(logits)


def test_ragged_prefill(params):
  rng = np.random.default_rng(1)
  for _ in range(10):
    bad = _target(rng, ["tokens", "lengths"])
    tokens, p1 = _int_arg(rng, "tokens", (B, T), 0, V, bad == "tokens")
    lengths, p2 = _int_arg(rng, "lengths", (B,), 1, T + 1, bad == "lengths")
    out = _call(lambda: qwen3.ragged_prefill(params, CONFIG, tokens, lengths,  # noqa: B023
                                             init_cache(CONFIG, B, T + 2)), [p1, p2])
    if out is not None:
      logits, cache = out
      assert logits.shape == (B, V)
      _finite(logits)
      np.testing.assert_array_equal(cache.lengths, np.asarray(lengths))


def test_generate(params):
  rng = np.random.default_rng(2)
  names = ["prompt_tokens", "prompt_lengths", "max_new_tokens", "key"]
  for _ in range(20):
    bad = _target(rng, names)
    prompts, p1 = _int_arg(rng, names[0], (B, T), 0, V, bad == names[0])
    lengths, p2 = _int_arg(rng, names[1], (B,), 1, T + 1, bad == names[1], allow_none=True)
    new, p3 = _pick(rng, [2], [0, -3, 2.5, "2", True, None], names[2], bad == names[2])
    key, p4 = _pick(rng, [None, jax.random.key(1)], [5, "k", np.zeros(3), jnp.zeros(2)],
                    names[3], bad == names[3])
    out = _call(lambda: generate.generate(  # noqa: B023
      params, CONFIG, prompts, lengths, generate.ARDecoding(max_new_tokens=new),  # noqa: B023
      key=key),  # noqa: B023
                [p1, p2, p3, p4])
    if out is not None:
      assert out.tokens.shape == out.logprobs.shape == (B, 2)
      _finite(out.logprobs)
      assert ((np.asarray(out.tokens) >= 0) & (np.asarray(out.tokens) < V)).all()


def test_block_diffusion_generate(params):
  rng = np.random.default_rng(3)
  names = ["prompt_tokens", "prompt_lengths", "threshold", "temperature", "max_steps_per_block"]
  for _ in range(20):
    bad = _target(rng, names)
    prompts, p1 = _int_arg(rng, names[0], (B, T), 0, V, bad == names[0])
    lengths, p2 = _int_arg(rng, names[1], (B,), 1, T + 1, bad == names[1], allow_none=True)
    tau, p3 = _pick(rng, [0.9, 1.0, 0.3], [0.0, -0.1, 1.01, float("inf"), float("nan"), "0.9",
                                           None], names[2], bad == names[2])
    temp, p4 = _pick(rng, [0.0], [-1.0, float("nan"), float("inf")], names[3], bad == names[3])
    steps, p5 = _pick(rng, [4, 2], [0, 4.0, -1], names[4], bad == names[4])
    out = _call(lambda: helpers.generate(  # noqa: B023
      params, CONFIG, prompts, lengths, threshold=tau, temperature=temp,  # noqa: B023
      max_steps_per_block=steps, max_new_tokens=4),  # noqa: B023
      [p1, p2, p3, p4, p5])
    if out is not None:
      assert out.tokens.shape == out.commit_logprob.shape == (B, 4)
      _finite(out.commit_logprob)
      tokens, lengths = np.asarray(out.tokens), np.asarray(out.lengths)
      assert ((tokens >= 0) & (tokens < V)).all() and (lengths >= 1).all()
      assert all((tokens[i, : lengths[i]] != MASK).all() for i in range(B))
      assert (np.asarray(out.denoise_steps) >= 0).all() and (np.asarray(out.nfe) >= 1).all()


def _hf_dir(directory, config, params):
  os.makedirs(directory, exist_ok=True)
  with open(os.path.join(directory, "config.json"), "w") as f:
    json.dump({**config.to_hf_dict(), "dtype": "float32"}, f)
  tensors = dict(hf_table.export_tensors(jax.tree.map(np.asarray, params)))
  safetensors_files.write_file(os.path.join(directory, "model.safetensors"), tensors,
                            {"format": "pt"})
  return directory


def test_load_model(params, tmp_path):
  rng = np.random.default_rng(4)
  good_hf = _hf_dir(str(tmp_path / "good_hf"), CONFIG, params)
  good_ckpt = str(tmp_path / "good_ckpt")
  exports.save(good_ckpt, CONFIG, params)
  weights = os.path.join(good_hf, "model.safetensors")
  header_len = 8 + int.from_bytes(open(weights, "rb").read(8), "little")

  def variant(name, edit=None, base=good_hf):
    d = str(tmp_path / name)
    shutil.copytree(base, d)
    if edit:
      edit(d)
    return d

  def write(rel, data):
    def edit(d):
      mode = "wb" if isinstance(data, bytes) else "w"
      with open(os.path.join(d, rel), mode) as f:
        f.write(data)
    return edit

  def hf_config(**fields):
    d = {**CONFIG.to_hf_dict(), **fields}
    return write("config.json", json.dumps({k: v for k, v in d.items() if v is not None}))

  def corrupt_header(d):
    file = os.path.join(d, "model.safetensors")
    data = bytearray(open(file, "rb").read())
    for i in rng.integers(0, header_len, 1 + rng.integers(4)):
      data[i] = rng.integers(256)
    open(file, "wb").write(bytes(data))

  cases = {
    "empty_dir": (str(tmp_path / "empty"), False),
    "missing": (str(tmp_path / "nowhere"), False),
    "config_bytes": (variant("cb", write("config.json", rng.bytes(50))), False),
    "config_list": (variant("cl", write("config.json", "[1, 2]")), False),
    "config_no_hidden": (variant("cn", hf_config(hidden_size=None)), False),
    "config_negative": (variant("cneg", hf_config(num_hidden_layers=-2)), False),
    "config_string": (variant("cs", hf_config(vocab_size="lots")), False),
    "config_wrong_vocab": (variant("cv", hf_config(vocab_size=V + 1)), False),
    "no_weights": (variant("nw", lambda d: os.remove(os.path.join(d, "model.safetensors"))),
                   False),
    "weights_bytes": (variant("wb", write("model.safetensors", rng.bytes(300))), False),
    "weights_truncated": (variant("wt", lambda d: os.truncate(
      os.path.join(d, "model.safetensors"), os.path.getsize(weights) - 7)), False),
    "bad_index": (variant("bi", write("model.safetensors.index.json", "{\"weight_map\": 3}")),
                  False),
    "gr2jax_bytes": (variant("gb", write(exports.CONFIG_FILE, rng.bytes(40)), good_ckpt),
                     False),
    "gr2jax_no_params": (variant("gp", lambda d: shutil.rmtree(os.path.join(d, "params")),
                                 good_ckpt), False),
    "gr2jax_field": (variant("gf", write(exports.CONFIG_FILE, json.dumps(
      {**exports.config_to_dict(CONFIG), "num_layers": 0})), good_ckpt), False),
    "good_hf": (good_hf, True),
    "good_ckpt": (good_ckpt, True),
  }
  cases |= {f"header_{i}": (variant(f"h{i}", corrupt_header), None) for i in range(6)}
  for name, (path, valid) in cases.items():
    try:
      config, loaded = load.load_model(path)
    except (ValueError, TypeError) as e:
      assert not valid, f"{name}: a valid checkpoint was refused: {e}"
      assert path in str(e), f"{name}: {e!r} does not name {path}"
      continue
    except Exception as e:  # noqa: BLE001
      pytest.fail(f"{name}: raw {type(e).__name__}: {e}")
    assert valid is not False, f"{name}: loaded a damaged checkpoint"
    assert config.vocab_size == V
    for leaf in jax.tree.leaves(loaded):
      _finite(leaf)
  with pytest.raises(TypeError, match="path must be a directory path"):
    load.load_model(123)


FRAGMENTS = ["<think>", "</think>", "{", "}", "[", "]", ",", ":", '"', "\\", " ", "\n", "x",
             '"ranking"', "null", "1", "<|im_end|>", "<|endoftext|>", '{"ranking":[',
             '"<slot_0>"', '"<slot_1>"', '"<slot_2>"', '"<slot_9>"', "]}", "\u00e9", "\x00"]


def test_parse_answer():
  rng = np.random.default_rng(5)
  labels = ("<slot_0>", "<slot_1>", "<slot_2>")
  for _ in range(400):
    text = "".join(rng.choice(FRAGMENTS, rng.integers(0, 14)))
    if rng.random() < 0.3:  # mostly-right answers exercise the later kinds
      order = [labels[i] for i in rng.permutation(3)][: rng.integers(1, 4)]
      text = "<think>\nr\n</think>\n\n" + json.dumps({"ranking": order}) + text[:2]
    got = _call(lambda: answer.parse_answer(text, labels), [])  # noqa: B023
    assert got.kind in answer.KINDS
    assert sorted(got.ranking.tolist()) == [0, 1, 2]
  bad = [(7, labels, "text"), (b"{}", labels, "text"), ("{}", "abc", "candidate_labels"),
         ("{}", None, "candidate_labels"), ("{}", (1, 2), "candidate_labels"),
         ("{}", ("a", "a"), "candidate_labels")]
  for text, cand, name in bad:
    _call(lambda: answer.parse_answer(text, cand), [name])  # noqa: B023
