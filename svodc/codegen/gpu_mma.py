"""NVIDIA's tensor cores through `mma.sync` (sm_80, sm_90): the inner step of model GEMM kernels (gpu_gemm.py)
when their weights are float16 or bfloat16 (--precision), `mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32`
(bf16 likewise, LLVM's llvm.nvvm.mma.m16n8k16.row.col.* intrinsics), float32 accumulation.

The block's staged 64 x 64 tile (k steps of 16) is 4 x 8 sub-tiles of 16 x 8; warp w (of 8) owns the four
sub-tiles in rows 16 (w // 2) .. + 16, columns 32 (w % 2) + 8 j (j = 0..3): one A fragment, four B fragments
and four mma per k step. The activation operand is rounded to the weights' type as it is read from shared
memory (to nearest even: gpu_wmma.round_to; the emulation: the same in integer code); the weights are exact in it.

Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type"; groupID = lane // 4,
threadID_in_group = lane % 4): `a_element`, `b_element`, `c_element` below. They are written with integer
operators only, so the same functions emit the kernel's index arithmetic (on `Index` values) and evaluate
to numbers (tests check them against the manual's tables written out independently).

The `emulate` backend (x86 build of the kernels, tests/gpu/harness.py) models mma.sync as what it is, a
warp-collective step: the lanes' fragments are written in one threads phase, then for each warp the
32 lanes' A and B fragments are scattered into 16 x 16 and 16 x 8 matrices by the same layouts, multiplied
into the C fragments, and the next phase reads each lane's D back.
"""

from __future__ import annotations

from svodc.codegen.gpu_emit import GpuEmitter, loop_range
from svodc.codegen.gpu_wmma import round_to
from svodc.gemm_plan import GPU_BN, GPU_TK
from svodc.ir.dtypes import DType, dtypes

WARP = 32
M, N, K = 16, 8, 16  # one mma.sync
TILE_K, TILE_N = GPU_TK, GPU_BN  # row lengths of the staged A (64 x 16) and B (16 x 64) tiles (gpu_gemm.py)
SUBTILES_PER_WARP = 4  # 16 x 8 sub-tiles, side by side along n
ACCUMULATORS = SUBTILES_PER_WARP * 4
INTRINSIC = {"float16": ("llvm.nvvm.mma.m16n8k16.row.col.f32.f32", "<2 x half>"),
             "bfloat16": ("llvm.nvvm.mma.m16n8k16.row.col.bf16", "i32")}


class Index:
    """An i64 value of the kernel being emitted, with + * // % against ints or other Index values (constants
    folded), so one formula serves emission and evaluation."""

    def __init__(self, em: GpuEmitter, v: str):
        self.em, self.v = em, v

    def _op(self, op: str, other: Index | int) -> Index:
        o = other.v if isinstance(other, Index) else str(other)
        return Index(self.em, self.em.emit_line(self.em.stack[-1], f"{op} i64 {self.v}, {o}"))

    def __add__(self, other: Index | int) -> Index:
        return self if isinstance(other, int) and other == 0 else self._op("add nuw nsw", other)

    __radd__ = __add__

    def __mul__(self, other: int) -> Index | int:
        return 0 if other == 0 else self if other == 1 else self._op("mul nuw nsw", other)

    __rmul__ = __mul__

    def __floordiv__(self, other: int) -> Index:
        return self._op("udiv", other)

    def __mod__(self, other: int) -> Index:
        return self._op("urem", other)


def a_element(lane, i):
    """(row m, column k) in the 16 x 16 A operand of element i (0-7) of a lane's A fragment (registers
    a0..a3 hold elements (0, 1), (2, 3), (4, 5), (6, 7), the lower one in the low half)."""
    group, thread = lane // 4, lane % 4
    return group + 8 * (i // 2 % 2), 2 * thread + i % 2 + 8 * (i // 4)


def b_element(lane, i):
    """(row k, column n) in the 16 x 8 B operand of element i (0-3) of a lane's B fragment (b0, b1)."""
    group, thread = lane // 4, lane % 4
    return 2 * thread + i % 2 + 8 * (i // 2), group


def c_element(lane, i):
    """(row m, column n) in the 16 x 8 C / D of element i (0-3) of a lane's accumulators."""
    group, thread = lane // 4, lane % 4
    return group + 8 * (i // 2), 2 * thread + i % 2


def warp_origin(warp):
    """(first row, first column) in the block's tile of a warp's four sub-tiles (sub-tile j at column + 8 j)."""
    return 16 * (warp // 2), 32 * (warp % 2)


def a_fetch(thread, i):
    """Where in the staged A tile (64 x 16, row-major) a thread's A element i comes from."""
    row0, _ = warp_origin(thread // WARP)
    r, k = a_element(thread % WARP, i)
    return (row0 + r) * TILE_K + k


def b_fetch(thread, j, i):
    """Where in the staged B tile (16 x 64, row-major) element i of a thread's B fragment of sub-tile j comes from."""
    _, col0 = warp_origin(thread // WARP)
    k, n = b_element(thread % WARP, i)
    return k * TILE_N + (col0 + 8 * j + n)


def accumulator_position(thread, c):
    """(row, column) in the block's tile of a thread's accumulator c (0-15): element c % 4 of sub-tile c // 4."""
    row0, col0 = warp_origin(thread // WARP)
    r, n = c_element(thread % WARP, c % 4)
    return row0 + r, col0 + 8 * (c // 4) + n


def _emulated_round(em: GpuEmitter, x: str, elem: DType) -> str:
    """x rounded to float16 / bfloat16 (to nearest even), kept as a float32, in integer code (x86 has no
    half type without a runtime helper)."""
    sc = em.stack[-1]

    def op(rhs: str) -> str:
        return em.emit_line(sc, rhs)

    if elem is dtypes.bfloat16:
        wide = op(f"zext i16 {round_to(em, x, elem)} to i32")
        return op(f"bitcast i32 {op(f'shl i32 {wide}, 16')} to float")
    b = op(f"bitcast float {x} to i32")
    mag = op(f"and i32 {b}, 2147483647")
    odd = op(f"and i32 {op(f'lshr i32 {mag}, 13')}, 1")
    up = op(f"add i32 {op(f'add i32 {mag}, 4095')}, {odd}")
    normal = op(f"and i32 {up}, -8192")  # 13 low bits dropped, to nearest even
    normal = op(f"select i1 {op(f'icmp ugt i32 {normal}, 1199562752')}, i32 2139095040, i32 {normal}")  # > 65504: inf
    tiny = op(f"bitcast i32 {mag} to float")  # |x| < 2^-14: a float16 subnormal, steps of 2^-24 = ulp(0.5)
    tiny = op(f"fadd float {tiny}, 0.5")
    tiny = op(f"bitcast float {op(f'fsub float {tiny}, 0.5')} to i32")
    r = op(f"select i1 {op(f'icmp ult i32 {mag}, 947912704')}, i32 {tiny}, i32 {normal}")
    r = op(f"select i1 {op(f'icmp ugt i32 {mag}, 2139095040')}, i32 {mag}, i32 {r}")  # NaN stays
    sign = op(f"and i32 {b}, -2147483648")
    return op(f"bitcast i32 {op(f'or i32 {r}, {sign}')} to float")


def _slot(em: GpuEmitter, array: str, n: int, thread: Index | None, i: int, t: str) -> str:
    """Element i of a thread's private array (thread: the emulation's warp phase, which indexes all threads)."""
    if thread is None:
        return em.private_slot(array, n, i, t)
    off = thread * n + i
    return em.emit_line(em.stack[-1], f"getelementptr inbounds {t}, ptr {array}, i64 {off.v}", "ptr")


def accumulate_mma(em: GpuEmitter, a_tile: str, a_t: str, b_tile: str, b_t: str, acc: str, elem: DType) -> None:
    """acc += this warp's A rows (16 x 16 of the staged A tile) x its four 16 x 8 sub-tiles of B, one k step.
    Opens its own threads phases (the emulation's warp-collective step lies between them)."""
    line, pt = em.emit_line, em.PRIVATE_PTR
    scalar = "float" if em.emulated else ("half" if elem is dtypes.float16 else "i16")
    fa, fb = em.private_array(8, scalar), em.private_array(4 * SUBTILES_PER_WARP, scalar)
    with em.threads():
        sc = em.stack[-1]
        t = Index(em, em.value(em.tid_r))

        def fetch(tile: str, tile_t: str, idx: Index, frag: str, n: int, i: int) -> None:
            p = line(sc, f"getelementptr inbounds float, {tile_t} {tile}, i64 {idx.v}", "ptr")
            x = line(sc, f"load float, {tile_t} {p}, align 4")
            x = _emulated_round(em, x, elem) if em.emulated else round_to(em, x, elem)
            sc.lines.append(f"  store {scalar} {x}, {pt} {em.private_slot(frag, n, i, scalar)}")

        for i in range(8):
            fetch(a_tile, a_t, a_fetch(t, i), fa, 8, i)
        for j in range(SUBTILES_PER_WARP):
            for i in range(4):
                fetch(b_tile, b_t, b_fetch(t, j, i), fb, 4 * SUBTILES_PER_WARP, 4 * j + i)
    if em.emulated:
        _emulated_warp_mma(em, fa, fb, acc)
        return
    intrinsic, reg = INTRINSIC[elem.name]
    em.uses_intrinsics.add(f"declare {{float, float, float, float}} @{intrinsic}({', '.join([reg] * 6)}, "
                           "float, float, float, float)")
    with em.threads():
        sc = em.stack[-1]

        def pairs(frag: str, n: int, first: int, count: int) -> list[str]:
            xs = [line(sc, f"load {scalar}, {pt} {em.private_slot(frag, n, first + e, scalar)}") for e in range(count)]
            if elem is dtypes.float16:  # <2 x half>: the lower element first
                out = []
                for lo, hi in zip(xs[::2], xs[1::2], strict=True):
                    v = line(sc, f"insertelement <2 x half> poison, half {lo}, i32 0")
                    out.append(line(sc, f"insertelement <2 x half> {v}, half {hi}, i32 1"))
                return out
            out = []
            for lo, hi in zip(xs[::2], xs[1::2], strict=True):  # a bfloat16 pair: the lower one in bits 0-15
                high = line(sc, f"shl i32 {line(sc, f'zext i16 {hi} to i32')}, 16")
                out.append(line(sc, f"or i32 {line(sc, f'zext i16 {lo} to i32')}, {high}"))
            return out

        a_regs = pairs(fa, 8, 0, 8)
        for j in range(SUBTILES_PER_WARP):
            b_regs = pairs(fb, 4 * SUBTILES_PER_WARP, 4 * j, 4)
            slots = [em.private_slot(acc, ACCUMULATORS, 4 * j + i) for i in range(4)]
            c = [line(sc, f"load float, {pt} {s}, align 4") for s in slots]
            args = ", ".join([f"{reg} {x}" for x in a_regs + b_regs] + [f"float {x}" for x in c])
            d = line(sc, f"call {{float, float, float, float}} @{intrinsic}({args})")
            for i, s in enumerate(slots):
                sc.lines.append(f"  store float {line(sc, f'extractvalue {{float, float, float, float}} {d}, {i}')}, "
                                f"{pt} {s}, align 4")


def _emulated_warp_mma(em: GpuEmitter, fa: str, fb: str, acc: str) -> None:
    """The warp-collective step in the emulation: per warp, every lane's fragments into matrices (by the
    layouts), D = A x B + C per sub-tile, each lane's D elements back into its accumulators."""
    line = em.emit_line
    a_mat, b_mat = em.fresh("mma_a"), em.fresh("mma_b")
    em.allocas += [f"{a_mat} = alloca [{M * K} x float], align 16", f"{b_mat} = alloca [{K * N} x float], align 16"]

    def at(array: str, idx: Index | int) -> str:
        i = idx.v if isinstance(idx, Index) else idx
        return line(em.stack[-1], f"getelementptr inbounds float, ptr {array}, i64 {i}", "ptr")

    def copy(src: str, dst: str) -> None:
        em.stack[-1].lines.append(f"  store float {line(em.stack[-1], f'load float, ptr {src}')}, ptr {dst}")

    em.open_loop(loop_range(-9, em.launch.block // WARP), "0", str(em.launch.block // WARP))
    warp = Index(em, em.stack[-1].ivar)

    def lanes() -> tuple[Index, Index]:
        em.open_loop(loop_range(-10, WARP), "0", str(WARP))
        lane = Index(em, em.stack[-1].ivar)
        return lane, warp * WARP + lane

    lane, thread = lanes()
    for i in range(8):
        r, k = a_element(lane, i)
        copy(_slot(em, fa, 8, thread, i, "float"), at(a_mat, r * K + k))
    em.close_loop()
    for j in range(SUBTILES_PER_WARP):
        lane, thread = lanes()
        for i in range(4):
            k, n = b_element(lane, i)
            copy(_slot(em, fb, 4 * SUBTILES_PER_WARP, thread, 4 * j + i, "float"), at(b_mat, k * N + n))
        em.close_loop()
        lane, thread = lanes()
        sc = em.stack[-1]
        for i in range(4):
            r, n = c_element(lane, i)
            slot = _slot(em, acc, ACCUMULATORS, thread, 4 * j + i, "float")
            d = line(sc, f"load float, ptr {slot}")
            for k in range(K):
                x = line(sc, f"load float, ptr {at(a_mat, r * K + k)}")
                y = line(sc, f"load float, ptr {at(b_mat, k * N + n)}")
                d = line(sc, f"call float @llvm.fmuladd.f32(float {x}, float {y}, float {d})")
            sc.lines.append(f"  store float {d}, ptr {slot}")
        em.close_loop()
    em.uses_intrinsics.add("declare float @llvm.fmuladd.f32(float, float, float)")
    em.close_loop()


def mma_position(em: GpuEmitter, c: str) -> tuple[str, str]:
    """(row, column) in the block's tile of accumulator c after accumulate_mma (accumulator_position)."""
    row, col = accumulator_position(Index(em, em.value(em.tid_r)), Index(em, c))
    return row.v, col.v
