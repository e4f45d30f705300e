"""The HF Qwen3 <-> gr2jax param table, and the one generic loader / exporter that applies it.

Each `Rule` maps one HF tensor name template to one leaf of the gr2jax param pytree (WORKSPACE.md,
"Param pytree"). `{i}` in a template is the layer index; such leaves are stacked on a leading
layer axis. The HF side is torch's `[out, in]` layout, the gr2jax side `[in, ...out]`:

  hf  --(transpose if `transpose`)-->  2-D kernel  --(reshape)-->  param[layer]

where the 2-D kernel groups the param's (per-layer) axes as `[axes[:split], axes[split:]]`
(`split=1`: `[D, N*H] -> [D, N, H]` for q/k/v; `split=2`: `[N*H, D] -> [N, H, D]` for o). The
inverse (`to_hf`) runs the same steps backwards, so one table serves conversion and export.

`ParamFiller` preallocates one numpy buffer per leaf and accepts HF tensors in any order, one at a
time (so a converter can stream shard by shard); it fails on an unmapped, duplicated, out-of-range
or wrongly-shaped tensor, and `finish()` fails on any tensor that never arrived. Every error names
the HF tensor.
"""

import dataclasses
import math
import re
from collections.abc import Iterator, Mapping

import numpy as np


class ConversionError(ValueError):
  """The HF tensors do not match the param tree; the message names the tensor or field."""


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
        "(for lm_head.weight: tie_word_embeddings is true)"
      )
    layer = int(m.group(1)) if rule.layered else None
    if layer is not None and layer >= _num_layers(abstract):
      raise ConversionError(
        f"unexpected tensor {name!r}: layer {layer} >= num_hidden_layers {_num_layers(abstract)}"
      )
    return rule, layer
  raise ConversionError(f"unexpected tensor {name!r}: no rule in weights_conversion/hf_table.py")


class ParamFiller:
  """Preallocated numpy param buffers that HF tensors are streamed into, one at a time."""

  def __init__(self, abstract: Mapping, dtype):
    """Allocates (lazily, via np.empty) one buffer per leaf of `abstract`, all of `dtype`.

    Args:
      abstract: the param pytree of ShapeDtypeStructs (only .shape is read).
      dtype: the param dtype every buffer gets (the HF dtype is cast on copy).
    """
    uncovered = sorted(set(_leaf_paths(abstract)) - {r.path for r in TABLE})
    if uncovered:
      raise ConversionError(f"params {['/'.join(p) for p in uncovered]} have no HF rule in TABLE")
    self._abstract = abstract
    self._missing = set(expected_names(abstract))
    self._buffers = {}
    self._tied_head = None
    for rule in _rules_for(abstract):
      self._buffers[rule.path] = np.empty(_get(abstract, rule.path).shape, dtype)

  def put(self, name: str, array: np.ndarray) -> None:
    """Copies one HF tensor into its buffer (cast to the param dtype).

    Raises:
      ConversionError: unmapped or duplicated name, or wrong shape.
    """
    if name == TIED_HEAD and _get(self._abstract, ("lm_head",)) is None:
      if self._tied_head is not None:
        raise ConversionError(f"tensor {name!r} appears more than once in the checkpoint")
      self._tied_head = array  # tied checkpoints may store the head too; checked in finish()
      return
    rule, layer = match(name, self._abstract)
    if name not in self._missing:
      raise ConversionError(f"tensor {name!r} appears more than once in the checkpoint")
    buffer = self._buffers[rule.path]
    target = buffer[layer] if layer is not None else buffer
    want = hf_shape(rule, target.shape)
    if tuple(array.shape) != want:
      raise ConversionError(
        f"tensor {name!r} has shape {tuple(array.shape)}, expected {want} for param "
        f"{'/'.join(rule.path)} {tuple(target.shape)} (check config.json)"
      )
    target[...] = to_param(rule, array, target.shape)
    self._missing.discard(name)

  def finish(self) -> dict:
    """Returns the filled param pytree of numpy arrays.

    Raises:
      ConversionError: naming the first few HF tensors that never arrived.
    """
    if self._missing:
      order = expected_names(self._abstract)
      missing = sorted(self._missing, key=order.index)
      raise ConversionError(
        f"missing tensor {missing[0]!r}" + (f" (and {len(missing) - 1} more: {missing[1:4]})"
                                             if len(missing) > 1 else "")
      )
    if self._tied_head is not None and not np.array_equal(self._tied_head,
                                                         self._buffers[("embed",)]):
      raise ConversionError(
        f"tensor {TIED_HEAD!r} differs from 'model.embed_tokens.weight' but the config has "
        "tie_word_embeddings=true"
      )
    tree: dict = {}
    for path, buffer in self._buffers.items():
      node = tree
      for key in path[:-1]:
        node = node.setdefault(key, {})
      node[path[-1]] = buffer
    self._buffers = {}
    return tree


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
