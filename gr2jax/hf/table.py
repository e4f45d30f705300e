"""The HF Qwen3 <-> gr2jax param table, and the one generic loader / exporter that applies it.

Each `Rule` maps one HF tensor name template to one leaf of the gr2jax param pytree (WORKSPACE.md,
"Param pytree"). `{i}` in a template is the layer index; such leaves are stacked on a leading
layer axis. The HF side is torch's `[out, in]` layout, the gr2jax side `[in, ...out]`:

  hf  --(transpose if `transpose`)-->  2-D kernel  --(reshape)-->  param[layer]

where the 2-D kernel groups the param's (per-layer) axes as `[axes[:split], axes[split:]]`
(`split=1`: `[D, N*H] -> [D, N, H]` for q/k/v; `split=2`: `[N*H, D] -> [N, H, D]` for o). The
inverse (`to_hf`) runs the same steps backwards, so one table serves conversion and export.

`load_leaves` is the one generic loader: it first checks every HF name and shape against the
param tree (an unmapped, out-of-range, wrongly-shaped or missing tensor is an error naming it,
raised before any data is read), then builds one stacked leaf at a time from random-access reads,
so a converter holds one leaf (plus one HF tensor) at a time. Duplicates across shards are the
reader's to reject (gr2jax/hf/weights.py).
"""

import dataclasses
import math
import re
from collections.abc import Callable, Iterator, Mapping

import numpy as np


class ConversionError(ValueError):
  """The HF tensors do not match the param tree; the message names the tensor or field.

  Attributes:
    tensor: the HF tensor the error is about (None when it is about no single tensor), so a
      reader that knows the files can name the file too (gr2jax/hf/weights.py).
  """

  def __init__(self, message: str, tensor: str | None = None):
    super().__init__(message)
    self.tensor = tensor


@dataclasses.dataclass(frozen=True)
class Rule:
  """One row of the table.

  Attributes:
    hf_name: HF tensor name; `{i}` stands for the layer index.
    path: the param pytree path, e.g. ('layers', 'q').
    transpose: whether the HF matrix is the transpose of the 2-D kernel.
    split: the kernel groups the param's per-layer axes as [:split] x [split:]; None = no reshape.
  """

  hf_name: str
  path: tuple[str, ...]
  transpose: bool = False
  split: int | None = None

  @property
  def layered(self) -> bool:
    return "{i}" in self.hf_name

  @property
  def pattern(self) -> re.Pattern:
    return re.compile(re.escape(self.hf_name).replace(r"\{i\}", r"(0|[1-9]\d*)"))


_ATTN = "model.layers.{i}.self_attn."
_MLP = "model.layers.{i}.mlp."
TABLE: tuple[Rule, ...] = (
  Rule("model.embed_tokens.weight", ("embed",)),
  Rule("model.layers.{i}.input_layernorm.weight", ("layers", "input_norm")),
  Rule(_ATTN + "q_proj.weight", ("layers", "q"), transpose=True, split=1),
  Rule(_ATTN + "k_proj.weight", ("layers", "k"), transpose=True, split=1),
  Rule(_ATTN + "v_proj.weight", ("layers", "v"), transpose=True, split=1),
  Rule(_ATTN + "o_proj.weight", ("layers", "o"), transpose=True, split=2),
  Rule(_ATTN + "q_norm.weight", ("layers", "q_norm")),
  Rule(_ATTN + "k_norm.weight", ("layers", "k_norm")),
  Rule("model.layers.{i}.post_attention_layernorm.weight", ("layers", "post_attn_norm")),
  Rule(_MLP + "gate_proj.weight", ("layers", "gate"), transpose=True),
  Rule(_MLP + "up_proj.weight", ("layers", "up"), transpose=True),
  Rule(_MLP + "down_proj.weight", ("layers", "down"), transpose=True),
  Rule("model.norm.weight", ("final_norm",)),
  Rule("lm_head.weight", ("lm_head",), transpose=True),
)


TIED_HEAD = "lm_head.weight"  # a tied checkpoint may still store it (torch.save of a state_dict)


def _get(tree: Mapping, path: tuple[str, ...]):
  for key in path:
    if not isinstance(tree, Mapping) or key not in tree:
      return None
    tree = tree[key]
  return tree


def _leaf_paths(tree: Mapping, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
  for key, value in tree.items():
    if isinstance(value, Mapping):
      yield from _leaf_paths(value, prefix + (key,))
    else:
      yield prefix + (key,)


def _kernel_shape(rule: Rule, param_shape: tuple[int, ...]) -> tuple[int, ...]:
  """The 2-D kernel shape (or the param shape itself when there is no reshape)."""
  if rule.split is None:
    return tuple(param_shape)
  return (math.prod(param_shape[: rule.split]), math.prod(param_shape[rule.split :]))


def hf_shape(rule: Rule, param_shape: tuple[int, ...]) -> tuple[int, ...]:
  """The HF tensor shape that fills a (per-layer) param of `param_shape`."""
  kernel = _kernel_shape(rule, param_shape)
  return kernel[::-1] if rule.transpose else kernel


def to_param(rule: Rule, hf: np.ndarray, param_shape: tuple[int, ...]) -> np.ndarray:
  """HF tensor -> (per-layer) param array of `param_shape` (a view where numpy allows)."""
  x = hf.T if rule.transpose else hf
  return x.reshape(param_shape)


def to_hf(rule: Rule, param: np.ndarray) -> np.ndarray:
  """(Per-layer) param array -> HF tensor; the exact inverse of `to_param`."""
  x = param.reshape(_kernel_shape(rule, param.shape))
  return np.ascontiguousarray(x.T if rule.transpose else x)


def _rules_for(abstract: Mapping) -> list[Rule]:
  """The rules whose param exists in this tree (e.g. no lm_head with tied embeddings)."""
  return [r for r in TABLE if _get(abstract, r.path) is not None]


def _num_layers(abstract: Mapping) -> int:
  return int(_get(abstract, ("layers", "input_norm")).shape[0])


def expected_names(abstract: Mapping) -> list[str]:
  """Every HF tensor name the param tree needs, in table order.

  Args:
    abstract: the param pytree (arrays or ShapeDtypeStructs).

  Returns:
    The full list of HF names, layer templates expanded.
  """
  names = []
  for rule in _rules_for(abstract):
    layers = range(_num_layers(abstract)) if rule.layered else [None]
    names.extend(rule.hf_name.format(i=i) for i in layers)
  return names


def match(name: str, abstract: Mapping) -> tuple[Rule, int | None]:
  """Finds the rule (and layer index) of an HF tensor name.

  Raises:
    ConversionError: no rule matches, the param is absent from this tree (e.g. `lm_head.weight`
      with tied embeddings), or the layer index is out of range.
  """
  for rule in TABLE:
    m = rule.pattern.fullmatch(name)
    if m is None:
      continue
    if _get(abstract, rule.path) is None:
      raise ConversionError(
        f"unexpected tensor {name!r}: the config has no param {'/'.join(rule.path)} "
        "(for lm_head.weight: tie_word_embeddings is true)", name)
    layer = int(m.group(1)) if rule.layered else None
    if layer is not None and layer >= _num_layers(abstract):
      raise ConversionError(
        f"unexpected tensor {name!r}: layer {layer} >= num_hidden_layers {_num_layers(abstract)}",
        name)
    return rule, layer
  raise ConversionError(f"unexpected tensor {name!r}: no rule in gr2jax/hf/table.py", name)


def _leaf(tree: Mapping, rule: Rule):
  return _get(tree, rule.path)


def check_tensors(shapes: Mapping[str, tuple[int, ...]], abstract: Mapping) -> None:
  """Checks HF tensor names and shapes against the param tree before any data is read.

  Args:
    shapes: {HF tensor name: shape} of everything in the checkpoint.
    abstract: the param pytree (ShapeDtypeStructs).

  Raises:
    ConversionError naming the tensor: unmapped name, layer out of range, wrong shape, a param
      with no HF rule, or a missing tensor.
  """
  uncovered = sorted(set(_leaf_paths(abstract)) - {r.path for r in TABLE})
  if uncovered:
    raise ConversionError(f"params {['/'.join(p) for p in uncovered]} have no HF rule in TABLE")
  for name, shape in shapes.items():
    if name == TIED_HEAD and _get(abstract, ("lm_head",)) is None:
      rule, per_layer = TABLE[0], _get(abstract, ("embed",)).shape  # must equal the embedding
    else:
      rule, layer = match(name, abstract)
      per_layer = _leaf(abstract, rule).shape[1 if layer is not None else 0 :]
    want = hf_shape(rule, tuple(per_layer))
    if tuple(shape) != want:
      raise ConversionError(
        f"tensor {name!r} has shape {tuple(shape)}, expected {want} for param "
        f"{'/'.join(rule.path)} {tuple(per_layer)} (check config.json)", name)
  missing = [n for n in expected_names(abstract) if n not in shapes]
  if missing:
    more = f" (and {len(missing) - 1} more: {missing[1:4]})" if len(missing) > 1 else ""
    raise ConversionError(f"missing tensor {missing[0]!r}{more}")


def load_leaves(shapes: Mapping[str, tuple[int, ...]], read: Callable[[str], np.ndarray],
                abstract: Mapping, dtype) -> Iterator[tuple[tuple[str, ...], np.ndarray]]:
  """The generic loader: validates everything, then builds one stacked param leaf at a time.

  Each leaf is a fresh numpy buffer filled tensor by tensor through the table (HF dtype cast to
  `dtype` on copy); the caller may drop it before asking for the next, so peak memory is one
  leaf plus one HF tensor. With tied embeddings an `lm_head.weight` present in the checkpoint
  (torch.save of a tied state_dict writes both) must equal the embedding.

  Args:
    shapes: {HF tensor name: shape}; every name is used exactly once.
    read: name -> numpy array (any float dtype).
    abstract: the param pytree (ShapeDtypeStructs); defines the leaves and their shapes.
    dtype: the dtype of every produced leaf.

  Yields:
    (param path, numpy array of the leaf's shape and `dtype`), in table order.

  Raises:
    ConversionError naming the tensor (see `check_tensors`).
  """
  check_tensors(shapes, abstract)
  for rule in _rules_for(abstract):
    buffer = np.empty(_leaf(abstract, rule).shape, dtype)
    if rule.layered:
      for i in range(buffer.shape[0]):
        buffer[i] = to_param(rule, read(rule.hf_name.format(i=i)), buffer.shape[1:])
    else:
      buffer[...] = to_param(rule, read(rule.hf_name), buffer.shape)
    if rule.path == ("embed",) and TIED_HEAD in shapes and _get(abstract, ("lm_head",)) is None:
      if not np.array_equal(read(TIED_HEAD).astype(dtype), buffer):
        raise ConversionError(f"tensor {TIED_HEAD!r} differs from 'model.embed_tokens.weight' "
                              "but the config has tie_word_embeddings=true")
    yield rule.path, buffer
    del buffer


def export_specs(params: Mapping) -> list[tuple[str, tuple[int, ...], np.dtype]]:
  """(HF name, HF shape, dtype) of every tensor `export_tensors` yields, in the same order."""
  specs = []
  for rule in _rules_for(params):
    leaf = _get(params, rule.path)
    if rule.layered:
      shape = hf_shape(rule, tuple(leaf.shape[1:]))
      specs.extend((rule.hf_name.format(i=i), shape, np.dtype(leaf.dtype))
                   for i in range(leaf.shape[0]))
    else:
      specs.append((rule.hf_name, hf_shape(rule, tuple(leaf.shape)), np.dtype(leaf.dtype)))
  return specs


def export_tensors(params: Mapping) -> Iterator[tuple[str, np.ndarray]]:
  """Yields (HF name, HF-layout numpy array) for every tensor of a param pytree, in table order.

  Args:
    params: the param pytree (numpy or jax arrays, host-addressable).

  Yields:
    One (name, array) per HF tensor; arrays keep the param dtype.
  """
  for rule in _rules_for(params):
    leaf = np.asarray(_get(params, rule.path))
    if rule.layered:
      for i in range(leaf.shape[0]):
        yield rule.hf_name.format(i=i), to_hf(rule, leaf[i])
    else:
      yield rule.hf_name, to_hf(rule, leaf)
