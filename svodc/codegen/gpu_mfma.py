"""CDNA3's matrix cores (MFMA, gfx942): the inner step of model GEMM kernels (gpu_gemm.py) when their weights
are float16 or bfloat16 (--precision): `v_mfma_f32_16x16x16_f16` / `v_mfma_f32_16x16x16_bf16` (LLVM's
llvm.amdgcn.mfma.f32.16x16x16f16 / .16x16x16bf16.1k), float32 accumulation.

Checked by compiling only (the object lists v_mfma and passes gpu_tools.check_amd_code_object): no emulator
executes gfx942 code and no MI300 has run it, so the operand layout below is as read from AMD's CDNA3 ISA
manual, not verified by execution.

The block (256 threads: 4 waves of 64) stages a 64 x 64 tile; wave w owns the four 16 x 16 sub-tiles in
rows 16 w .. + 16 (sub-tile q at column 16 q): one A operand, four B operands, four MFMA per k step of 16.
Operands in wave64: lane l holds A[l % 16][4 (l // 16) + e] and B[4 (l // 16) + e][l % 16] (e = 0..3, packed
in two VGPRs); the result's register i of lane l is D[4 (l // 16) + i][l % 16]. The activation operand is
rounded to the weights' type as it is read from shared memory (gpu_wmma.round_to).
"""

from __future__ import annotations

from svodc.codegen.gpu_emit import GpuEmitter
from svodc.codegen.gpu_mma import Index
from svodc.codegen.gpu_wmma import round_to, update_accumulators
from svodc.gemm_plan import GPU_BN, GPU_TK
from svodc.ir.dtypes import DType

WAVE = 64
TILE = 16
TILE_K, TILE_N = GPU_TK, GPU_BN  # row lengths of the staged A (64 x 16) and B (16 x 64) tiles (gpu_gemm.py)
SUBTILES_PER_WAVE = 4
INTRINSIC = {"float16": ("half", "llvm.amdgcn.mfma.f32.16x16x16f16"),
             "bfloat16": ("i16", "llvm.amdgcn.mfma.f32.16x16x16bf16.1k")}


def accumulate_mfma(em: GpuEmitter, a_tile: str, a_t: str, b_tile: str, b_t: str, acc: str, elem: DType) -> None:
    """acc += this wave's A rows (16 x 16 of the staged A tile) x its four 16 x 16 sub-tiles of B, one k step.
    Runs inside a threads phase with every lane of the wave active (MFMA requires it)."""
    line, sc = em.emit_line, em.stack[-1]
    scalar, intrinsic = INTRINSIC[elem.name]
    vec = f"<4 x {scalar}>"
    em.uses_intrinsics.add(f"declare <4 x float> @{intrinsic}({vec}, {vec}, <4 x float>, i32, i32, i32)")
    t = Index(em, em.value(em.tid_r))
    lane = t % WAVE
    row0, l16, quad = 16 * (t // WAVE), lane % TILE, lane // TILE

    def operand(tile: str, tile_t: str, index) -> str:
        v = "poison"
        for e in range(4):
            p = line(sc, f"getelementptr inbounds float, {tile_t} {tile}, i64 {index(e).v}", "ptr")
            x = round_to(em, line(sc, f"load float, {tile_t} {p}, align 4"), elem)
            v = line(sc, f"insertelement {vec} {v}, {scalar} {x}, i32 {e}")
        return v

    av = operand(a_tile, a_t, lambda e: (row0 + l16) * TILE_K + (4 * quad + e))
    for q in range(SUBTILES_PER_WAVE):
        bv = operand(b_tile, b_t, lambda e, q=q: (4 * quad + e) * TILE_N + (l16 + TILE * q))
        update_accumulators(em, acc, 4 * SUBTILES_PER_WAVE, 4 * q, 4,
                            lambda cv, bv=bv: f"call <4 x float> @{intrinsic}({vec} {av}, {vec} {bv}, {cv}, "
                                              "i32 0, i32 0, i32 0)")

def mfma_position(em: GpuEmitter, c: str) -> tuple[str, str]:
    """(row, column) in the block's tile of accumulator c (0-15) after accumulate_mfma: register c % 4 of
    sub-tile c // 4."""
    t = Index(em, em.value(em.tid_r))
    ci, lane = Index(em, c), t % WAVE
    return (16 * (t // WAVE) + 4 * (lane // TILE) + ci % 4).v, (TILE * (ci // 4) + lane % TILE).v
