r"""What a compiled decode step moves beyond its weights and KV cache, on the real compilers.

  python experiments/studies/step_traffic.py --targets=h100,tpu_v5p \
      --out=docs/results/benchmarks/step_traffic.json          (~4 compiles, 10-20 min)
  python experiments/studies/step_traffic.py --preset=tiny --targets=cpu      (seconds)

The AR step (one token after the cache) and the block-diffusion step (one block of B tokens) of
Qwen3-8B (bf16, batch 1, the cache of the paper's 2,200-token prompt + 256 new tokens), compiled for
one device of each target without hardware (experiments/targets.py; roofline.py's compile:
experiments/roofline_steps.py compile_step). A step at the memory limit reads its arguments (weights
+ the whole cache buffer) once and writes its outputs (logits; the donated cache in place), and
nothing else. Per step:

  minimum     arguments + outputs not aliased (memory_analysis): the least traffic possible.
  temp        the compiler's scratch buffers (memory_analysis).
  large ops   every op of the optimized HLO whose result is at least --min_mib (default: one
              layer's K buffer), by kind (a fusion by its root op), less the step's outputs. An
              in-place update of a donated buffer (scatter, dynamic-update-slice) writes only its
              update, and a result in on-chip memory (TPU memory space S(1): XLA's prefetch of a
              weight into VMEM, read from HBM once) moves no HBM bytes of its own; any other
              large result is extra traffic, written and read again: extra = 2 x its bytes.
  bytes accessed   XLA's own cost analysis where the compiler has one (TPU; not the GPU).

ratio = (minimum + extra) / minimum; 1.00 is a step at the memory limit. Prints a table; --out
writes the JSON (the per-kind ops included).
"""

import dataclasses
import itertools
import json
import math
import re

from absl import flags

from experiments import plan, roofline_steps, targets
from gr2jax import cli
from gr2jax.model.cache import init_cache

FLAGS = flags.FLAGS


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
  """The command-line flags, each value checked when absl parses it, before any compile."""
  f = {"flag_values": flag_values}
  flags.DEFINE_enum("preset", "qwen3_8b", sorted(plan.PRESETS), "plan.PRESETS shapes.", **f)
  cli.define_list("targets", ["h100", "tpu_v5p"], "targets.TARGETS keys.",
                  cli.choice(sorted(targets.TARGETS)), **f)
  cli.define_list("steps", ["ar", "block"], "Steps: ar (one token), block (one block of B).",
                  cli.choice(("ar", "block")), **f)
  cli.define("min_mib", None, "Smallest op result counted (MiB); default one layer's K.",
             cli.number(0, low_open=True), **f)
  flags.DEFINE_string("out", None, "Also write the JSON here.", **f)


IN_PLACE = ("scatter", "dynamic-update-slice")
ON_CHIP = "S(1)"  # an HLO layout's memory space 1: TPU VMEM
_NOT_WRITES = ("parameter", "get-tuple-element", "tuple", "bitcast", "constant")
_DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "f8e4m3fn": 1, "f8e5m2": 1, "bf16": 2, "f16": 2,
                "s16": 2, "u16": 2, "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8}
_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*)$")


def shape_bytes(shape: str) -> int:
  """Bytes of an HLO shape string ('bf16[4096,6144]{1,0}', or a tuple of them)."""
  return sum(_DTYPE_BYTES.get(dtype, 0) * math.prod(int(d) for d in dims.split(",") if d)
             for dtype, dims in re.findall(r"\b([a-z]+\d*[a-z0-9]*)\[([\d,]*)\]", shape))


def _split_shape(rest: str) -> tuple[str, str]:
  """'<shape> opcode(...)...' -> (shape, opcode)."""
  if rest.startswith("("):  # a tuple shape: up to its matching parenthesis
    depths = itertools.accumulate({"(": 1, ")": -1}.get(c, 0) for c in rest)
    end = next(i for i, depth in enumerate(depths) if depth == 0) + 1
    shape, tail = rest[:end], rest[end:].lstrip()
  else:
    shape, _, tail = rest.partition(" ")
  return shape, tail.split("(", 1)[0]


def parse_hlo(text: str) -> tuple[dict, str | None]:
  """An optimized HLO module's text -> ({computation: [(name, shape, opcode, line)]}, the entry
  computation's name)."""
  computations, current, entry = {}, None, None
  for line in text.splitlines():
    header = _HEADER.match(line)
    if header and " = " not in line.split("{")[0]:
      current = computations.setdefault(header.group(1), [])
      entry = header.group(1) if line.startswith("ENTRY") else entry
      continue
    instruction = _INSTRUCTION.match(line)
    if instruction and current is not None:
      shape, opcode = _split_shape(instruction.group(2))
      current.append((instruction.group(1), shape, opcode, line))
  return computations, entry


def tuple_elements(shape: str) -> list[str]:
  """A tuple shape's top-level element shapes ('(f32[2]{0}, s8[4]{0})' -> two); a non-tuple
  shape is one element."""
  shape = re.sub(r"/\*.*?\*/", "", shape).strip()
  if not shape.startswith("("):
    return [shape]
  elements, depth, start = [], 0, 1
  for i, c in enumerate(shape):
    depth += 1 if c in "([{" else -1 if c in ")]}" else 0
    if (c == "," and depth == 1) or (c == ")" and depth == 0):
      elements.append(shape[start:i].strip())
      start = i + 1
  return [e for e in elements if e]


def _entry_outputs(instructions: list) -> set:
  """The (op, tuple index or None) results the entry computation returns, looked up through
  bitcasts and get-tuple-elements (a cuBLAS call's (result, workspace) tuple: the result)."""
  lines = {name: (opcode, line) for name, _, opcode, line in instructions}
  root = next(line for _, _, _, line in instructions if line.lstrip().startswith("ROOT "))
  out = set()
  for name in re.findall(r"%([\w.\-]+)", root.split(" = ", 1)[1]):
    index = None
    while name in lines and lines[name][0] in ("bitcast", "get-tuple-element"):
      opcode, line = lines[name]
      if opcode == "get-tuple-element":
        index = int(re.search(r"index=(\d+)", line).group(1))
      name = re.search(r"\(%?([\w.\-]+)", line.split(" = ", 1)[1]).group(1)
    out.add((name, index))
  return out


def large_ops(text: str, min_bytes: int) -> dict:
  """{kind: {'count', 'bytes'}} of the results of ops outside fusion bodies with >= min_bytes
  (each element of a tuple result on its own), the entry's outputs left out; a fusion's kind is
  its root op's ('fusion:concatenate'), a cuBLAS / cuDNN / kernel call's its target, a result
  in on-chip memory 'on-chip:<kind>'."""
  computations, entry = parse_hlo(text)
  fused, roots = set(), {}
  for name, instructions in computations.items():
    for _, _, opcode, line in instructions:
      if opcode == "fusion":
        fused.update(re.findall(r"calls=%?([\w.\-]+)", line))
      if line.lstrip().startswith("ROOT "):
        roots[name] = opcode
  outputs = _entry_outputs(computations[entry])
  out = {}
  for name, instructions in computations.items():
    if name in fused:
      continue
    for result, shape, opcode, line in instructions:
      if opcode in _NOT_WRITES:
        continue
      kind = opcode
      if opcode == "fusion":
        body = re.search(r"calls=%?([\w.\-]+)", line)
        kind = f"fusion:{roots.get(body.group(1), '?') if body else '?'}"
      elif opcode == "custom-call":
        target = re.search(r'custom_call_target="([^"]+)"', line)
        kind = f"custom-call:{target.group(1) if target else '?'}"
      elements = tuple_elements(shape)
      for i, element in enumerate(elements):
        nbytes = shape_bytes(element)
        if nbytes < min_bytes or (result, i if len(elements) > 1 else None) in outputs:
          continue
        element_kind = f"on-chip:{kind}" if ON_CHIP in shape else kind  # a prefetch's tuple
        entry_ops = out.setdefault(element_kind, {"count": 0, "bytes": 0})
        entry_ops["count"] += 1
        entry_ops["bytes"] += nbytes
  return out


def is_extra(kind: str) -> bool:
  """Whether a large op's result is HBM traffic beyond the minimum (module docstring)."""
  return not kind.startswith("on-chip:") and kind.removeprefix("fusion:") not in IN_PLACE


def extra_bytes(ops: dict) -> int:
  """Traffic beyond the minimum: every large result that is extra (is_extra), x 2."""
  return 2 * sum(v["bytes"] for kind, v in ops.items() if is_extra(kind))


def measure(kind: str, s: plan.Shapes, target_name: str, min_bytes: int | None) -> dict:
  """One step compiled for one device of the target: its traffic (module docstring)."""
  compiled, info = roofline_steps.compile_step(kind, s, target_name)
  config = s.model if kind == "ar" else s.diffusion()
  if min_bytes is None:  # one layer's K buffer of this cache
    min_bytes = init_cache(config, 1, 1).k[0].dtype.itemsize * math.prod(
      (config.num_kv_heads, config.head_dim, s.prompt_len + s.response_len))
  ops = large_ops(compiled.as_text(), min_bytes)
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  extra = extra_bytes(ops)
  return {**{k: v for k, v in info.items() if k != "options"}, "target": target_name,
          "step": kind, "min_bytes": min_bytes, "large_ops": ops, "extra_bytes": extra,
          "ratio": (info["bytes"] + extra) / info["bytes"],
          "bytes_accessed": (cost or {}).get("bytes accessed")}


def markdown(rows: list[dict]) -> str:
  lines = ["| target | step | minimum GB (args + outputs) | temp MB | large ops (not in place) "
           "| extra GB | ratio | bytes accessed GB (XLA) |", "|---|---|---|---|---|---|---|---|"]
  for r in rows:
    ops = ", ".join(f"{k} {v['count']}x {v['bytes'] / 1e6:,.0f} MB"
                    for k, v in sorted(r["large_ops"].items()) if is_extra(k)) or "none"
    accessed = "-" if r["bytes_accessed"] is None else f"{r['bytes_accessed'] / 1e9:.2f}"
    lines.append(f"| {r['target']} | {r['step']} | {r['bytes'] / 1e9:.3f} | "
                 f"{r['memory']['temp'] / 1e6:,.1f} | {ops} | {r['extra_bytes'] / 1e9:.3f} | "
                 f"{r['ratio']:.3f} | {accessed} |")
  return "\n".join(lines) + "\n"


def main(argv):
  del argv
  plan.use_host_devices(1)
  s = plan.PRESETS[FLAGS.preset]
  min_bytes = None if FLAGS.min_mib is None else int(FLAGS.min_mib * 2**20)
  rows = []
  for name in FLAGS.targets:
    for kind in FLAGS.steps:
      rows.append(measure(kind, s, name, min_bytes))
      print(json.dumps({k: rows[-1][k] for k in ("target", "step", "bytes", "extra_bytes",
                                                  "ratio", "compile_s")}), flush=True)
      if FLAGS.out:  # after every compile: a partial report survives an interruption
        with open(FLAGS.out, "w") as f:
          json.dump({"preset": FLAGS.preset, "versions": plan.versions(),
                     "config": dataclasses.asdict(s.model), "rows": rows}, f, indent=1,
                    default=float)
  print(markdown(rows))


if __name__ == "__main__":
  define_flags()
  cli.run(main)
