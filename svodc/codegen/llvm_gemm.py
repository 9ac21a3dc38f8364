"""CPU code for GEMM nodes: a register-blocked micro-kernel and the tile loop around it.

C[b, m, n] = sum_k A[b, m, k] * B[b, k, n]. One operand is read as vectors (the "vector side", vw
floats per load), the other as broadcast scalars (the "scalar side"): normally B is the vector side
(lanes run along n) and A the scalar side (tile rows are m); a transposed GEMM swaps them (lanes along
m, rows along n) and stores its C tiles with a stride.

The output is cut into rows x lanes tiles; the tiles of all batch indices form one parallel loop,
cut into parts that the entry's work queue hands to the threads (codegen/module.py), with row tiles
innermost so consecutive tiles reuse the same vector panel (lane tiles innermost when the panels are
small, see emit_gemm). For each tile a micro-kernel keeps rows x (lanes/vw) vector accumulators in
registers for its K loop (unrolled by the variant's GemmBlocking, svodc/policy.py), then stores the
tile to C, or returns it to the epilogue in registers (llvm_gemm_epilogue.py), which stores C once.
Otherwise the epilogue (the kernel's STORE over m and n) rewrites the stored tile in place while it
is still in cache. A long K is cut into k blocks (gemm_plan.py): the part's tiles run once per block,
adding to C after the first, the epilogue after the last. An unpacked B that several row tiles
reuse is copied contiguous per lane tile (and k block) to a stack buffer first, or, where it is small,
all of it once per part (copy_all, lane tiles innermost); a run-time scalar side (A, or B transposed)
that lane tiles reuse is packed per block of row tiles (all: llvm_gemm_copy.py).

Sizes are compile-time constants, except a bounded dim (passes/dynamic.py) sizing the outermost batch
axis, m, n or k, read from the entry's `dims`: the tile loop then covers the run-time tiles, the last
row tile picks the micro-kernel for its run-time row count (one per count, 1..rows), the last lane tile
the one for its vector count (the last vector masked to the run-time lanes). Each kernel
gets micro-kernels specialized for its strides, plus tail variants for the last row and lane tiles
(masked vector loads and stores at the edge).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svodc.codegen.llvm_gemm_copy import blocked_tile, call_when, copy_all_panels, copy_name, copy_panel, pack_block
from svodc.codegen.llvm_gemm_epilogue import emit_vector_epilogue, vector_epilogue
from svodc.gemm_plan import B_PANEL, a_panel, cpu_plan
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GemmArg, GemmOperand, Ops, RangeArg, RangeKind
from svodc.ir.uop import UOp
from svodc.policy import GemmBlocking
from svodc.target import Target

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope


@dataclass(frozen=True)
class Side:
    """How one operand is addressed inside a tile, in elements from the tile's pointer:
    scalar side: element (row i, k) at k*k_stride + i*row_stride;
    vector side: lane l at k at k*k_stride + (l // B_PANEL)*panel_stride + l % B_PANEL when packed in
    panels, else at k*k_stride + l (contiguous vectors)."""

    k_stride: int
    row_stride: int = 0  # scalar side
    packed_panels: bool = False  # vector side packed in B_PANEL-wide panels
    panel_stride: int = 0  # vector side, packed: elements from one panel to the next (K * B_PANEL)


def micro_kernel_name(rows: int, nvec: int, vw: int, unroll: int, masked: bool, packed: bool, scatter: bool,
                      returns: bool = False, prefetch_c: bool = False, s_row: int = 1) -> str:
    modes = (f"{'m' if masked else ''}{'p' if packed else ''}{'s' if scatter else ''}{'r' if returns else ''}"
             f"{'c' if prefetch_c else ''}")
    return f"svod.mk.{rows}x{nvec}v{vw}u{unroll}{modes}.r{s_row}"


def tile_type(rows: int, nvec: int, vw: int) -> str:
    """The struct a returning micro-kernel gives back: its accumulators, row-major."""
    return "{ " + ", ".join([f"<{vw} x float>"] * (rows * nvec)) + " }"


def micro_kernel(rows: int, nvec: int, vw: int, unroll: int, masked: bool, packed: bool, scatter: bool,
                 intrinsics: set[str], returns: bool = False, prefetch_c: bool = False, s_row: int = 1) -> str:
    """void mk(ptr s, ptr v, ptr c, i64 k, i64 s_k, i64 v_k, i64 v_panel, i64 c_row,
    i64 c_lane, i64 tail, i1 accumulate): C tile (rows x nvec vectors) = S[rows, :k] x V[:k, lanes]
    (+= with accumulate), its k loop unrolled `unroll` times (plus a loop for the k % unroll steps left).

    Specialized on its shape (rows, vectors), modes and the scalar side's row stride `s_row` (1 for a
    packed A, a packed block and a transposed GEMM's B), so kernels share micro-kernels; sizes and the
    other strides are arguments. The row stride is a constant so that each row's broadcast loads at an
    immediate offset from one pointer per k step: as an argument, LLVM's strength reduction chained the
    rows' addresses, one dependent add per row, 8 a k step (no speed change measured on an Intel server
    core, within its noise of a few %, but the k loop is that many instructions shorter).
    masked: the last vector has `tail` valid lanes (masked loads of V unless
    V is packed and zero-padded; masked stores). scatter: C lanes are c_lane apart (transposed GEMM;
    masked gather/scatter, which x86 targets lower to scalar loads and stores: +prefer-no-gather/scatter).
    returns: the tile is returned (tile_type) instead of stored, for the epilogue in registers.
    prefetch_c: the C tile's lines are prefetched for writing first (not with scatter). The k loop is one
    long dependency chain that the out-of-order window cannot see past, so the C loads (accumulate) and
    stores after it would each wait on a miss (C is past L2 on the shapes where it matters)."""
    vt = f"<{vw} x float>"
    mt = f"<{vw} x i1>"
    fma = f"llvm.fmuladd.v{vw}f32"
    intrinsics.add(f"declare {vt} @{fma}({vt}, {vt}, {vt})")
    intrinsics.add(f"declare {vt} @llvm.masked.load.v{vw}f32.p0(ptr, i32, {mt}, {vt})")
    intrinsics.add(f"declare void @llvm.masked.store.v{vw}f32.p0({vt}, ptr, i32, {mt})")
    intrinsics.add(f"declare void @llvm.masked.scatter.v{vw}f32.v{vw}p0({vt}, <{vw} x ptr>, i32, {mt})")
    intrinsics.add(f"declare {vt} @llvm.masked.gather.v{vw}f32.v{vw}p0(<{vw} x ptr>, i32, {mt}, {vt})")
    iota = "<" + ", ".join(f"i64 {i}" for i in range(vw)) + ">"
    name = micro_kernel_name(rows, nvec, vw, unroll, masked, packed, scatter, returns, prefetch_c, s_row)
    ret = tile_type(rows, nvec, vw) if returns else "void"
    L = [f"define internal {ret} @{name}(ptr noalias %s, ptr noalias %v, ptr noalias %c, i64 %kn, i64 %s_k, "
         "i64 %v_k, i64 %v_panel, i64 %c_row, i64 %c_lane, i64 %tail, i1 %accumulate) #0 {", "entry:"]
    if prefetch_c and not scatter:  # one prefetch per 16 floats (a 64-byte line) of each row and its last float
        intrinsics.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
        for i in range(rows):
            L.append(f"  %pcr{i} = mul nsw i64 %c_row, {i}")
            for e, off in enumerate(sorted({*range(0, nvec * vw, 16), nvec * vw - 1})):
                L += [f"  %pco{i}.{e} = add nsw i64 %pcr{i}, {off}",
                      f"  %pcp{i}.{e} = getelementptr float, ptr %c, i64 %pco{i}.{e}",
                      f"  call void @llvm.prefetch.p0(ptr %pcp{i}.{e}, i32 1, i32 3, i32 1)"]
    L.append(f"  %ti = insertelement <{vw} x i64> poison, i64 %tail, i64 0")
    L.append(f"  %tv = shufflevector <{vw} x i64> %ti, <{vw} x i64> poison, <{vw} x i32> zeroinitializer")
    L.append(f"  %mask = icmp ult <{vw} x i64> {iota}, %tv")
    for j in range(nvec):  # lane offsets of each vector of V
        if packed:
            L.append(f"  %vpo{j} = mul nsw i64 %v_panel, {(j * vw) // B_PANEL}")
            L.append(f"  %vlo{j} = add nsw i64 %vpo{j}, {(j * vw) % B_PANEL}")
        else:
            L.append(f"  %vlo{j} = add nsw i64 0, {j * vw}")
    # The k loop: `unroll` k steps per iteration while whole groups last (main), then one at a time (rest).
    L += [f"  %krest = urem i64 %kn, {unroll}", "  %kmain = sub nuw i64 %kn, %krest",
          "  %any = icmp ugt i64 %kmain, 0", "  br i1 %any, label %main, label %mid", "main:",
          "  %k = phi i64 [ 0, %entry ], [ %k.next, %main ]"]
    zero = [["zeroinitializer"] * nvec for _ in range(rows)]
    out = _k_loop_body(L, "m", "%k", unroll, (zero, "%entry"), "%main", rows, nvec, vw, masked, packed, s_row)
    L += [f"  %k.next = add nuw i64 %k, {unroll}", "  %more = icmp ult i64 %k.next, %kmain",
          "  br i1 %more, label %main, label %mid", "mid:", "  %kr = phi i64 [ 0, %entry ], [ %k.next, %main ]"]
    mid = _phis(L, "mid", vt, [(zero, "%entry"), (out, "%main")])
    L += ["  %left = icmp ult i64 %kr, %kn", "  br i1 %left, label %rest, label %done", "rest:",
          "  %k1 = phi i64 [ %kr, %mid ], [ %k1.next, %rest ]"]
    rest = _k_loop_body(L, "r", "%k1", 1, (mid, "%mid"), "%rest", rows, nvec, vw, masked, packed, s_row)
    L += ["  %k1.next = add nuw i64 %k1, 1", "  %more1 = icmp ult i64 %k1.next, %kn",
          "  br i1 %more1, label %rest, label %done", "done:"]
    _phis(L, "c", vt, [(mid, "%mid"), (rest, "%rest")])
    if scatter:
        L.append(f"  %ci = insertelement <{vw} x i64> poison, i64 %c_lane, i64 0")
        L.append(f"  %cs = shufflevector <{vw} x i64> %ci, <{vw} x i64> poison, <{vw} x i32> zeroinitializer")
        L.append(f"  %lane_offsets = mul nsw <{vw} x i64> {iota}, %cs")
    full = "<" + ", ".join("i1 true" for _ in range(vw)) + ">"
    for i in range(rows):
        L.append(f"  %cr{i} = mul nsw i64 %c_row, {i}")
        for j in range(nvec):
            if scatter:
                L.append(f"  %cl{i}.{j} = mul nsw i64 %c_lane, {j * vw}")
            else:
                L.append(f"  %cl{i}.{j} = add nsw i64 0, {j * vw}")
            L.append(f"  %co{i}.{j} = add nsw i64 %cr{i}, %cl{i}.{j}")
            L.append(f"  %cp{i}.{j} = getelementptr inbounds float, ptr %c, i64 %co{i}.{j}")
            if scatter:
                L.append(f"  %cv{i}.{j} = getelementptr inbounds float, ptr %cp{i}.{j}, <{vw} x i64> %lane_offsets")
    # accumulate (a k block after the first, see emit_gemm): C += the tile, else C = the tile
    L += ["  br i1 %accumulate, label %add, label %store", "add:"]
    for i in range(rows):
        for j in range(nvec):
            mask = "%mask" if j == nvec - 1 and masked else full
            if scatter:
                L.append(f"  %old{i}.{j} = call {vt} @llvm.masked.gather.v{vw}f32.v{vw}p0(<{vw} x ptr> %cv{i}.{j}, "
                         f"i32 4, {mt} {mask}, {vt} zeroinitializer)")
            elif mask != full:
                L.append(f"  %old{i}.{j} = call {vt} @llvm.masked.load.v{vw}f32.p0(ptr %cp{i}.{j}, i32 4, {mt} %mask, "
                         f"{vt} zeroinitializer)")
            else:
                L.append(f"  %old{i}.{j} = load {vt}, ptr %cp{i}.{j}, align 4")
            L.append(f"  %sum{i}.{j} = fadd {vt} %c{i}.{j}, %old{i}.{j}")
    L += ["  br label %store", "store:"]
    _phis(L, "f", vt, [([[f"%c{i}.{j}" for j in range(nvec)] for i in range(rows)], "%done"),
                       ([[f"%sum{i}.{j}" for j in range(nvec)] for i in range(rows)], "%add")])
    if returns:
        st, agg = tile_type(rows, nvec, vw), "undef"
        for e in range(rows * nvec):
            L.append(f"  %t{e} = insertvalue {st} {agg}, {vt} %f{e // nvec}.{e % nvec}, {e}")
            agg = f"%t{e}"
        return "\n".join([*L, f"  ret {st} {agg}", "}"])
    for i in range(rows):
        for j in range(nvec):
            last = j == nvec - 1 and masked
            if scatter:
                L.append(f"  call void @llvm.masked.scatter.v{vw}f32.v{vw}p0({vt} %f{i}.{j}, <{vw} x ptr> "
                         f"%cv{i}.{j}, i32 4, {mt} {'%mask' if last else full})")
            elif last:
                L.append(f"  call void @llvm.masked.store.v{vw}f32.p0({vt} %f{i}.{j}, ptr %cp{i}.{j}, i32 4, "
                         f"{mt} %mask)")
            else:
                L.append(f"  store {vt} %f{i}.{j}, ptr %cp{i}.{j}, align 4")
    L += ["  ret void", "}"]
    return "\n".join(L)


def _phis(L: list[str], name: str, vt: str, incoming: list[tuple[list[list[str]], str]]) -> list[list[str]]:
    """%name{i}.{j} = phi of the accumulators arriving from each (values, block)."""
    rows, nvec = len(incoming[0][0]), len(incoming[0][0][0])
    for i in range(rows):
        for j in range(nvec):
            ins = ", ".join(f"[ {vals[i][j]}, {block} ]" for vals, block in incoming)
            L.append(f"  %{name}{i}.{j} = phi {vt} {ins}")
    return [[f"%{name}{i}.{j}" for j in range(nvec)] for i in range(rows)]


def _k_loop_body(L: list[str], tag: str, k: str, steps: int, start: tuple[list[list[str]], str], block: str,
                 rows: int, nvec: int, vw: int, masked: bool, packed: bool, s_row: int) -> list[list[str]]:
    """One iteration of a k loop in `block`: the accumulator phis (from `start`, or from this block's
    own last step), then `steps` k steps from k; returns the accumulators after them."""
    vt = f"<{vw} x float>"
    mt = f"<{vw} x i1>"
    fma = f"llvm.fmuladd.v{vw}f32"
    names = [[f"%{tag}a{i}.{j}" for j in range(nvec)] for i in range(rows)]
    last = [[f"%{tag}s{steps - 1}.{i}.{j}" for j in range(nvec)] for i in range(rows)]
    _phis(L, f"{tag}a", vt, [start, (last, block)])
    acc = names
    for u in range(steps):
        p = f"{tag}{u}"
        ku = k if u == 0 else f"%{p}k"
        if u:
            L.append(f"  {ku} = add nuw i64 {k}, {u}")
        L.append(f"  %{p}vk = mul nsw i64 {ku}, %v_k")
        for j in range(nvec):
            L.append(f"  %{p}vo{j} = add nsw i64 %{p}vk, %vlo{j}")
            L.append(f"  %{p}vp{j} = getelementptr inbounds float, ptr %v, i64 %{p}vo{j}")
            if j == nvec - 1 and masked and not packed:
                L.append(f"  %{p}vv{j} = call {vt} @llvm.masked.load.v{vw}f32.p0(ptr %{p}vp{j}, i32 4, {mt} %mask, "
                         f"{vt} zeroinitializer)")
            else:
                L.append(f"  %{p}vv{j} = load {vt}, ptr %{p}vp{j}, align 4")
        L.append(f"  %{p}sk = mul nsw i64 {ku}, %s_k")
        for i in range(rows):
            L.append(f"  %{p}so{i} = add nsw i64 %{p}sk, {i * s_row}")
            L.append(f"  %{p}sp{i} = getelementptr inbounds float, ptr %s, i64 %{p}so{i}")
            L.append(f"  %{p}ss{i} = load float, ptr %{p}sp{i}, align 4")
            L.append(f"  %{p}si{i} = insertelement {vt} poison, float %{p}ss{i}, i64 0")
            L.append(f"  %{p}sv{i} = shufflevector {vt} %{p}si{i}, {vt} poison, <{vw} x i32> zeroinitializer")
            for j in range(nvec):
                L.append(f"  %{tag}s{u}.{i}.{j} = call {vt} @{fma}({vt} %{p}sv{i}, {vt} %{p}vv{j}, {vt} {acc[i][j]})")
        acc = [[f"%{tag}s{u}.{i}.{j}" for j in range(nvec)] for i in range(rows)]
    return acc


def _runtime_tiles(em: KernelEmitter, total: str, tile: int) -> tuple[str, str, str]:
    """(tiles, index of the last one, its size in 1..tile) of a run-time extent `total` >= 1."""
    top = em.stack[0]
    count = em.emit_line(top, f"udiv i64 {em.emit_line(top, f'add nsw i64 {total}, {tile - 1}')}, {tile}")
    last = em.emit_line(top, f"sub nsw i64 {count}, 1")
    return count, last, em.emit_line(top, f"sub nsw i64 {total}, {em.emit_line(top, f'mul nsw i64 {last}, {tile}')}")


def operand_offset(em: KernelEmitter, scope: Scope, op: GemmOperand, batch: list[str],
                   terms: list[tuple[str, int]] | None = None) -> str:
    """op.offset + sum(batch_i * batch_stride_i) + sum(value * coef) as an i64 SSA value (CPU and GPU)."""
    return em.affine(scope, str(op.offset), [*zip(batch, op.batch_strides, strict=True), *(terms or [])])


def _packed_offset(em: KernelEmitter, scope: Scope, op: GemmOperand, batch: list[str], lane: str, width: int,
                   k: int) -> str:
    """Where element `lane` (m of A, n of B) of a panel-packed operand's row 0 starts: panel lane // width
    (k * width elements each), lane % width within it."""
    panel = em.emit_line(scope, f"udiv i64 {lane}, {width}")
    within = em.emit_line(scope, f"urem i64 {lane}, {width}")
    return operand_offset(em, scope, op, batch, [(panel, k * width), (within, 1)])


def _sides(arg: GemmArg) -> tuple[Side, Side, int, int]:
    """(scalar side, vector side, C stride per tile row, C stride per lane)."""
    a, b, c = arg.a, arg.b, arg.c
    panels = Side(B_PANEL, packed_panels=True, panel_stride=arg.k * B_PANEL)
    if not arg.transposed:
        s = Side(a_panel(arg), 1) if a.packed else Side(a.col_stride, a.row_stride)
        assert b.packed or b.col_stride == 1 or arg.n == 1, "the scheduler realizes B with contiguous columns"
        return s, panels if b.packed else Side(b.row_stride), c.row_stride, 1
    # transposed: rows run along n (B's columns), lanes along m (A's rows, packed in B_PANEL panels)
    assert a.packed and not b.packed
    return Side(b.row_stride, b.col_stride), panels, 1, c.row_stride


def emit_gemm(em: KernelEmitter, node: UOp, target: Target, blocking: GemmBlocking) -> None:
    arg: GemmArg = node.arg
    plan = cpu_plan(arg, target, blocking)
    rows, lanes, vw, unroll = plan.rows, plan.lanes, plan.vw, blocking.k_unroll
    pa, pb, pc = (em.value(x) for x in node.src[:3])
    epilogue = node.src[3] if len(node.src) > 3 else None
    ranges = node.src[4:]
    rt_n, lt_n, tiles = plan.row_tiles, plan.lane_tiles, plan.tiles
    rows_tail, lanes_tail = plan.rows_tail, plan.lanes_tail
    s_src, v_src, c_row, c_lane = _sides(arg)
    # what the micro-kernels read on the scalar side: a packed block's rows, k-major per row tile, or in place
    s_side = Side(rows, 1) if plan.block_row_tiles else s_src
    v_side = Side(lanes) if plan.copy_panel else v_src  # what the micro-kernels read: the copy, rows of `lanes`
    row_sizes = {rows, rows_tail}
    top = em.stack[0]
    # row / lane tiles, the last tile's index and its rows / lanes: constants, or run-time values for a
    # bounded m or n (any count of the last tile is possible then: 1..rows rows, 1..lanes lanes)
    rt_count, last_start, tail_rt = str(rt_n), str(rt_n - 1), str(rows_tail)
    lt_count, last_lane_tile, lanes_rt = str(lt_n), str(lt_n - 1), str(lanes_tail)
    if arg.m_var is not None:
        row_sizes = set(range(1, rows + 1))
        rt_count, last_start, tail_rt = _runtime_tiles(em, em.dim_value(arg.m_var.slot), rows)
    if arg.n_var is not None:
        lt_count, last_lane_tile, lanes_rt = _runtime_tiles(em, em.dim_value(arg.n_var.slot), lanes)
        nvec_rt = em.emit_line(top, f"udiv i64 {em.emit_line(top, f'add nsw i64 {lanes_rt}, {vw - 1}')}, {vw}")
        vec_tail = em.emit_line(top, f"sub nsw i64 {lanes_rt}, {em.emit_line(top, f'mul nsw i64 {nvec_rt}, {vw}')}")
        vec_tail = em.emit_line(top, f"add nsw i64 {vec_tail}, {vw}")  # lanes of the last vector: 1..vw
    k_size = str(arg.k) if arg.k_var is None else em.dim_value(arg.k_var.slot)
    accumulate = last_kb = "false"
    if plan.k_blocks > 1:  # the part's tiles once per k block (gemm_plan.py), adding to C after the first
        em.open_loop(UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, plan.k_blocks),),
                         RangeArg(-2, RangeKind.LOOP)), "0", str(plan.k_blocks))
        kbs = em.stack[-1]
        last_block = plan.k_blocks - 1
        last_kb = em.emit_line(kbs, f"icmp eq i64 {kbs.ivar}, {last_block}")
        accumulate = em.emit_line(kbs, f"icmp ne i64 {kbs.ivar}, 0")
        k_size = em.emit_line(kbs, f"select i1 {last_kb}, i64 {plan.k_total - last_block * plan.k_block}, "
                                   f"i64 {plan.k_block}")
        k0 = em.emit_line(kbs, f"mul nuw nsw i64 {kbs.ivar}, {plan.k_block}")
        s_k0, v_k0 = (em.emit_line(kbs, f"mul nuw nsw i64 {k0}, {side.k_stride}") for side in (s_src, v_src))
    # the epilogue on the accumulators in registers where it has a vector form (llvm_gemm_epilogue.py)
    vepi = None
    if (epilogue is not None and blocking.epilogue_in_registers and not arg.transposed and not arg.runtime
            and plan.k_blocks == 1):
        vepi = vector_epilogue(epilogue, node.src[2], tuple(ranges), em.free)
    # C tiles written as `rows` contiguous streams (lane tiles innermost), which hardware prefetchers
    # follow, or scattered (transposed) are not prefetched
    prefetch_c = blocking.prefetch_c and not plan.lanes_first
    calls = {}
    for r in row_sizes:
        if arg.n_var is not None:  # the last lane tile: nvec vectors, the last one masked to vec_tail lanes
            for nvec in range(1, lanes // vw + 1):
                mode = (True, v_side.packed_panels, c_lane != 1)
                name = micro_kernel_name(r, nvec, vw, unroll, *mode, False, prefetch_c, s_side.row_stride)
                em.shared_functions[name] = micro_kernel(r, nvec, vw, unroll, *mode, em.uses_intrinsics, False,
                                                         prefetch_c, s_side.row_stride)
                calls[(r, -nvec)] = (f"@{name}", f"i64 {k_size}, i64 {s_side.k_stride}, "
                                                 f"i64 {v_side.k_stride}, i64 {v_side.panel_stride}, i64 {c_row}, "
                                                 f"i64 {c_lane}, i64 {vec_tail}, i1 {accumulate}")
        for c in {lanes, lanes_tail}:
            nvec = -(-c // vw)
            tail = c - (nvec - 1) * vw
            mode = (tail != vw, v_side.packed_panels, c_lane != 1)
            name = micro_kernel_name(r, nvec, vw, unroll, *mode, vepi is not None, prefetch_c, s_side.row_stride)
            em.shared_functions[name] = micro_kernel(r, nvec, vw, unroll, *mode, em.uses_intrinsics,
                                                     vepi is not None, prefetch_c, s_side.row_stride)
            calls[(r, c)] = (f"@{name}", f"i64 {k_size}, i64 {s_side.k_stride}, "
                                         f"i64 {v_side.k_stride}, i64 {v_side.panel_stride}, i64 {c_row}, "
                                         f"i64 {c_lane}, i64 {tail}, i1 {accumulate}")

    t_range = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, tiles),), RangeArg(-1, RangeKind.PARALLEL))
    run_tiles = str(tiles)
    if arg.runtime:  # tiles are batch-major: the first ones run
        lead = em.dim_value(arg.batch_var.slot) if arg.batch_var is not None else str(math.prod(arg.batch[:1]))
        inner = math.prod(arg.batch[1:])
        inner = str(inner * lt_n) if arg.n_var is None else em.emit_line(top, f"mul nsw i64 {lt_count}, {inner}")
        per_lead = em.emit_line(top, f"mul nsw i64 {rt_count}, {inner}")
        run_tiles = em.emit_line(top, f"mul nsw i64 {lead}, {per_lead}", "tiles")
    start, stop = em.part_split(run_tiles)
    em.open_loop(t_range, start, stop)
    sc = em.stack[-1]
    t = sc.ivar
    line = em.emit_line
    # Tile order (gemm_plan.py): lane tiles innermost when the vector panels are small or copied whole, else row tiles,
    # reusing each vector panel (k x lanes) across the row blocks while it is in L1/L2. The tile counts
    # are run-time values for a bounded m or n.
    if plan.block_row_tiles:
        rt, lt, rin, first_in_block, batch = blocked_tile(em, sc, plan, t, start)
    else:
        inner_n, outer_n = (lt_count, rt_count) if plan.lanes_first else (rt_count, lt_count)
        inner, outer, *batch = em.split_index(sc, t, (inner_n, outer_n, *reversed(arg.batch)))
        batch.reverse()
        rt, lt = (outer, inner) if plan.lanes_first else (inner, outer)
        rin = rt
    r0 = line(sc, f"mul nuw nsw i64 {rt}, {rows}")
    l0 = line(sc, f"mul nuw nsw i64 {lt}, {lanes}")
    m0, n0 = (l0, r0) if arg.transposed else (r0, l0)
    if plan.block_row_tiles:  # the block's first row (m, or n transposed): the pack's source
        block_m0 = line(sc, f"mul nuw nsw i64 {line(sc, f'sub nuw nsw i64 {rt}, {rin}')}, {rows}")
    if arg.a.packed:
        a_off = _packed_offset(em, sc, arg.a, batch, m0, a_panel(arg), arg.k)
    elif plan.block_row_tiles:
        a_off = operand_offset(em, sc, arg.a, batch, [(block_m0, arg.a.row_stride)])
    else:
        a_off = operand_offset(em, sc, arg.a, batch, [(m0, arg.a.row_stride)])
    if arg.b.packed:
        b_off = _packed_offset(em, sc, arg.b, batch, n0, B_PANEL, arg.k)
    elif plan.block_row_tiles and arg.transposed:
        b_off = operand_offset(em, sc, arg.b, batch, [(block_m0, arg.b.col_stride)])
    else:
        b_off = operand_offset(em, sc, arg.b, batch, [(n0, arg.b.col_stride)])
    c_off = operand_offset(em, sc, arg.c, batch, [(m0, arg.c.row_stride), (n0, 1)])
    a_ptr, b_ptr, c_ptr = (line(sc, f"getelementptr inbounds float, ptr {p}, i64 {o}", "ptr") for p, o in
                           ((pa, a_off), (pb, b_off), (pc, c_off)))
    s_ptr, v_ptr = (b_ptr, a_ptr) if arg.transposed else (a_ptr, b_ptr)
    if plan.k_blocks > 1:
        s_ptr, v_ptr = (line(sc, f"getelementptr inbounds float, ptr {p}, i64 {o}", "ptr")
                        for p, o in ((s_ptr, s_k0), (v_ptr, v_k0)))
    last_r = line(sc, f"icmp eq i64 {rt}, {last_start}") if rows_tail != rows or arg.m_var else "false"
    if plan.block_row_tiles:  # the first tile of a row block in this part packs the block, the rest read it
        s_ptr = pack_block(em, sc, plan, s_src.k_stride, s_src.row_stride, s_ptr, first_in_block, block_m0,
                           rin, k_size)
    last_l = line(sc, f"icmp eq i64 {lt}, {last_lane_tile}") if lanes_tail != lanes or arg.n_var else "false"
    if plan.copy_all:  # the part's first tile (of each k block) copies every panel, each tile reads its own
        nvec = lanes // vw
        em.shared_functions[copy_name(nvec, vw)] = copy_panel(nvec, vw, em.uses_intrinsics)
        em.shared_functions[f"svod.copyall.{nvec}v{vw}"] = copy_all_panels(nvec, vw)
        buf = em.fresh("panels")
        em.allocas.append(f"{buf} = alloca float, i64 {(plan.k_block or arg.k) * lt_n * lanes}, align 64")
        src = line(sc, f"getelementptr inbounds float, ptr {v_ptr}, i64 {line(sc, f'sub nsw i64 0, {l0}')}")
        call_when(em, sc, line(sc, f"icmp eq i64 {t}, {start}"), f"call void @svod.copyall.{nvec}v{vw}(ptr {src}, "
                  f"ptr {buf}, i64 {k_size}, i64 {v_src.k_stride}, i64 {plan.lanes_total})")
        v_ptr = line(sc, f"getelementptr inbounds float, ptr {buf}, i64 {line(sc, f'mul nsw i64 {l0}, {k_size}')}")
    elif plan.copy_panel:  # the first tile of a lane tile in this part copies the panel, the rest read the copy
        copy = copy_name(lanes // vw, vw, blocking.prefetch_next_panel)
        em.shared_functions[copy] = copy_panel(lanes // vw, vw, em.uses_intrinsics, blocking.prefetch_next_panel)
        buf = em.fresh("panel")
        em.allocas.append(f"{buf} = alloca float, i64 {(plan.k_block or arg.k) * lanes}, align 64")
        first = line(sc, f"or i1 {line(sc, f'icmp eq i64 {rin}, 0')}, {line(sc, f'icmp eq i64 {t}, {start}')}")
        valid = line(sc, f"select i1 {last_l}, i64 {lanes_tail}, i64 {lanes}")
        call_when(em, sc, first, f"call void @{copy}(ptr {v_ptr}, ptr {buf}, i64 {k_size}, i64 {v_src.k_stride}, "
                                 f"i64 {valid})")
        v_ptr = buf
    call_args = f"ptr {s_ptr}, ptr {v_ptr}, ptr {c_ptr}"
    k = em.fresh_label()
    if arg.m_var is None:
        sc.lines.append(f"  br i1 {last_r}, label %T{k}.t, label %T{k}.f")
        variants = (("f", rows), ("t", rows_tail))
    else:  # the run-time rows of this tile pick the micro-kernel
        nrows = line(sc, f"select i1 {last_r}, i64 {tail_rt}, i64 {rows}")
        cases = " ".join(f"i64 {r}, label %T{k}.r{r}" for r in range(1, rows))
        sc.lines.append(f"  switch i64 {nrows}, label %T{k}.r{rows} [ {cases} ]")
        variants = tuple((f"r{r}", r) for r in range(1, rows + 1))
    for tag, r in variants:
        sc.lines += [f"T{k}.{tag}:", f"  br i1 {last_l}, label %T{k}.{tag}t, label %T{k}.{tag}f"]
        for sub, c in (("f", lanes), ("t", lanes_tail)):
            if sub == "t" and arg.n_var is not None:  # the run-time vectors of the last lane tile pick the kernel
                most = lanes // vw
                cases = " ".join(f"i64 {v}, label %T{k}.{tag}t{v}" for v in range(1, most))
                sc.lines += [f"T{k}.{tag}t:", f"  switch i64 {nvec_rt}, label %T{k}.{tag}t{most} [ {cases} ]"]
                for v in range(1, most + 1):
                    fn, sizes = calls[(r, -v)]
                    sc.lines += [f"T{k}.{tag}t{v}:", f"  call void {fn}({call_args}, {sizes})",
                                 f"  br label %T{k}.join"]
                continue
            fn, sizes = calls[(r, c)]
            sc.lines.append(f"T{k}.{tag}{sub}:")
            if vepi is None:
                sc.lines.append(f"  call void {fn}({call_args}, {sizes})")
            else:
                nvec = -(-c // vw)
                tt = tile_type(r, nvec, vw)
                res = line(sc, f"call {tt} {fn}({call_args}, {sizes})")
                acc = [[line(sc, f"extractvalue {tt} {res}, {i * nvec + j}") for j in range(nvec)] for i in range(r)]
                emit_vector_epilogue(em, sc, vepi, acc, vw, c - (nvec - 1) * vw, batch, m0, n0)
            sc.lines.append(f"  br label %T{k}.join")
    sc.lines.append(f"T{k}.join:")
    if epilogue is not None and vepi is None:
        # Two copies of the epilogue: full tiles count to constants (rows x lanes: emit_over_tile), which LLVM
        # unrolls into straight vector code; edge tiles get the general loops.
        *batch_ranges, m_range, n_range = ranges
        e = em.fresh_label()
        if plan.k_blocks > 1:  # after the last k block only
            sc.lines += [f"  br i1 {last_kb}, label %E{e}.run, label %E{e}.done", f"E{e}.run:"]
        partial = line(sc, f"or i1 {last_r}, {last_l}")
        sc.lines.append(f"  br i1 {partial}, label %E{e}.edge, label %E{e}.full")
        for tag, nrows, nlanes in (("full", str(rows), str(lanes)), ("edge", None, None)):
            sc.lines.append(f"E{e}.{tag}:")
            if nrows is None:
                nrows = line(sc, f"select i1 {last_r}, i64 {tail_rt}, i64 {rows}")
                nlanes = line(sc, f"select i1 {last_l}, i64 {lanes_rt}, i64 {lanes}")
            r1 = line(sc, f"add nuw nsw i64 {r0}, {nrows}")
            l1 = line(sc, f"add nuw nsw i64 {l0}, {nlanes}")
            m1, n1 = (l1, r1) if arg.transposed else (r1, l1)
            em.emit_over_tile(epilogue, list(zip(batch_ranges, batch, strict=True)), (m_range, m0, m1),
                              (n_range, n0, n1), None if tag == "edge" else (lanes, rows) if arg.transposed else
                              (rows, lanes))
            sc.lines.append(f"  br label %E{e}.done")
        sc.lines.append(f"E{e}.done:")
    em.close_loop()
    if plan.k_blocks > 1:
        em.close_loop()
