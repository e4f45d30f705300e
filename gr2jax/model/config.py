"""ModelConfig: the frozen, hashable description of a dense Qwen3 model (+ block-diffusion fields).

The config is passed to jitted functions as a static argument, so it must stay hashable (tuples, not
lists). `from_hf_dict` reads any dense Qwen3 `config.json` (0.6B..32B) and refuses, naming the
field, every feature this implementation does not have (rope scaling, MoE, sliding window,
attention bias, another activation), so an unsupported checkpoint is an error rather than silently
wrong logits.
"""

import dataclasses
import json
import os
from typing import Any

DTYPES = ("float32", "bfloat16")
REMAT = ("none", "full")
ATTENTION_IMPLS = ("reference", "cudnn", "splash", "auto")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """A dense Qwen3 decoder.

  Attributes:
    vocab_size: V, rows of the embedding and columns of the LM head.
    hidden_size: D, the residual width.
    num_layers: L, decoder layers (stacked on the leading axis of every layer param).
    num_heads: N, query heads.
    num_kv_heads: K, key/value heads; N must be a multiple of K (GQA group G = N // K).
    head_dim: H, per-head width (explicit: Qwen3 uses 128 even where D // N differs).
    intermediate_size: F, SwiGLU MLP width.
    rope_theta: RoPE base frequency.
    rms_norm_eps: epsilon of every RMSNorm (layer, q/k and final norms).
    tie_word_embeddings: if True the LM head is `embed.T` and there is no 'lm_head' param.
    max_position_embeddings: the largest position + 1 a cache may be sized for.
    param_dtype: storage dtype of the params, 'float32' or 'bfloat16'.
    compute_dtype: dtype of activations and the KV cache; norms, softmax and logits are fp32.
    block_size: block-diffusion block size B (1 = autoregressive); used by gr2jax.diffusion.
    mask_token_id: the diffusion <|mask|> token id, or None for an AR model.
    bos_token_id: beginning-of-sequence id, or None (Qwen3 prompts start with a chat template).
    eos_token_ids: ids that end a generated sequence (any of them stops decoding).
    pad_token_id: id written after a sequence stops and used to right-pad prompts; from_hf_dict
      falls back to the first eos id when config.json has none.
    remat: training hook: 'none' keeps every layer's activations for the backward pass, 'full'
      recomputes each layer in the backward pass (jax.checkpoint on the layer scan body).
    attention_chunk_bytes: f32 attention-score budget of one query chunk; 0 picks it from
      jax.default_backend() (decoding); training configs set it explicitly so a train step
      traces the same on every backend.
    attention_impl: the attention kernel (gr2jax/model/attention.py): 'reference' (the einsum
      path, the CPU default), 'cudnn' (GPU, bf16; its decode steps run the Pallas Triton
      decode kernel, gr2jax/model/decode_attention.py), 'splash' (TPU Pallas) or 'auto' (by
      jax.default_backend()); exact up to float error, never written to config.json.
  """

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  num_kv_heads: int
  head_dim: int
  intermediate_size: int
  rope_theta: float = 1_000_000.0
  rms_norm_eps: float = 1e-6
  tie_word_embeddings: bool = False
  max_position_embeddings: int = 40960
  param_dtype: str = "float32"
  compute_dtype: str = "float32"
  block_size: int = 1
  mask_token_id: int | None = None
  bos_token_id: int | None = None
  eos_token_ids: tuple[int, ...] = ()
  pad_token_id: int = 0
  remat: str = "none"
  attention_chunk_bytes: int = 0
  attention_impl: str = "reference"

  def __post_init__(self):
    for name in ("vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                 "head_dim", "intermediate_size", "max_position_embeddings", "block_size"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"ModelConfig.{name} must be a positive int, got {value!r}")
    if self.num_heads % self.num_kv_heads:
      raise ValueError(f"ModelConfig.num_heads={self.num_heads} is not a multiple of "
                       f"num_kv_heads={self.num_kv_heads}")
    if self.head_dim % 2:
      raise ValueError(f"ModelConfig.head_dim={self.head_dim} must be even for RoPE")
    for name in ("param_dtype", "compute_dtype"):
      if getattr(self, name) not in DTYPES:
        raise ValueError(f"ModelConfig.{name}={getattr(self, name)!r} not in {DTYPES}")
    if not isinstance(self.eos_token_ids, tuple):
      raise TypeError(f"ModelConfig.eos_token_ids must be a tuple (hashable), got "
                      f"{type(self.eos_token_ids).__name__}")
    if self.remat not in REMAT:
      raise ValueError(f"ModelConfig.remat={self.remat!r} not in {REMAT}")
    if not isinstance(self.attention_chunk_bytes, int) or self.attention_chunk_bytes < 0:
      raise ValueError(f"ModelConfig.attention_chunk_bytes must be an int >= 0, got "
                       f"{self.attention_chunk_bytes!r}")
    if self.attention_impl not in ATTENTION_IMPLS:
      raise ValueError(f"ModelConfig.attention_impl={self.attention_impl!r} not in "
                       f"{ATTENTION_IMPLS}")
    for name, value in (("rope_theta", self.rope_theta), ("rms_norm_eps", self.rms_norm_eps)):
      if not value > 0:
        raise ValueError(f"ModelConfig.{name} must be > 0, got {value!r}")

  # ---- presets -------------------------------------------------------------------------------

  @classmethod
  def tiny(cls, **overrides) -> "ModelConfig":
    """2 layers, 1.44M params with an untied head (docs/results/benchmarks.md); the fast
    preset of tests and benchmarks."""
    return cls(**{**dict(vocab_size=4096, hidden_size=128, num_layers=2, num_heads=4,
                         num_kv_heads=2, head_dim=32, intermediate_size=384), **overrides})

  @classmethod
  def tiny_deep(cls, **overrides) -> "ModelConfig":
    """`tiny` with 4 layers instead of 2: the tiny recipe's model (gr2jax/recipes.py; the CFT
    validity-vs-size curve, docs/results/cft_validity_and_speedup.md)."""
    return cls.tiny(**{**dict(num_layers=4), **overrides})

  @classmethod
  def tiny_wide(cls, **overrides) -> "ModelConfig":
    """`tiny` at twice the width: hidden, head and MLP widths x2, 2 layers (the CFT
    validity-vs-size curve)."""
    return cls.tiny(**{**dict(hidden_size=256, head_dim=64, intermediate_size=768), **overrides})

  @classmethod
  def small(cls, **overrides) -> "ModelConfig":
    """5.25M params untied (docs/results/benchmarks.md): longer CPU runs, GPU smoke tests."""
    return cls(**{**dict(vocab_size=4096, hidden_size=256, num_layers=4, num_heads=4,
                         num_kv_heads=2, head_dim=64, intermediate_size=768), **overrides})

  @classmethod
  def qwen3_0_6b(cls, **overrides) -> "ModelConfig":
    """Qwen/Qwen3-0.6B as in its config.json (tied embeddings)."""
    return cls(**{**dict(vocab_size=151936, hidden_size=1024, num_layers=28, num_heads=16,
                         num_kv_heads=8, head_dim=128, intermediate_size=3072,
                         tie_word_embeddings=True, bos_token_id=151643,
                         eos_token_ids=(151645,), pad_token_id=151645), **overrides})

  @classmethod
  def qwen3_8b(cls, **overrides) -> "ModelConfig":
    """Qwen/Qwen3-8B as in its config.json (untied LM head)."""
    return cls(**{**dict(vocab_size=151936, hidden_size=4096, num_layers=36, num_heads=32,
                         num_kv_heads=8, head_dim=128, intermediate_size=12288,
                         bos_token_id=151643, eos_token_ids=(151645,), pad_token_id=151645),
                  **overrides})

  @classmethod
  def preset(cls, name: str, what: str = "preset", **overrides) -> "ModelConfig":
    """The preset `name` (PRESETS) with `overrides`; ValueError naming `what` (the flag or
    field that chose it) and the presets otherwise."""
    if name not in PRESETS:
      raise ValueError(f"{what}={name!r}: not a ModelConfig preset; expected one of "
                       f"{list(PRESETS)}")
    return getattr(cls, name)(**overrides)

  # ---- HF config.json ------------------------------------------------------------------------

  @classmethod
  def from_hf_dict(cls, d: dict[str, Any], **overrides) -> "ModelConfig":
    """Reads a dense Qwen3 HF config dict (transformers 4.5x or 5.x layout).

    Args:
      d: the parsed config.json.
      **overrides: ModelConfig fields to set instead of the file's (e.g. param_dtype='bfloat16').

    Returns:
      The ModelConfig.

    Raises:
      ValueError naming the field for anything this implementation does not support.
    """
    _check_supported(d)
    for key in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size"):
      if key not in d:
        raise ValueError(f"HF config: required field {key!r} is missing")
    num_heads = d["num_attention_heads"]
    eos = d.get("eos_token_id")
    eos_ids = () if eos is None else tuple(eos) if isinstance(eos, list | tuple) else (eos,)
    pad = d.get("pad_token_id")
    fields = dict(
        vocab_size=d["vocab_size"], hidden_size=d["hidden_size"],
        num_layers=d["num_hidden_layers"], num_heads=num_heads,
        num_kv_heads=d.get("num_key_value_heads") or num_heads,
        head_dim=d.get("head_dim") or d["hidden_size"] // num_heads,
        intermediate_size=d["intermediate_size"], rope_theta=float(_rope_theta(d)),
        rms_norm_eps=float(d.get("rms_norm_eps", 1e-6)),
        tie_word_embeddings=bool(d.get("tie_word_embeddings", False)),
        max_position_embeddings=d.get("max_position_embeddings", 40960),
        block_size=d.get("block_size", 1), mask_token_id=d.get("mask_token_id"),
        bos_token_id=d.get("bos_token_id"), eos_token_ids=eos_ids,
        pad_token_id=pad if pad is not None else (eos_ids[0] if eos_ids else 0))
    return cls(**{**fields, **overrides})

  @classmethod
  def from_hf_dir(cls, path: str, **overrides) -> "ModelConfig":
    """Reads `<path>/config.json` (see from_hf_dict)."""
    file = os.path.join(path, "config.json")
    try:
      with open(file) as f:
        d = json.load(f)
    except FileNotFoundError:
      raise FileNotFoundError(f"{file}: no config.json in the HF directory") from None
    except json.JSONDecodeError as e:
      raise ValueError(f"{file}:{e.lineno}: invalid JSON ({e.msg})") from None
    try:
      return cls.from_hf_dict(d, **overrides)
    except (ValueError, TypeError) as e:
      raise ValueError(f"{file}: {e}") from None

  def to_hf_dict(self) -> dict[str, Any]:
    """An HF `Qwen3Config` dict that transformers (4.5x and 5.x) loads; round-trips from_hf_dict."""
    d = {
        "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3",
        "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
        "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.num_kv_heads, "head_dim": self.head_dim,
        "intermediate_size": self.intermediate_size, "hidden_act": "silu",
        "rope_theta": self.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": self.rope_theta},
        "rope_scaling": None, "rms_norm_eps": self.rms_norm_eps,
        "tie_word_embeddings": self.tie_word_embeddings,
        "max_position_embeddings": self.max_position_embeddings,
        "attention_bias": False, "attention_dropout": 0.0, "use_sliding_window": False,
        "sliding_window": None, "max_window_layers": self.num_layers,
        "torch_dtype": self.param_dtype, "bos_token_id": self.bos_token_id,
        "eos_token_id": (list(self.eos_token_ids) if len(self.eos_token_ids) != 1
                         else self.eos_token_ids[0]),
        "pad_token_id": self.pad_token_id,
    }
    if self.block_size != 1 or self.mask_token_id is not None:
      d.update(block_size=self.block_size, mask_token_id=self.mask_token_id)
    return d


def _rope_theta(d: dict[str, Any]) -> float:
  """rope_theta from `rope_parameters` (transformers 5.x) or the top level (4.x); HF's default."""
  params = d.get("rope_parameters") or {}
  if "rope_theta" in params:
    return params["rope_theta"]
  if "rope_theta" in d:
    return d["rope_theta"]
  if params:
    raise ValueError("HF config: field 'rope_parameters.rope_theta' is missing")
  return 10_000.0  # transformers' Qwen3Config default


def _check_supported(d: dict[str, Any]) -> None:
  """Raises ValueError naming the first field that asks for an unimplemented feature."""
  if d.get("model_type", "qwen3") != "qwen3":
    raise ValueError(f"HF config: model_type={d['model_type']!r} is not supported (only dense "
                     "'qwen3')")
  for field in ("rope_scaling", "rope_parameters"):
    rope = d.get(field)
    if rope:
      kind = rope.get("rope_type", rope.get("type", "default"))
      if kind != "default":
        raise ValueError(f"HF config: {field}.rope_type={kind!r} is not supported (only "
                         "'default' RoPE)")
  for field in ("num_experts", "num_local_experts", "n_routed_experts"):
    if d.get(field):
      raise ValueError(f"HF config: {field}={d[field]!r} (MoE) is not supported")
  if d.get("use_sliding_window"):
    raise ValueError("HF config: use_sliding_window=true is not supported")
  layer_types = d.get("layer_types") or []
  if any(t != "full_attention" for t in layer_types):
    raise ValueError(f"HF config: layer_types={layer_types!r} is not supported (only "
                     "'full_attention')")
  if d.get("attention_bias"):
    raise ValueError("HF config: attention_bias=true is not supported")
  if d.get("hidden_act", "silu") != "silu":
    raise ValueError(f"HF config: hidden_act={d['hidden_act']!r} is not supported (only 'silu')")
  if d.get("attention_dropout"):
    raise ValueError(f"HF config: attention_dropout={d['attention_dropout']!r} is not supported")
  check_retired_fields(d, "HF config")


# Fields a ModelConfig once had: {field: (the value every config without the feature held, the
# feature)}. Files written then record them (an export's gr2jax_config.json holds every field);
# one at that value reads as a config without it, another value is refused
# (check_retired_fields). Cache keys computed then hashed them at that value, so
# decoding/evaluation.cache_key adds them back (`retired_defaults`).
RETIRED_FIELDS = {
  # CFT's `pivot_align`, retired after losing its ablation (docs/results/onpolicy_ablation.md)
  "pivot_filler_id": (None, "pivot-aligned blocks"),
}


def retired_defaults() -> dict[str, Any]:
  """{field: its value in every config without the feature} of RETIRED_FIELDS."""
  return {field: value for field, (value, _) in RETIRED_FIELDS.items()}


def check_retired_fields(d: dict[str, Any], source: str) -> None:
  """Raises ValueError naming the first RETIRED_FIELDS field that `d` holds at another value
  than its retired one: a model of a feature this code no longer has."""
  for field, (value, feature) in RETIRED_FIELDS.items():
    if d.get(field, value) != value:
      raise ValueError(f"{source}: {field}={d[field]!r}: a model with {feature}, which were "
                       "retired; only a model without them loads")


# The preset constructors of ModelConfig (ModelConfig.preset).
PRESETS = ("tiny", "tiny_deep", "tiny_wide", "small", "qwen3_0_6b", "qwen3_8b")
