"""CPU code for GEMM nodes: a register-blocked micro-kernel and the tile loop around it.

C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]. One operand is read as vectors (the "vector side", vw
floats per load), the other as broadcast scalars (the "scalar side"): normally B is the vector side
(lanes run along n) and A the scalar side (tile rows are m); a transposed GEMM swaps them (lanes along
m, rows along n) and stores its C tiles with a stride.

The output is cut into rows x lanes tiles; the tiles of all batch indices form one parallel loop,
split statically across threads, with row tiles innermost so consecutive tiles reuse the same vector
panel. For each tile a micro-kernel keeps rows x (lanes/vw) vector accumulators in registers for the
whole K loop, then stores the tile to C. The epilogue (the kernel's STORE over m and n) rewrites the
tile in place while it is still in cache.

Every size is a compile-time constant: each kernel gets micro-kernels specialized for its strides,
plus tail variants for the last row and lane tiles (masked vector loads and stores at the edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import A_PANEL, B_PANEL, GemmArg, GemmOperand, Ops, RangeArg, RangeKind
from svodc.ir.uop import UOp
from svodc.target import Target

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope


@dataclass(frozen=True)
class Side:
    """How one operand is addressed inside a tile, in elements from the tile's pointer:
    scalar side: element (row i, k) at k*k_stride + i*row_stride;
    vector side: lane l at k (l = 0.. lanes) at k*k_stride + panel(l) + l % B_PANEL when packed,
    else at k*k_stride + l*lane_stride (lane_stride 1: contiguous vectors)."""

    k_stride: int
    row_stride: int = 0  # scalar side
    packed_panels: bool = False  # vector side packed in B_PANEL-wide panels
    lane_stride: int = 1


def blocking(target: Target, arg: GemmArg) -> tuple[int, int, int]:
    """(rows, lanes, vw): tile rows (scalar side), tile lanes (vector side), floats per vector."""
    vw = target.vector_bits // 32
    rows_total = arg.n if arg.transposed else arg.m
    if rows_total <= 2:  # matrix-vector-like: widen the tile so enough accumulators hide FMA latency
        return rows_total, max(min(8 * vw, 128), B_PANEL), vw
    if target.vector_regs >= 32:
        return 8, 2 * vw, vw  # 16 accumulators of 32 registers
    return 4, 2 * vw, vw  # 8 accumulators of 16 registers


def _mask(lanes: int, vw: int) -> str:
    return "<" + ", ".join(f"i1 {'true' if i < lanes else 'false'}" for i in range(vw)) + ">"


def micro_kernel(name: str, k: int, rows: int, lanes: int, vw: int, s: Side, v: Side, c_row: int,
                 c_lane: int, intrinsics: set[str]) -> str:
    """void NAME(ptr s, ptr v, ptr c): C tile (rows x lanes) = S[rows, :] x V[:, lanes].
    C element (row i, lane l) is stored at i*c_row + l*c_lane."""
    vt = f"<{vw} x float>"
    nvec = -(-lanes // vw)
    tail = lanes - (nvec - 1) * vw  # lanes used in the last vector
    fma = f"llvm.fmuladd.v{vw}f32"
    intrinsics.add(f"declare {vt} @{fma}({vt}, {vt}, {vt})")
    masked_v = tail != vw and not v.packed_panels
    if masked_v or (tail != vw and c_lane == 1):
        intrinsics.add(f"declare {vt} @llvm.masked.load.v{vw}f32.p0(ptr, i32, <{vw} x i1>, {vt})")
        intrinsics.add(f"declare void @llvm.masked.store.v{vw}f32.p0({vt}, ptr, i32, <{vw} x i1>)")
    if c_lane != 1:
        intrinsics.add(f"declare void @llvm.masked.scatter.v{vw}f32.v{vw}p0({vt}, <{vw} x ptr>, i32, <{vw} x i1>)")
    mask = _mask(tail, vw)
    full = _mask(vw, vw)
    L = [f"define internal void @{name}(ptr noalias %s, ptr noalias %v, ptr noalias %c) #0 {{", "entry:",
         "  br label %loop", "loop:", "  %k = phi i64 [ 0, %entry ], [ %k.next, %loop ]"]
    for i in range(rows):
        for j in range(nvec):
            L.append(f"  %acc{i}.{j} = phi {vt} [ zeroinitializer, %entry ], [ %nacc{i}.{j}, %loop ]")
    L.append(f"  %vk = mul nsw i64 %k, {v.k_stride}")
    for j in range(nvec):
        lane = j * vw
        const = ((lane // B_PANEL) * k * B_PANEL + lane % B_PANEL) if v.packed_panels else lane * v.lane_stride
        L.append(f"  %vo{j} = add nsw i64 %vk, {const}")
        L.append(f"  %vp{j} = getelementptr inbounds float, ptr %v, i64 %vo{j}")
        if j == nvec - 1 and masked_v:
            L.append(f"  %vv{j} = call {vt} @llvm.masked.load.v{vw}f32.p0(ptr %vp{j}, i32 4, <{vw} x i1> {mask}, "
                     f"{vt} zeroinitializer)")
        else:
            L.append(f"  %vv{j} = load {vt}, ptr %vp{j}, align 4")
    L.append(f"  %sk = mul nsw i64 %k, {s.k_stride}")
    for i in range(rows):
        L.append(f"  %so{i} = add nsw i64 %sk, {i * s.row_stride}")
        L.append(f"  %sp{i} = getelementptr inbounds float, ptr %s, i64 %so{i}")
        L.append(f"  %ss{i} = load float, ptr %sp{i}, align 4")
        L.append(f"  %si{i} = insertelement {vt} poison, float %ss{i}, i64 0")
        L.append(f"  %sv{i} = shufflevector {vt} %si{i}, {vt} poison, <{vw} x i32> zeroinitializer")
        for j in range(nvec):
            L.append(f"  %nacc{i}.{j} = call {vt} @{fma}({vt} %sv{i}, {vt} %vv{j}, {vt} %acc{i}.{j})")
    L += ["  %k.next = add nuw nsw i64 %k, 1", f"  %more = icmp ult i64 %k.next, {k}",
          "  br i1 %more, label %loop, label %done", "done:"]
    lane_offsets = "<" + ", ".join(f"i64 {lane * c_lane}" for lane in range(vw)) + ">"
    for i in range(rows):
        for j in range(nvec):
            m = mask if j == nvec - 1 else full
            base = i * c_row + j * vw * c_lane
            L.append(f"  %cp{i}.{j} = getelementptr inbounds float, ptr %c, i64 {base}")
            if c_lane != 1:
                L.append(f"  %cv{i}.{j} = getelementptr inbounds float, ptr %cp{i}.{j}, <{vw} x i64> {lane_offsets}")
                L.append(f"  call void @llvm.masked.scatter.v{vw}f32.v{vw}p0({vt} %nacc{i}.{j}, <{vw} x ptr> "
                         f"%cv{i}.{j}, i32 4, <{vw} x i1> {m})")
            elif j == nvec - 1 and tail != vw:
                L.append(f"  call void @llvm.masked.store.v{vw}f32.p0({vt} %nacc{i}.{j}, ptr %cp{i}.{j}, i32 4, "
                         f"<{vw} x i1> {mask})")
            else:
                L.append(f"  store {vt} %nacc{i}.{j}, ptr %cp{i}.{j}, align 4")
    L += ["  ret void", "}"]
    return "\n".join(L)


def _offset(em: KernelEmitter, scope: Scope, op: GemmOperand, batch: list[str], terms: list[tuple[str, int]]) -> str:
    """op.offset + sum(batch_i * batch_stride_i) + sum(value * coef) as an i64 SSA value."""
    acc = str(op.offset)
    for v, s in [*zip(batch, op.batch_strides, strict=True), *terms]:
        if s == 0:
            continue
        t = em.emit_line(scope, f"mul nsw i64 {v}, {s}")
        acc = em.emit_line(scope, f"add nsw i64 {acc}, {t}")
    return acc


def _sides(arg: GemmArg) -> tuple[Side, Side, int, int]:
    """(scalar side, vector side, C stride per tile row, C stride per lane)."""
    a, b, c = arg.a, arg.b, arg.c
    if not arg.transposed:
        s = Side(A_PANEL, 1) if a.packed else Side(a.col_stride, a.row_stride)
        v = Side(B_PANEL, packed_panels=True) if b.packed else Side(b.row_stride, lane_stride=b.col_stride)
        return s, v, c.row_stride, 1
    # transposed: rows run along n (B's columns), lanes along m (A's rows, packed in B_PANEL panels)
    assert a.packed and not b.packed
    return Side(b.row_stride, b.col_stride), Side(B_PANEL, packed_panels=True), 1, c.row_stride


def emit_gemm(em: KernelEmitter, node: UOp, target: Target) -> None:
    arg: GemmArg = node.arg
    rows, lanes, vw = blocking(target, arg)
    pa, pb, pc = (em.value(x) for x in node.src[:3])
    epilogue = node.src[3] if len(node.src) > 3 else None
    ranges = node.src[4:]
    rows_total, lanes_total = (arg.n, arg.m) if arg.transposed else (arg.m, arg.n)
    rt_n, lt_n = -(-rows_total // rows), -(-lanes_total // lanes)
    tiles = math.prod(arg.batch) * rt_n * lt_n
    rows_tail, lanes_tail = rows_total - (rt_n - 1) * rows, lanes_total - (lt_n - 1) * lanes
    s_side, v_side, c_row, c_lane = _sides(arg)
    variants = {(r, c): f"{em.name}.mk{r}x{c}" for r in {rows, rows_tail} for c in {lanes, lanes_tail}}
    for (r, c), fname in variants.items():
        em.extra_functions.append(micro_kernel(fname, arg.k, r, c, vw, s_side, v_side, c_row, c_lane,
                                               em.uses_intrinsics))

    t_range = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, tiles),), RangeArg(-1, RangeKind.PARALLEL))
    start, stop = em.thread_split(str(tiles))
    em.open_loop(t_range, start, stop)
    sc = em.stack[-1]
    t = sc.ivar
    line = em.emit_line
    rt = line(sc, f"urem i64 {t}, {rt_n}")
    rest = line(sc, f"udiv i64 {t}, {rt_n}")
    lt = line(sc, f"urem i64 {rest}, {lt_n}")
    flat = line(sc, f"udiv i64 {rest}, {lt_n}")
    batch: list[str] = []
    for d in reversed(arg.batch):
        batch.append(line(sc, f"urem i64 {flat}, {d}"))
        flat = line(sc, f"udiv i64 {flat}, {d}")
    batch.reverse()
    r0 = line(sc, f"mul nuw nsw i64 {rt}, {rows}")
    l0 = line(sc, f"mul nuw nsw i64 {lt}, {lanes}")
    m0, n0 = (l0, r0) if arg.transposed else (r0, l0)
    if arg.a.packed and arg.transposed:
        panel = line(sc, f"udiv i64 {m0}, {B_PANEL}")
        within = line(sc, f"urem i64 {m0}, {B_PANEL}")
        a_off = _offset(em, sc, arg.a, batch, [(panel, arg.k * B_PANEL), (within, 1)])
    elif arg.a.packed:
        panel = line(sc, f"udiv i64 {m0}, {A_PANEL}")
        within = line(sc, f"urem i64 {m0}, {A_PANEL}")
        a_off = _offset(em, sc, arg.a, batch, [(panel, arg.k * A_PANEL), (within, 1)])
    else:
        a_off = _offset(em, sc, arg.a, batch, [(m0, arg.a.row_stride)])
    if arg.b.packed:
        panel = line(sc, f"udiv i64 {n0}, {B_PANEL}")
        within = line(sc, f"urem i64 {n0}, {B_PANEL}")
        b_off = _offset(em, sc, arg.b, batch, [(panel, arg.k * B_PANEL), (within, 1)])
    else:
        b_off = _offset(em, sc, arg.b, batch, [(n0, arg.b.col_stride)])
    c_off = _offset(em, sc, arg.c, batch, [(m0, arg.c.row_stride), (n0, 1)])
    a_ptr, b_ptr, c_ptr = (line(sc, f"getelementptr inbounds float, ptr {p}, i64 {o}", "ptr") for p, o in
                           ((pa, a_off), (pb, b_off), (pc, c_off)))
    s_ptr, v_ptr = (b_ptr, a_ptr) if arg.transposed else (a_ptr, b_ptr)
    call_args = f"ptr {s_ptr}, ptr {v_ptr}, ptr {c_ptr}"
    last_r = line(sc, f"icmp eq i64 {rt}, {rt_n - 1}") if rows_tail != rows else "false"
    last_l = line(sc, f"icmp eq i64 {lt}, {lt_n - 1}") if lanes_tail != lanes else "false"
    k = em.fresh_label()
    sc.lines.append(f"  br i1 {last_r}, label %T{k}.t, label %T{k}.f")
    for tag, r in (("f", rows), ("t", rows_tail)):
        sc.lines += [f"T{k}.{tag}:", f"  br i1 {last_l}, label %T{k}.{tag}t, label %T{k}.{tag}f"]
        for sub, c in (("f", lanes), ("t", lanes_tail)):
            sc.lines += [f"T{k}.{tag}{sub}:", f"  call void @{variants[(r, c)]}({call_args})",
                         f"  br label %T{k}.join"]
    sc.lines.append(f"T{k}.join:")
    if epilogue is not None:
        nrows = line(sc, f"select i1 {last_r}, i64 {rows_tail}, i64 {rows}")
        nlanes = line(sc, f"select i1 {last_l}, i64 {lanes_tail}, i64 {lanes}")
        r1 = line(sc, f"add nuw nsw i64 {r0}, {nrows}")
        l1 = line(sc, f"add nuw nsw i64 {l0}, {nlanes}")
        m1, n1 = (l1, r1) if arg.transposed else (r1, l1)
        *batch_ranges, m_range, n_range = ranges
        for r, v in zip(batch_ranges, batch, strict=True):
            em.bind_range(r, v)
        em.open_loop(m_range, m0, m1)  # n innermost: contiguous in C
        em.open_loop(n_range, n0, n1)
        em.emit_statement(epilogue)
        em.close_loop()
        em.close_loop()
        for _ in batch_ranges:
            em.close_loop()
    em.close_loop()
