"""GPU code for GEMM nodes: a shared-memory tiled kernel (the first correct version) on the vector ALUs;
with float16/bfloat16 weights (--precision) its inner products run on the matrix units instead, where the
target has them (GpuArch.matrix): mma.sync on sm_80/sm_90 (gpu_mma.py), WMMA on gfx11 (gpu_wmma.py), MFMA
on gfx942 (gpu_mfma.py). Each keeps the same staged tiles and 16 float32 accumulators per thread, in its
own layout (its *_position maps them back to C).

C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]. One block of THREADS = 16 x 16 threads computes a
BM x BN = 64 x 64 tile of C; thread (ty, tx) = (t / 16, t % 16) owns the 4 x 4 elements
(m0 + ty + 16 i, n0 + tx + 16 j): neighbouring threads touch neighbouring columns, so loads of B,
stores of C and reads of the shared B tile are contiguous across a warp. For each step of TK = 16
along k, the block stages an A tile (BM x TK) and a B tile (TK x BN) in shared memory -- every
thread loads 4 elements of each, out-of-range elements read as 0 from a clamped address -- then,
after a barrier, every thread accumulates its 16 products per k in registers; a second barrier
protects the tiles from the next step's loads. Last, every thread stores its elements of C and runs
the epilogue STORE on each of them (the epilogue reads C only at the element it writes, see
passes/lower_gemm.py), bound to that element's (batch, m, n).

Bounded dims (GemmArg.batch_var, m_var, n_var, k_var): the sizes come from `dims`, the block count
scales with them (Launch.dims), and each block strides over the run-time tiles (any block count is
then correct); staging, the k steps and the stores are bounded by the run-time sizes.

Operand addressing follows GemmOperand: strided views, or constants packed in panels at compile
time (svodc/gemm_plan.py: A_PANEL rows of A, B_PANEL columns of B and of a transposed GEMM's A). The
panel layout was chosen for the CPU micro-kernels; the GPU kernel just indexes it. Tile sizes and
the block count come from the same plan.
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.codegen.gpu_emit import GpuEmitter, Launch, loop_range
from svodc.codegen.gpu_mfma import accumulate_mfma, mfma_position
from svodc.codegen.gpu_mma import accumulate_mma, mma_position
from svodc.codegen.gpu_wmma import accumulate_wmma, wmma_position
from svodc.codegen.llvm_gemm import operand_offset
from svodc.gemm_plan import B_PANEL, GPU_BM, GPU_BN, GPU_TK, a_panel, gpu_plan
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import GemmArg, GemmOperand, VarArg
from svodc.ir.uop import UOp

BM, BN, TK = GPU_BM, GPU_BN, GPU_TK
SIDE = 16  # threads per side of a block
THREADS = SIDE * SIDE
RM, RN = BM // SIDE, BN // SIDE
# Unrolling the k loop of a step 16 times keeps 16 x 8 tile values live (~270 VGPRs on gfx942: one
# wave per SIMD) and quadruples LLVM time; 2 keeps both low.
KK_UNROLL = 2
# matrix units (GpuArch.matrix): one k step's products, and accumulator c's (row, column) in the tile
POSITION = {"wmma": wmma_position, "mma": mma_position, "mfma": mfma_position}
ACCUMULATE_IN_PHASE = {"wmma": accumulate_wmma, "mfma": accumulate_mfma}  # mma opens its own phases


def gemm_launch(kernel: int, symbol: str, arg: GemmArg, with_dims: bool = False) -> Launch | None:
    blocks = gpu_plan(arg).blocks
    dims = tuple((v.slot, v.hi) for v in (arg.batch_var, arg.m_var, arg.n_var) if v is not None)
    return Launch(kernel, symbol, blocks, THREADS, dims if with_dims else None) if blocks else None


@dataclass(frozen=True)
class Sizes:
    """A GEMM's m, n, k and batch sizes as i64 values: constants, or read from `dims` (bounded dims)."""

    m: str
    n: str
    k: str
    batch: tuple[str, ...]

    @staticmethod
    def of(em: GpuEmitter, arg: GemmArg) -> Sizes:
        def size(var: VarArg | None, static: int) -> str:
            return str(static) if var is None else em.dim_value(var.slot)
        batch = (size(arg.batch_var, arg.batch[0]), *map(str, arg.batch[1:])) if arg.batch else ()
        return Sizes(size(arg.m_var, arg.m), size(arg.n_var, arg.n), size(arg.k_var, arg.k), batch)


def _ceil_div(em: GpuEmitter, v: str, d: int) -> str:
    if v.isdigit():
        return str(-(-int(v) // d))
    top = em.stack[0]
    return em.emit_line(top, f"udiv i64 {em.emit_line(top, f'add nuw nsw i64 {v}, {d - 1}')}, {d}")


def _minus_one(em: GpuEmitter, v: str) -> str:
    return str(int(v) - 1) if v.isdigit() else em.emit_line(em.stack[0], f"sub nsw i64 {v}, 1")


def _strided(em: GpuEmitter, op: GemmOperand, base: str, row: str, col: str) -> str:
    line, sc = em.emit_line, em.stack[-1]
    r = line(sc, f"mul nsw i64 {row}, {op.row_stride}")
    c = line(sc, f"mul nsw i64 {col}, {op.col_stride}")
    return line(sc, f"add nsw i64 {base}, {line(sc, f'add nsw i64 {r}, {c}')}")


def _panel(em: GpuEmitter, base: str, lane: str, kk: str, panel: int, k: int) -> str:
    """A packed operand's element: `lane` (m of A, n of B) at [lane // panel][kk][lane % panel]."""
    line, sc = em.emit_line, em.stack[-1]
    p = line(sc, f"udiv i64 {lane}, {panel}")
    w = line(sc, f"urem i64 {lane}, {panel}")
    po = line(sc, f"mul nuw nsw i64 {p}, {k * panel}")
    ko = line(sc, f"mul nuw nsw i64 {kk}, {panel}")
    inner = line(sc, f"add nuw nsw i64 {ko}, {w}")
    return line(sc, f"add nsw i64 {base}, {line(sc, f'add nuw nsw i64 {po}, {inner}')}")


F16_TO_F32_SCALE = "0x46F0000000000000"  # 2^112: a float16's bits << 13 as a float32, times this, is its value


def load_float(em: GpuEmitter, param: str, off: str, elem: DType) -> str:
    """Element `off` of an operand as a float32 value: float32, or float16 / bfloat16 weights (--precision)
    widened exactly. float16 on the x86 emulation by integer code (LLVM would call a runtime helper there)."""
    line, sc = em.emit_line, em.stack[-1]
    if elem is dtypes.float32:
        return line(sc, f"load float, ptr {line(sc, f'getelementptr inbounds float, ptr {param}, i64 {off}', 'ptr')}")
    h = line(sc, f"load i16, ptr {line(sc, f'getelementptr inbounds i16, ptr {param}, i64 {off}', 'ptr')}, align 2")
    if elem is dtypes.bfloat16:  # the high half of a float32
        wide = line(sc, f"zext i16 {h} to i32")
        return line(sc, f"bitcast i32 {line(sc, f'shl i32 {wide}, 16')} to float")
    assert elem is dtypes.float16, elem
    if not em.emulated:
        return line(sc, f"fpext half {line(sc, f'bitcast i16 {h} to half')} to float")
    x = line(sc, f"zext i16 {h} to i32")
    mag = line(sc, f"and i32 {x}, 32767")
    shifted = line(sc, f"shl i32 {mag}, 13")
    scaled = line(sc, f"fmul float {line(sc, f'bitcast i32 {shifted} to float')}, {F16_TO_F32_SCALE}")
    special = line(sc, f"or i32 {shifted}, 2139095040")  # exponent 31 (inf, NaN) -> 255
    bits = line(sc, f"select i1 {line(sc, f'icmp uge i32 {mag}, 31744')}, i32 {special}, "
                    f"i32 {line(sc, f'bitcast float {scaled} to i32')}")
    sign = line(sc, f"shl i32 {line(sc, f'and i32 {x}, 32768')}, 16")
    return line(sc, f"bitcast i32 {line(sc, f'or i32 {bits}, {sign}')} to float")


def _stage(em: GpuEmitter, arg: GemmArg, size: Sizes, which: str, param: str, elem: DType, base: str, tile: str,
           tile_t: str, r0: str, c0: str) -> None:
    """Every thread copies its share of one operand tile into shared memory (zero outside the operand).
    A tile: BM rows (m) x TK columns (k); B tile: TK rows (k) x BN columns (n); both row-major."""
    rows, cols = (BM, TK) if which == "a" else (TK, BN)
    limit_r, limit_c = (size.m, size.k) if which == "a" else (size.k, size.n)
    last_r, last_c = _minus_one(em, limit_r), _minus_one(em, limit_c)
    line, sc = em.emit_line, em.stack[-1]
    t = em.value(em.tid_r)
    for e in range(rows * cols // THREADS):
        idx = line(sc, f"add nuw nsw i64 {t}, {e * THREADS}")
        r = line(sc, f"add nuw nsw i64 {r0}, {line(sc, f'udiv i64 {idx}, {cols}')}")
        c = line(sc, f"add nuw nsw i64 {c0}, {line(sc, f'urem i64 {idx}, {cols}')}")
        ok_r = line(sc, f"icmp ult i64 {r}, {limit_r}")
        ok_c = line(sc, f"icmp ult i64 {c}, {limit_c}")
        rc = line(sc, f"select i1 {ok_r}, i64 {r}, i64 {last_r}")  # clamped: the load is always in bounds
        cc = line(sc, f"select i1 {ok_c}, i64 {c}, i64 {last_c}")
        if which == "a" and arg.a.packed:  # A (m, k); a transposed GEMM packs A like B (B_PANEL rows)
            off = _panel(em, base, rc, cc, a_panel(arg), arg.k)
        elif which == "b" and arg.b.packed:  # B (k, n)
            off = _panel(em, base, cc, rc, B_PANEL, arg.k)
        else:
            off = _strided(em, arg.a if which == "a" else arg.b, base, rc, cc)
        v = load_float(em, param, off, elem)
        ok = line(sc, f"and i1 {ok_r}, {ok_c}")
        v = line(sc, f"select i1 {ok}, float {v}, float 0.0")
        sp = line(sc, f"getelementptr inbounds float, {tile_t} {tile}, i64 {idx}", "ptr")
        sc.lines.append(f"  store float {v}, {tile_t} {sp}, align 4")


def _thread_yx(em: GpuEmitter) -> tuple[str, str]:
    t = em.value(em.tid_r)
    return (em.emit_line(em.stack[-1], f"udiv i64 {t}, {SIDE}"), em.emit_line(em.stack[-1], f"urem i64 {t}, {SIDE}"))


def _accumulate(em: GpuEmitter, a_tile: str, a_t: str, b_tile: str, b_t: str, acc: str) -> None:
    """acc[i][j] += A[ty + 16 i][kk] * B[kk][tx + 16 j] over the kk of one staged step."""
    line = em.emit_line
    ty, tx = _thread_yx(em)
    slots = [em.private_slot(acc, RM * RN, i) for i in range(RM * RN)]
    em.open_loop(loop_range(-6, TK), "0", str(TK), loop_md=em.unroll(KK_UNROLL))
    sc = em.stack[-1]
    kk = sc.ivar
    a_vals, b_vals = [], []
    for i in range(RM):
        row = line(sc, f"add nuw nsw i64 {ty}, {SIDE * i}")
        idx = line(sc, f"add nuw nsw i64 {line(sc, f'mul nuw nsw i64 {row}, {TK}')}, {kk}")
        p = line(sc, f"getelementptr inbounds float, {a_t} {a_tile}, i64 {idx}", "ptr")
        a_vals.append(line(sc, f"load float, {a_t} {p}, align 4"))
    for j in range(RN):
        col = line(sc, f"add nuw nsw i64 {tx}, {SIDE * j}")
        idx = line(sc, f"add nuw nsw i64 {line(sc, f'mul nuw nsw i64 {kk}, {BN}')}, {col}")
        p = line(sc, f"getelementptr inbounds float, {b_t} {b_tile}, i64 {idx}", "ptr")
        b_vals.append(line(sc, f"load float, {b_t} {p}, align 4"))
    em.uses_intrinsics.add("declare float @llvm.fmuladd.f32(float, float, float)")
    pt = em.PRIVATE_PTR
    for i in range(RM):
        for j in range(RN):
            slot = slots[i * RN + j]
            cur = line(sc, f"load float, {pt} {slot}, align 4")
            new = line(sc, f"call float @llvm.fmuladd.f32(float {a_vals[i]}, float {b_vals[j]}, float {cur})")
            sc.lines.append(f"  store float {new}, {pt} {slot}, align 4")
    em.close_loop()


def _tiled_position(em: GpuEmitter, c: str) -> tuple[str, str]:
    """(row, column) in the block's tile of accumulator c of this thread: (ty + 16 i, tx + 16 j)."""
    line, sc = em.emit_line, em.stack[-1]
    ty, tx = _thread_yx(em)
    i = line(sc, f"mul nuw nsw i64 {line(sc, f'udiv i64 {c}, {RN}')}, {SIDE}")
    j = line(sc, f"mul nuw nsw i64 {line(sc, f'urem i64 {c}, {RN}')}, {SIDE}")
    return line(sc, f"add nuw nsw i64 {ty}, {i}"), line(sc, f"add nuw nsw i64 {tx}, {j}")


def _store(em: GpuEmitter, arg: GemmArg, size: Sizes, pc: str, c_base: str, m0: str, n0: str, batch: list[str],
           acc: str, epilogue: UOp | None, ranges: tuple[UOp, ...], matrix: str | None) -> None:
    """Every thread writes its elements of C that lie inside C, each followed by the epilogue. A loop
    over the thread's RM x RN elements, so the epilogue's code exists once (not RM x RN times); the
    element's value is picked from the accumulators (registers) by a chain of selects. matrix: the
    accumulators are in those matrix units' layout (POSITION)."""
    line = em.emit_line
    values = [line(em.stack[-1], f"load float, {em.PRIVATE_PTR} {em.private_slot(acc, RM * RN, c)}, align 4")
              for c in range(RM * RN)]
    em.open_loop(loop_range(-7, RM * RN), "0", str(RM * RN), loop_md=em.unroll(1))
    sc = em.stack[-1]
    c = sc.ivar
    v = values[0]
    for e in range(1, RM * RN):
        v = line(sc, f"select i1 {line(sc, f'icmp eq i64 {c}, {e}')}, float {values[e]}, float {v}")
    row, col = (POSITION[matrix] if matrix else _tiled_position)(em, c)
    m = line(sc, f"add nuw nsw i64 {m0}, {row}")
    n = line(sc, f"add nuw nsw i64 {n0}, {col}")
    inside = line(sc, f"and i1 {line(sc, f'icmp ult i64 {m}, {size.m}')}, {line(sc, f'icmp ult i64 {n}, {size.n}')}")
    k = em.fresh_label()
    sc.lines += [f"  br i1 {inside}, label %E{k}.in, label %E{k}.out", f"E{k}.in:"]
    off = _strided(em, arg.c, c_base, m, n)
    p = line(sc, f"getelementptr inbounds float, ptr {pc}, i64 {off}", "ptr")
    sc.lines.append(f"  store float {v}, ptr {p}, align 4")
    if epilogue is not None:
        *batch_ranges, m_range, n_range = ranges
        bound = [*zip(batch_ranges, batch, strict=True), (m_range, m), (n_range, n)]
        for r, val in bound:
            em.bind_range(r, val)
        em.emit_statement(epilogue)
        for _ in bound:
            em.close_loop()
    sc.lines += [f"  br label %E{k}.out", f"E{k}.out:"]
    em.close_loop()


def emit_gpu_gemm(em: GpuEmitter, node: UOp) -> None:
    arg: GemmArg = node.arg
    elem_a, elem_b, elem_c = (x.dtype.base for x in node.src[:3])
    assert elem_c is dtypes.float32 and {elem_a, elem_b} <= {dtypes.float32, dtypes.float16, dtypes.bfloat16}, \
        "GEMM kernels compute in float32 (packed constants may be float16/bfloat16: --precision)"
    # float16/bfloat16 weights (--precision): the matrix units, the other operand rounded to that type
    reduced = {elem_a, elem_b} - {dtypes.float32}
    unit = em.matrix if len(reduced) == 1 else None
    low = next(iter(reduced)) if unit else None
    pa, pb, pc = (em.value(x) for x in node.src[:3])
    epilogue = node.src[3] if len(node.src) > 3 else None
    ranges = node.src[4:]
    plan = gpu_plan(arg)
    line = em.emit_line
    a_tile, a_t = em.shared("As", BM * TK)
    b_tile, b_t = em.shared("Bs", TK * BN)
    acc = em.private_array(RM * RN)
    size = Sizes.of(em, arg)
    steps = _ceil_div(em, size.k, TK)
    loop_sizes = (_ceil_div(em, size.n, BN), _ceil_div(em, size.m, BM), *reversed(size.batch))
    with em.blocks():
        tile = em.value(em.bid_r)
        if arg.runtime:  # the block strides over the run-time tiles
            em.open_loop(loop_range(-8, plan.blocks), tile, em.product(list(loop_sizes)), em.grid_value())
            tile = em.stack[-1].ivar
        sc = em.stack[-1]
        tn, tm, *batch = em.split_flat(sc, tile, list(reversed(loop_sizes)))
        batch.reverse()
        m0 = line(sc, f"mul nuw nsw i64 {tm}, {BM}")
        n0 = line(sc, f"mul nuw nsw i64 {tn}, {BN}")
        a_base, b_base, c_base = (operand_offset(em, sc, op, batch) for op in (arg.a, arg.b, arg.c))
        pt = em.PRIVATE_PTR
        with em.threads():
            for i in range(RM * RN):
                em.stack[-1].lines.append(f"  store float 0.0, {pt} {em.private_slot(acc, RM * RN, i)}, align 4")
        em.open_loop(loop_range(-5, plan.steps), "0", steps)
        k0 = line(em.stack[-1], f"mul nuw nsw i64 {em.stack[-1].ivar}, {TK}")
        with em.threads():
            _stage(em, arg, size, "a", pa, elem_a, a_base, a_tile, a_t, m0, k0)
            _stage(em, arg, size, "b", pb, elem_b, b_base, b_tile, b_t, k0, n0)
        em.barrier()
        if unit == "mma":
            accumulate_mma(em, a_tile, a_t, b_tile, b_t, acc, low)
        else:
            with em.threads():
                if unit:
                    ACCUMULATE_IN_PHASE[unit](em, a_tile, a_t, b_tile, b_t, acc, low)
                else:
                    _accumulate(em, a_tile, a_t, b_tile, b_t, acc)
        em.barrier()  # the next step overwrites the tiles
        em.close_loop()
        with em.threads():
            _store(em, arg, size, pc, c_base, m0, n0, batch, acc, epilogue, ranges, unit)
        if arg.runtime:
            em.close_loop()
