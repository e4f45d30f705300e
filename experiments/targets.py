"""Compile targets: the 8 simulated CPU devices, or real GPU / TPU compilers without hardware.

  mesh, target = targets.target_mesh("h100", "1x1x8", fsdp=8, tp=1)
  jax.jit(f).lower(<ShapeDtypeStructs sharded on mesh>).compile(target.compiler_options())

A GPU or TPU target is XLA's own compiler for that chip, run deviceless on this CPU machine
(`jax.experimental.topologies`; docs/plan_qwen3_8b.md): the compiled program's
`memory_analysis()` is that compiler's buffer assignment, nothing runs. It needs the compile-only
packages of requirements-aot.txt (jax-cuda12-plugin + jax-cuda12-pjrt + nvidia-cuda-nvcc-cu12 for
the ptxas; libtpu); `JAX_PLATFORMS=cpu` keeps the default backend on the CPU while they are
installed. The GPU device descriptions are XLA's files (experiments/gpu_specs/, verbatim from
openxla/xla `xla/backends/gpu/target_config/specs/`); `gpu_target_config` drops the one field the
jaxlib 0.10 proto does not know yet (`collective_memory_granularity`, an NCCL symmetric-memory
granularity that buffer assignment does not read).

Topologies: GPU 'SLICESxHOSTSxDEVICES' ('1x1x8' = one host of 8, '1x2x4' = two hosts of 4);
TPU the slice's chip grid ('2x2x2' for v5p, '2x4' or '1x1' for v5e / v6e).
"""

import dataclasses
import math
import os
import re

import jax
from jax.experimental import topologies

from gr2jax import recipe
from gr2jax.train import mesh as mesh_lib

SPEC_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_specs")
# GpuDeviceInfoProto fields of XLA's spec files that jaxlib 0.10.2's proto does not parse.
_UNPARSED_GPU_FIELDS = ("collective_memory_granularity",)


@dataclasses.dataclass(frozen=True)
class Target:
  """One compile target.

  Attributes:
    name: the --target value.
    platform: 'cpu' | 'cuda' | 'tpu'.
    cards: {label: bytes} the memory totals are compared with (the CPU proxy: H100 and H200).
    peak_flops: bf16 dense FLOP/s per device (the time model; the CPU proxy prices an H100).
    hbm_bytes_s: memory bandwidth per device.
    spec: the XLA device description file under gpu_specs/ (GPU only).
    tpu_generation: the libtpu topology prefix ('v5p', 'v5e', 'v6e'; TPU only).
    chips_per_host: the host's chip grid (TPU only; clipped to the slice).
    default_topology: the topology when none is given (8 devices).
    kernel: the fused attention of the platform (ModelConfig.attention_impl; 'auto' reads
      jax.default_backend(), which is the CPU in a compile-only run, so the plan names it).
    peak_fraction: the fraction of peak_flops a compute-bound decode forward is assumed to reach
      (an assumption with its source at TARGETS, not a measurement; None: no figure stated).
      The batch curve prices every compute-bound step at peak and at this fraction.
  """

  name: str
  platform: str
  cards: dict
  peak_flops: float
  hbm_bytes_s: float
  spec: str | None = None
  tpu_generation: str | None = None
  chips_per_host: tuple = ()
  default_topology: str = ""
  kernel: str = "reference"
  peak_fraction: float | None = None

  def compiler_options(self, fix: dict | None = None, opt_level: int = 0) -> dict:
    """XLA options of a compile: the CPU proxy's optimisation level (buffer sizes do not depend
    on it), plus a documented fix (FIXES) when the plan applies one."""
    options = {"xla_backend_optimization_level": opt_level} if self.platform == "cpu" else {}
    return {**options, **(fix or {})}


# Public per-chip figures (bf16 dense FLOP/s, HBM bandwidth); memory as the issue states it.
# peak_fraction 0.7 (H100, TPU v5p) is an assumption, not a measurement: a bf16 GEMM of
# 4224 x 8192 x 2048 (CUTLASS / cuBLAS) was measured at 780 TFLOP/s on an H100 SXM with boosted
# clocks, 0.79 of 989 (https://gist.github.com/Chillee/2ec89696db8b7ed1c24461159e325405), and
# NVIDIA's CUTLASS benchmarks reach ~0.70-0.75 of peak on 4k-8k square GEMMs; a decode forward's
# GEMMs are smaller and reach less, so 0.7 is optimistic but realistic. No TPU measurement is
# cited: the v5p is given the same fraction.
TARGETS = {
  "cpu": Target("cpu", "cpu", {"80GB": 80e9, "141GB": 141e9}, 989e12, 3.35e12,
                default_topology="8"),
  "h100": Target("h100", "cuda", {"80GB": 80e9}, 989e12, 3.35e12, spec="h100_sxm.txtpb",
                 default_topology="1x1x8", kernel="cudnn", peak_fraction=0.7),
  "h200": Target("h200", "cuda", {"141GB": 141e9}, 989e12, 4.8e12, spec="h200.txtpb",
                 default_topology="1x1x8", kernel="cudnn"),
  "tpu_v5p": Target("tpu_v5p", "tpu", {"95GB": 95e9}, 459e12, 2.765e12, tpu_generation="v5p",
                    chips_per_host=(2, 2, 1), default_topology="2x2x2", kernel="splash",
                    peak_fraction=0.7),
  "tpu_v5e": Target("tpu_v5e", "tpu", {"16GB": 16e9}, 197e12, 0.819e12, tpu_generation="v5e",
                    chips_per_host=(2, 4, 1), default_topology="2x4", kernel="splash"),
  "tpu_v6e": Target("tpu_v6e", "tpu", {"32GB": 32e9}, 918e12, 1.64e12, tpu_generation="v6e",
                    chips_per_host=(2, 4, 1), default_topology="2x4", kernel="splash"),
}

# Failures of a deviceless compile and the documented XLA option that avoids each: the plan
# records the failure verbatim, then compiles with the option and says so (never silently).
# Triton gemms get default tiles without a device to autotune on; some dots have none that fit
# (the qwen3_* recipes set this flag from the start: their xla_flags, recipe_options).
FIXES = (("cuda", "Couldn't find output tile sizes", {"xla_gpu_enable_triton_gemm": False}),)


# A platform's own XLA flags, by name prefix; any other flag applies to every platform.
_PLATFORM_FLAGS = {"cuda": "xla_gpu_", "tpu": "xla_tpu_", "cpu": "xla_cpu_"}


def _typed(value: str):
  """An XLA_FLAGS value as the compile option's type (bool, int, float or text)."""
  if value in ("true", "false"):
    return value == "true"
  for kind in (int, float):
    try:
      return kind(value)
    except ValueError:
      pass
  return value


def recipe_options(target: Target, xla_flags) -> dict:
  """A recipe's xla_flags (gr2jax/recipe.py; '--name=value') as compile options of `target`: a
  platform's own flags (xla_gpu_* on GPU, xla_tpu_* on TPU, xla_cpu_* on CPU) only there."""
  own = _PLATFORM_FLAGS[target.platform]
  return {name: _typed(value) for name, value in recipe.parse_xla_flags(xla_flags).items()
          if name.startswith(own) or not name.startswith(tuple(_PLATFORM_FLAGS.values()))}


def fix_for(target: Target, error: str) -> dict | None:
  """The documented option (FIXES) that avoids `error` on `target`, or None."""
  for platform, pattern, fix in FIXES:
    if platform == target.platform and pattern in error:
      return fix
  return None


def get_target(name: str) -> Target:
  if name not in TARGETS:
    raise ValueError(f"--target={name!r}: expected one of {sorted(TARGETS)}")
  return TARGETS[name]


def gpu_target_config(target: Target) -> str:
  """The target's XLA device description (GpuTargetConfigProto text) as jaxlib parses it."""
  with open(os.path.join(SPEC_DIR, target.spec)) as f:
    lines = f.read().splitlines()
  return "\n".join(line for line in lines
                   if not line.strip().startswith(tuple(f"{k}:" for k in _UNPARSED_GPU_FIELDS)))


def _grid(topology: str) -> tuple[int, ...]:
  if not re.fullmatch(r"\d+(x\d+)*", topology):
    raise ValueError(f"topology {topology!r}: expected integers joined by 'x' (e.g. 1x1x8, 2x4)")
  return tuple(int(x) for x in topology.split("x"))


def devices(target: Target, topology: str | None = None) -> list:
  """The target's devices: host CPU devices, or compile-only GPU / TPU devices of `topology`."""
  topology = topology or target.default_topology
  if target.platform == "cpu":
    found = jax.devices("cpu")
    if len(found) != math.prod(_grid(topology)):
      raise RuntimeError(f"target cpu, topology {topology}: {len(found)} host devices (set "
                         f"XLA_FLAGS=--xla_force_host_platform_device_count before JAX starts)")
    return found
  grid = _grid(topology)
  if target.platform == "cuda":
    if len(grid) != 3:
      raise ValueError(f"GPU topology {topology!r}: expected SLICESxHOSTSxDEVICES, e.g. 1x1x8")
    desc = topologies.get_topology_desc(platform="cuda", topology=topology,
                                        target_config=gpu_target_config(target))
  else:
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")  # no metadata server: a compile-only chip
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")  # no chip to guard: no lockfile
    bounds = tuple(min(b, g) for b, g in zip(target.chips_per_host, (*grid, 1, 1)[:3], strict=True))
    desc = topologies.get_topology_desc(
      platform="tpu", topology_name=f"{target.tpu_generation}:{topology}",
      chip_config_name="default", chips_per_host_bounds=bounds, num_slices=1)
  return list(desc.devices)


def target_mesh(name: str, topology: str | None, fsdp: int, tp: int):
  """The training mesh ('data', 'fsdp', 'tp') = (1, fsdp, tp) over the target's devices.

  Returns:
    (mesh, Target).
  """
  target = get_target(name)
  found = devices(target, topology)
  if fsdp * tp != len(found):
    raise ValueError(f"target {name} topology {topology or target.default_topology}: "
                     f"{len(found)} devices, mesh fsdp {fsdp} x tp {tp} = {fsdp * tp}")
  return mesh_lib.make_mesh(1, fsdp, tp, devices=found), target
