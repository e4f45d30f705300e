"""experiments/studies/step_traffic.py: the HLO reading (shapes' bytes, large ops by kind, in-place
updates not counted as extra) on a written module, and one tiny step compiled by the real H100
compiler."""


from experiments import plan
from experiments.studies import step_traffic
from tests import aot

# A written module: a concatenate, an in-place update (an output of the step), a cuBLAS gemm with
# its workspace, one whose result is an output, a weight prefetched into TPU VMEM (S(1)) and an op
# below the threshold.
HLO = """HloModule step, is_scheduled=true

%fused_concat (p0: bf16[64,32], p1: bf16[64,16]) -> bf16[64,48] {
  %p0 = bf16[64,32]{1,0} parameter(0)
  %p1 = bf16[64,16]{1,0} parameter(1)
  ROOT %c = bf16[64,48]{1,0} concatenate(%p0, %p1), dimensions={1}
}

%fused_write (p0: f32[8,128], p1: f32[8,1]) -> f32[8,128] {
  %p0 = f32[8,128]{1,0} parameter(0)
  %p1 = f32[8,1]{1,0} parameter(1)
  ROOT %w = f32[8,128]{1,0} dynamic-update-slice(%p0, %p1)
}

ENTRY %main (a: bf16[64,32], b: bf16[64,16], c: f32[8,128], d: f32[8,1]) -> f32[8,128] {
  %a = bf16[64,32]{1,0} parameter(0)
  %b = bf16[64,16]{1,0} parameter(1)
  %c = f32[8,128]{1,0} parameter(2)
  %d = f32[8,1]{1,0} parameter(3)
  %fusion = bf16[64,48]{1,0} fusion(%a, %b), kind=kLoop, calls=%fused_concat
  %fusion.1 = f32[8,128]{1,0} fusion(%c, %d), kind=kLoop, calls=%fused_write
  %g = (bf16[64,64]{1,0}, s8[1024]{0}) custom-call(%fusion, %a), custom_call_target="__cublas$gemm"
  %copy-start = (bf16[64,32]{1,0:T(8,128)(2,1)S(1)}, bf16[64,32]{1,0}, u32[]) copy-start(%a)
  %small = f32[2]{0} copy(%x)
  %h = (f32[64,64]{1,0}, s8[512]{0}) custom-call(%fusion, %a), custom_call_target="__cublas$gemm"
  %gte = f32[64,64]{1,0} get-tuple-element(%h), index=0
  %logits = f32[1,64,64]{2,1,0} bitcast(%gte)
  ROOT %t = (f32[8,128]{1,0}, f32[1,64,64]{2,1,0}) tuple(%fusion.1, %logits)
}
"""


def test_shape_bytes():
  assert step_traffic.shape_bytes("bf16[4096,6144]{1,0}") == 4096 * 6144 * 2
  assert step_traffic.shape_bytes("(f32[8,128]{1,0}, s8[1024]{0})") == 8 * 128 * 4 + 1024
  assert step_traffic.shape_bytes("s32[]") == 4


def test_large_ops_by_kind_and_extra_traffic():
  ops = step_traffic.large_ops(HLO, min_bytes=1000)
  # Each element of a tuple result on its own: the gemm's result and its workspace; the second
  # gemm's result is the step's output (through a get-tuple-element and a bitcast), its workspace
  # below the threshold; the prefetch's destination and source alias are on chip.
  assert ops == {"fusion:concatenate": {"count": 1, "bytes": 64 * 48 * 2},
                 "custom-call:__cublas$gemm": {"count": 2, "bytes": 64 * 64 * 2 + 1024},
                 "on-chip:copy-start": {"count": 2, "bytes": 2 * 64 * 32 * 2}}
  # The concatenate and the first gemm's results are extra, written + read; the prefetch is not.
  assert step_traffic.extra_bytes(ops) == 2 * (64 * 48 * 2 + 64 * 64 * 2 + 1024)
  assert not step_traffic.is_extra("fusion:scatter")  # in place into a donated buffer
  assert not step_traffic.is_extra("dynamic-update-slice")
  assert step_traffic.large_ops(HLO, min_bytes=10**6) == {}


def test_a_tiny_block_step_on_the_h100_compiler():
  aot.require("cuda")
  row = step_traffic.measure("block", plan.PRESETS["tiny"], "h100", None)
  memory = row["memory"]
  assert row["bytes"] == memory["argument"] + memory["output"] - memory["alias"]
  assert row["ratio"] == (row["bytes"] + row["extra_bytes"]) / row["bytes"]
  assert row["bytes_accessed"] is None  # the GPU compiler has no cost analysis
  assert row["tokens"] == plan.PRESETS["tiny"].block_size and row["min_bytes"] > 0
