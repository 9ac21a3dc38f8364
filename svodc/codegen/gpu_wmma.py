"""RDNA3's matrix units (WMMA, gfx11): a standalone float16 GEMM kernel, C (f32) = A (f16) x B (f16) for M, N,
K multiples of 16, and the inner step of model GEMM kernels (gpu_gemm.py) on gfx11 when their weights are
float16 or bfloat16 (--precision): `accumulate_wmma` replaces the vector-ALU products of one staged k step.
Both are checked by executing their gfx1100 machine code in the RDNA3 emulator (tests/gpu/rdna3/).

In a model GEMM the block's 64 x 64 tile is 4 x 4 sub-tiles of 16 x 16; wave w (of 8, wave32) owns
sub-tiles 2w and 2w + 1, its lanes' 16 accumulators being the two 8-VGPR results (wmma_position maps
them back to C). The activation operand is rounded to the weights' type as it is read from shared
memory (float16: fptrunc; bfloat16: round to nearest even); the weights are exact in it.

One wave32 workgroup computes one 16 x 16 tile of C with `v_wmma_f32_16x16x16_f16` per 16 steps of
k. Operand layout of that instruction in wave32 (AMD's RDNA3 ISA manual, "Wave Matrix Multiply
Accumulate"): lane l holds, in 8 VGPRs of packed halves, row l % 16 of the A tile (its 16 k values,
A row-major: one contiguous 32-byte load) and column l % 16 of the B tile (16 k values, strided by
N); lanes 16-31 hold the same as lanes 0-15. The result: VGPR v of lane l is C[2 v + l // 16][l % 16].
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.codegen.compile import run_jobs
from svodc.codegen.gpu_emit import GpuEmitter
from svodc.codegen.gpu_tools import check_amd_code_object, link_amd_code_object
from svodc.codegen.llvm_job import LLVMJob
from svodc.codegen.worker import WorkerPool
from svodc.errors import CodegenError
from svodc.gpu_target import GpuTarget
from svodc.ir.dtypes import DType, dtypes

TILE = 16
WAVE = 32
SYMBOL = "svod_wmma_gemm_f16"
WMMA_ARCHS = ("gfx1100", "gfx1151")  # RDNA3 / RDNA3.5: the gfx11 WMMA encoding


@dataclass(frozen=True)
class WmmaGemm:
    m: int
    n: int
    k: int

    @property
    def grid(self) -> int:
        return (self.m // TILE) * (self.n // TILE)

    @property
    def block(self) -> int:
        return WAVE


def wmma_gemm_ir(g: WmmaGemm) -> str:
    """LLVM IR (amdgcn, code object v5) of the kernel SYMBOL(A, B, C): A (m, k) and B (k, n) float16
    row-major, C (m, n) float32 row-major."""
    if min(g.m, g.n, g.k) <= 0 or any(x % TILE for x in (g.m, g.n, g.k)):
        raise CodegenError(f"WMMA GEMM {g.m}x{g.n}x{g.k}: every dimension must be a positive multiple of {TILE}")
    tiles_n = g.n // TILE
    b_loads = []  # lane's column of the B tile: 16 halves, one per k, strided by n
    bv = "zeroinitializer"
    for e in range(TILE):
        b_loads += [f"  %kk{e} = add i32 %k0, {e}", f"  %bk{e} = mul i32 %kk{e}, {g.n}",
                    f"  %bi{e} = add i32 %bk{e}, %col",
                    f"  %bp{e} = getelementptr half, ptr addrspace(1) %b, i32 %bi{e}",
                    f"  %bx{e} = load half, ptr addrspace(1) %bp{e}, align 2",
                    f"  %bv{e} = insertelement <16 x half> {bv}, half %bx{e}, i32 {e}"]
        bv = f"%bv{e}"
    stores = []
    for v in range(8):
        stores += [f"  %cr{v} = add i32 %crow, {2 * v}", f"  %cm{v} = mul i32 %cr{v}, {g.n}",
                   f"  %ci{v} = add i32 %cm{v}, %col",
                   f"  %cp{v} = getelementptr float, ptr addrspace(1) %c, i32 %ci{v}",
                   f"  %cv{v} = extractelement <8 x float> %acc1, i32 {v}",
                   f"  store float %cv{v}, ptr addrspace(1) %cp{v}, align 4"]
    lines = [
        'target triple = "amdgcn-amd-amdhsa"',
        "declare <8 x float> @llvm.amdgcn.wmma.f32.16x16x16.f16(<16 x half>, <16 x half>, <8 x float>)",
        "declare i32 @llvm.amdgcn.workitem.id.x()",
        "declare i32 @llvm.amdgcn.workgroup.id.x()",
        "",
        f"define amdgpu_kernel void @{SYMBOL}(ptr addrspace(1) noalias %a, ptr addrspace(1) noalias %b, "
        "ptr addrspace(1) noalias %c) #0 {",
        "entry:",
        "  %lane = call i32 @llvm.amdgcn.workitem.id.x()",
        "  %tile = call i32 @llvm.amdgcn.workgroup.id.x()",
        f"  %tn = urem i32 %tile, {tiles_n}",
        f"  %tm = udiv i32 %tile, {tiles_n}",
        "  %l16 = and i32 %lane, 15",
        "  %half = lshr i32 %lane, 4",
        f"  %m0 = mul i32 %tm, {TILE}",
        f"  %n0 = mul i32 %tn, {TILE}",
        "  %row = add i32 %m0, %l16",
        "  %col = add i32 %n0, %l16",
        f"  %arow = mul i32 %row, {g.k}",
        "  %crow = add i32 %m0, %half",
        "  br label %loop",
        "loop:",
        "  %k0 = phi i32 [ 0, %entry ], [ %k1, %loop ]",
        "  %acc = phi <8 x float> [ zeroinitializer, %entry ], [ %acc1, %loop ]",
        "  %ai = add i32 %arow, %k0",
        "  %ap = getelementptr half, ptr addrspace(1) %a, i32 %ai",
        "  %av = load <16 x half>, ptr addrspace(1) %ap, align 2",
        *b_loads,
        f"  %acc1 = call <8 x float> @llvm.amdgcn.wmma.f32.16x16x16.f16(<16 x half> %av, <16 x half> {bv}, "
        "<8 x float> %acc)",
        f"  %k1 = add i32 %k0, {TILE}",
        f"  %more = icmp ult i32 %k1, {g.k}",
        "  br i1 %more, label %loop, label %exit",
        "exit:",
        *stores,
        "  ret void",
        "}",
        f'attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="{WAVE},{WAVE}" }}',
        "!llvm.module.flags = !{!0}",
        '!0 = !{i32 1, !"amdhsa_code_object_version", i32 500}',
    ]
    return "\n".join(lines) + "\n"


def compile_wmma_gemm(g: WmmaGemm, target: GpuTarget, workers: WorkerPool, opt_level: int = 2) -> bytes:
    """The loadable code object (ET_DYN, HSA v5) holding the kernel, for a gfx11 target (LLVM on `workers`)."""
    if target.cpu not in WMMA_ARCHS:
        raise CodegenError(f"WMMA GEMM: {target.cpu} has no gfx11 WMMA instructions (targets: {', '.join(WMMA_ARCHS)})")
    job = LLVMJob(f"WMMA GEMM for {target.describe()}", wmma_gemm_ir(g), target.triple, target.cpu,
                  target.llvm_features + ",+wavefrontsize32", opt_level, "small", False, set_datalayout=True)
    (obj, _), = run_jobs([job], workers)
    so = link_amd_code_object(obj, job.name)
    check_amd_code_object(so, target.cpu, {SYMBOL: 3})
    return so


# the model GEMM tile (gpu_gemm.py: 64 x 64, k steps of 16) in WMMA sub-tiles
SUBTILES_PER_SIDE = 4
SUBTILES_PER_WAVE = 2
INTRINSIC = {"float16": ("half", "llvm.amdgcn.wmma.f32.16x16x16.f16"),
             "bfloat16": ("i16", "llvm.amdgcn.wmma.f32.16x16x16.bf16")}


def round_to(em: GpuEmitter, x: str, elem: DType) -> str:
    line, sc = em.emit_line, em.stack[-1]
    if elem is dtypes.float16:
        return line(sc, f"fptrunc float {x} to half")
    b = line(sc, f"bitcast float {x} to i32")  # bfloat16: round to nearest even (finite values)
    odd = line(sc, f"and i32 {line(sc, f'lshr i32 {b}, 16')}, 1")
    up = line(sc, f"add i32 {line(sc, f'add i32 {b}, 32767')}, {odd}")
    return line(sc, f"trunc i32 {line(sc, f'lshr i32 {up}, 16')} to i16")


def _i64(em: GpuEmitter, op: str, a: str, b: str | int) -> str:
    return em.emit_line(em.stack[-1], f"{op} i64 {a}, {b}")


def _subtile(em: GpuEmitter, q: str | int) -> tuple[str, str, str]:
    """(first row, first column) in the block's tile of this wave's sub-tile q, and the lane (0-31)."""
    t = em.value(em.tid_r)
    s = _i64(em, "add nuw nsw", _i64(em, "mul nuw nsw", _i64(em, "udiv", t, WAVE), SUBTILES_PER_WAVE), q)
    row = _i64(em, "mul nuw nsw", _i64(em, "udiv", s, SUBTILES_PER_SIDE), TILE)
    col = _i64(em, "mul nuw nsw", _i64(em, "urem", s, SUBTILES_PER_SIDE), TILE)
    return row, col, _i64(em, "urem", t, WAVE)


def accumulate_wmma(em: GpuEmitter, a_tile: str, a_t: str, b_tile: str, b_t: str, acc: str, elem: DType) -> None:
    """acc += this wave's two sub-tiles of A (64 x 16, row-major in shared memory) x B (16 x 64) for one
    k step of 16, on the matrix units. Runs with every lane of the wave active (WMMA requires it)."""
    line, sc = em.emit_line, em.stack[-1]
    scalar, intrinsic = INTRINSIC[elem.name]
    vec = f"<{TILE} x {scalar}>"
    em.uses_intrinsics.add(f"declare <8 x float> @{intrinsic}({vec}, {vec}, <8 x float>)")
    for q in range(SUBTILES_PER_WAVE):
        row0, col0, lane = _subtile(em, q)
        l16 = _i64(em, "urem", lane, TILE)
        a_row = _i64(em, "mul nuw nsw", _i64(em, "add nuw nsw", row0, l16), TILE)
        b_col = _i64(em, "add nuw nsw", col0, l16)
        av = bv = "poison"
        for e in range(TILE):  # lane: row l16 of the A sub-tile and column l16 of the B sub-tile, k = e
            ia, ib = _i64(em, "add nuw nsw", a_row, e), _i64(em, "add nuw nsw", b_col, e * SUBTILES_PER_SIDE * TILE)
            pa = line(sc, f"getelementptr inbounds float, {a_t} {a_tile}, i64 {ia}", "ptr")
            pb = line(sc, f"getelementptr inbounds float, {b_t} {b_tile}, i64 {ib}", "ptr")
            xa = round_to(em, line(sc, f"load float, {a_t} {pa}, align 4"), elem)
            xb = round_to(em, line(sc, f"load float, {b_t} {pb}, align 4"), elem)
            av = line(sc, f"insertelement {vec} {av}, {scalar} {xa}, i32 {e}")
            bv = line(sc, f"insertelement {vec} {bv}, {scalar} {xb}, i32 {e}")
        update_accumulators(em, acc, 2 * 8, 8 * q, 8,
                            lambda cv, av=av, bv=bv: f"call <8 x float> @{intrinsic}({vec} {av}, {vec} {bv}, {cv})")


def update_accumulators(em: GpuEmitter, acc: str, n: int, first: int, width: int, call) -> None:
    """Accumulators first .. first + width of the thread's n as one <width x float> C, replaced by the D that
    call(C operand) returns (a matrix instruction)."""
    line, sc, pt = em.emit_line, em.stack[-1], em.PRIVATE_PTR
    slots = [em.private_slot(acc, n, first + v) for v in range(width)]
    cv = "poison"
    for v, slot in enumerate(slots):
        x = line(sc, f"load float, {pt} {slot}, align 4")
        cv = line(sc, f"insertelement <{width} x float> {cv}, float {x}, i32 {v}")
    d = line(sc, call(f"<{width} x float> {cv}"))
    for v, slot in enumerate(slots):
        x = line(sc, f"extractelement <{width} x float> {d}, i32 {v}")
        sc.lines.append(f"  store float {x}, {pt} {slot}, align 4")


def wmma_position(em: GpuEmitter, c: str) -> tuple[str, str]:
    """(row, column) in the block's tile of accumulator c (0-15) after accumulate_wmma: VGPR v = c % 8 of
    sub-tile c // 8 holds element [2 v + lane // 16][lane % 16]."""
    row0, col0, lane = _subtile(em, _i64(em, "udiv", c, 8))
    v2 = _i64(em, "mul nuw nsw", _i64(em, "urem", c, 8), 2)
    row = _i64(em, "add nuw nsw", row0, _i64(em, "add nuw nsw", v2, _i64(em, "udiv", lane, TILE)))
    return row, _i64(em, "add nuw nsw", col0, _i64(em, "urem", lane, TILE))
