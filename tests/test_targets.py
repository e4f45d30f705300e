"""experiments/targets.py and the CI compile check: the tiny recipe built by XLA's real compilers.

A change that breaks GPU or TPU compilation fails here on a CPU machine: the tiny preset's SFT
step (the train step machinery on the causal layout), RL step with the target's attention kernel
(the packed trace replay, the largest program: the two-stream layout CFT and OPD share; its HLO
must call cuDNN / a Mosaic kernel) and both decoders are compiled for an H100 (2 devices, fsdp 2)
and a TPU v5e (2x2, fsdp 4) without hardware: 8 compiles, ~80 s of CPU. The AR RL, CFT and OPD
steps, which add only their losses to the same layouts, and the RL step with the reference
attention are `slow` (they would double the check's time). CI installs the compile-only packages
(requirements-aot.txt, SETUP_AOT=1 scripts/setup.sh); a machine without them skips these tests
unless CI=true, where they fail (tests/aot.py).
"""


import jax
import pytest

from experiments import plan, targets
from tests import aot

pytestmark = pytest.mark.integration  # end to end: CI runs it after the default tests

CHECK = {"h100": ("1x1x2", 2), "tpu_v5e": ("2x2", 4)}  # target: (topology, fsdp)
KINDS = {"h100": "NVIDIA H100 80GB HBM3", "tpu_v5e": "TPU v5 lite"}
KERNEL_CALLS = {"h100": "cudnn", "tpu_v5e": "tpu_custom_call"}  # in the custom-call targets
FAST = ("sft", "ar_decode", "diffusion_decode")  # + the RL step with the kernel (below)
SLOW = ("ar_rl", "cft", "opd", "rl")


@pytest.fixture(scope="module", params=sorted(CHECK))
def target_mesh(request):
  name = request.param
  aot.require(targets.TARGETS[name].platform)
  topology, fsdp = CHECK[name]
  return targets.target_mesh(name, topology, fsdp, 1)


def compile_program(name: str, mesh, target: targets.Target, attention: str = "reference",
                    precision: str = "default") -> dict:
  """Compiles one tiny program (a train stage at its config's micro-batch, or a decoder) at a
  matmul precision: the library's 'default' (what a run compiles), or conftest.py's 'highest'
  (the CPU tests' numerics)."""
  s = plan.with_attention(plan.PRESETS["tiny"], attention)
  with jax.default_matmul_precision(precision):
    if name in plan.DECODER_STAGES:
      return plan.compile_decoder(name, s, mesh, mesh_rows(mesh), 0, target)
    stage = plan.train_stages(s)[name]
    micro = plan.micro_points(stage, s, mesh_rows(mesh), 1)[0]
    return plan.compile_train_step(stage, mesh, micro, 0, target)


def mesh_rows(mesh) -> int:
  return mesh.shape["data"] * mesh.shape["fsdp"]


@pytest.mark.parametrize("program", FAST)
def test_tiny_program_compiles_for_the_target(target_mesh, program):
  mesh, target = target_mesh
  out = compile_program(program, mesh, target)
  assert out["memory"]["argument"] > 0 and out["memory"]["total"] > 0
  assert out["failures"] == [], out["failures"]  # the tiny programs need no documented fix
  assert {d.device_kind for d in mesh.devices.flat} == {KINDS[target.name]}


def test_tiny_rl_step_uses_the_targets_attention_kernel(target_mesh):
  # The packed replay (the longest sequences, every mask kind) with ModelConfig.attention_impl =
  # the target's kernel: the compiled HLO calls cuDNN's fused attention / a Mosaic (Pallas) kernel.
  # At 'highest', where Mosaic rejected splash's bf16 dots before attention.splash traced them at
  # 'default' ("Bad lhs type").
  mesh, target = target_mesh
  calls = plan.custom_calls(compile_program("rl", mesh, target, target.kernel,
                                            "highest")["compiled"])
  assert any(KERNEL_CALLS[target.name] in name for name in calls), calls


@pytest.mark.slow
@pytest.mark.parametrize("program", SLOW)
def test_tiny_slow_program_compiles_for_the_target(target_mesh, program):
  mesh, target = target_mesh
  assert compile_program(program, mesh, target)["memory"]["total"] > 0


def test_default_backend_stays_cpu_with_the_plugins_installed():
  # tests/conftest.py sets JAX_PLATFORMS=cpu before JAX starts; the targets are compile-only.
  assert {d.platform for d in jax.devices()} == {"cpu"}
  assert jax.device_count() == 8


def test_gpu_specs_are_xlas_and_parse():
  aot.require("cuda")
  for name, label, memory in (("h100", "NVIDIA H100 80GB HBM3", 84942979072),
                              ("h200", "NVIDIA H200 141GB HBM3e", 151397597184)):
    text = targets.gpu_target_config(targets.TARGETS[name])
    assert f'device_description_str: "{label}"' in text
    assert f"device_memory_size: {memory}" in text
    assert "collective_memory_granularity" not in text  # the one field jaxlib 0.10 rejects
    found = targets.devices(targets.TARGETS[name], "1x2x4")
    assert len(found) == 8 and found[0].device_kind == label


def test_topology_and_mesh_errors_name_the_argument():
  with pytest.raises(ValueError, match="--target='a100'"):
    targets.get_target("a100")
  with pytest.raises(ValueError, match="topology 'eight'"):
    targets.devices(targets.TARGETS["cpu"], "eight")
  with pytest.raises(ValueError, match="fsdp 4 x tp 1 = 4"):
    targets.target_mesh("cpu", "8", 4, 1)


def test_documented_fix_for_the_triton_tiling_failure():
  h100, v5e = targets.TARGETS["h100"], targets.TARGETS["tpu_v5e"]
  error = "INTERNAL: Couldn't find output tile sizes that satisfy hlo: %dot.721 = bf16[9824,4096]"
  assert targets.fix_for(h100, error) == {"xla_gpu_enable_triton_gemm": False}
  assert targets.fix_for(v5e, error) is None and targets.fix_for(h100, "other") is None
  assert h100.compiler_options(targets.fix_for(h100, error)) == {
    "xla_gpu_enable_triton_gemm": False}
  assert targets.TARGETS["cpu"].compiler_options(opt_level=0) == {
    "xla_backend_optimization_level": 0}


def test_recipe_xla_flags_become_the_platforms_compile_options():
  flags = ("--xla_gpu_enable_triton_gemm=false", "--xla_tpu_x=3", "--xla_dump_to=/d")
  assert targets.recipe_options(targets.TARGETS["h100"], flags) == {
    "xla_gpu_enable_triton_gemm": False, "xla_dump_to": "/d"}
  assert targets.recipe_options(targets.TARGETS["tpu_v5p"], flags) == {"xla_tpu_x": 3,
                                                                       "xla_dump_to": "/d"}
  assert targets.recipe_options(targets.TARGETS["cpu"], flags) == {"xla_dump_to": "/d"}
  # The 8B / 0.6B plans compile for a GPU with the qwen3_* recipes' flag from the first compile.
  for preset in ("qwen3_8b", "qwen3_0_6b"):
    assert targets.recipe_options(targets.TARGETS["h100"], plan.PRESETS[preset].xla_flags) == {
      "xla_gpu_enable_triton_gemm": False}
  assert plan.PRESETS["tiny"].xla_flags == ()


@pytest.mark.parametrize("program", ("ar_decode", "diffusion_decode", "speculative_decode"))
def test_tiny_gpu_decoders_run_the_decode_kernel(target_mesh, program):
  # With the target's kernel, every decode step on the GPU (the AR step, the block step, the
  # drafter's and the verifier's forwards) attends in model/decode_attention.py's Triton kernel,
  # run per batch shard (fsdp 2); the TPU's decode steps keep the reference (model/attention.py).
  mesh, target = target_mesh
  if target.platform != "cuda":
    pytest.skip("the decode kernel is the GPU's")
  calls = plan.custom_calls(compile_program(program, mesh, target, target.kernel)["compiled"])
  assert any("triton" in name for name in calls), calls
