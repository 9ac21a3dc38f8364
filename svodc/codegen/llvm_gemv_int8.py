"""CPU code for integer GEMMs of few activation columns (GemmArg.quant with `transposed`: lanes along m;
passes/lower_gemm_int8.py GEMV_N_MAX): C int32 = W x B, W the constant int8 weight, B at most GEMV_N_MAX
columns of 8-bit activations less a zero point, exactly.

The GEMM kernel (llvm_gemm_int8.py) puts the activation's columns in the vector lanes: with one column (a
classifier, an LSTM step at batch 1) it used 1 lane of 16 or 32. Here the lanes run along m instead: W is
packed in panels of QT_PANEL rows, each [ceil(K/4)][QT_PANEL][4] (four consecutive k of a row together), so one
vector load gives every row of a panel its next 4 weights, and each column's 4 activation bytes of that k
are broadcast to every lane: one dot product per vector of rows (vpdpbusd, ...: llvm_gemm_int8._dot, the
roles of its operands as there, the weights now the vector and the activations the broadcast). The parallel
loop runs over panels (of every batch index); a part packs the activation columns once ([ceil(K/4)][N][4],
llvm_gemm_int8.pack_function) at its first panel of each batch index. C is stored per panel, a vector per
column where its rows are contiguous (one column), else lane by lane; an epilogue then runs over the
panel's rows while they are in cache.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from svodc.codegen.llvm_gemm import operand_offset
from svodc.codegen.llvm_gemm_copy import call_when
from svodc.codegen.llvm_gemm_int8 import _dot, _splat, activation_operand, pack_function, weight_operand
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GemmArg, Ops, RangeArg, RangeKind
from svodc.ir.uop import UOp
from svodc.passes.lower_gemm_int8 import QT_PANEL

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter


def gemv_kernel(path: str, vw: int, ncols: int, stored_signed: bool, intrinsics: set[str]) -> tuple[str, str]:
    """void mv(ptr w, ptr sums, ptr pk, ptr c, i64 k4, i64 c_row, i64 c_col, i64 rows, i32 corr): C[r, l] for the
    panel's first `rows` rows r (c + r * c_row + l * c_col) and the ncols packed columns l, over k4 groups of 4 k."""
    nv = QT_PANEL // vw
    vt, mt = f"<{vw} x i32>", f"<{vw} x i1>"
    name = f"svod.q8.mv.{path}.{vw}.{ncols}{'s' if stored_signed else 'u'}"
    intrinsics.add(f"declare void @llvm.masked.store.v{vw}i32.p0({vt}, ptr, i32, {mt})")
    L = [f"define internal void @{name}(ptr noalias %w, ptr noalias %sums, ptr noalias %pk, ptr noalias %c, i64 %k4, "
         "i64 %c_row, i64 %c_col, i64 %rows, i32 %corr) #0 {", "entry:",
         f"  %tmp = alloca [{ncols * QT_PANEL} x i32], align 64"]
    corr = _splat(L, "corr.v", "i32", vw, "%corr")
    for j in range(nv):
        L += [f"  %sp{j} = getelementptr inbounds i32, ptr %sums, i64 {j * vw}",
              f"  %s{j} = load {vt}, ptr %sp{j}, align 4", f"  %init{j} = mul {vt} %s{j}, {corr}"]
    L += ["  br label %loop", "loop:", "  %q = phi i64 [ 0, %entry ], [ %q.next, %loop ]"]
    for col in range(ncols):
        for j in range(nv):
            L.append(f"  %acc{col}.{j} = phi {vt} [ %init{j}, %entry ], [ %n{col}.{j}, %loop ]")
    L.append(f"  %wo = mul nuw i64 %q, {4 * QT_PANEL}")
    for j in range(nv):
        L += [f"  %wa{j} = add nuw i64 %wo, {4 * j * vw}", f"  %wp{j} = getelementptr inbounds i8, ptr %w, i64 %wa{j}",
              f"  %wv{j} = load {vt}, ptr %wp{j}, align 4"]
        weight_operand(L, path, vw, f"%wv{j}")
    L.append(f"  %ao = mul nuw i64 %q, {4 * ncols}")
    for col in range(ncols):
        L += [f"  %aa{col} = add nuw i64 %ao, {4 * col}",
              f"  %ap{col} = getelementptr inbounds i8, ptr %pk, i64 %aa{col}",
              f"  %ag{col} = load i32, ptr %ap{col}, align 4"]
        splat = _splat(L, f"a{col}.v", "i32", vw, f"%ag{col}")  # the 4 bytes in every lane
        L.append(f"  %a{col}.b = bitcast {vt} {splat} to <{4 * vw} x i8>")
        activation_operand(L, path, vw, f"a{col}", f"%a{col}.b")
        for j in range(nv):
            _dot(L, path, vw, f"%acc{col}.{j}", f"%a{col}", f"%wv{j}", f"%n{col}.{j}", stored_signed, intrinsics)
    L += ["  %q.next = add nuw i64 %q, 1", "  %more = icmp ult i64 %q.next, %k4",
          "  br i1 %more, label %loop, label %store",
          # one column of contiguous rows (c_row 1): a vector per vw rows, the panel's last rows masked
          "store:", "  %one = icmp eq i64 %c_row, 1", f"  %flat = and i1 %one, {'true' if ncols == 1 else 'false'}",
          "  br i1 %flat, label %vec, label %lanes", "vec:"]
    vv = _splat(L, "rows.v", "i64", vw, "%rows")
    for j in range(nv):
        iota = ", ".join(f"i64 {j * vw + i}" for i in range(vw))
        L += [f"  %lm{j} = icmp ult <{vw} x i64> <{iota}>, {vv}",
              f"  %cp{j} = getelementptr inbounds i32, ptr %c, i64 {j * vw}",
              f"  call void @llvm.masked.store.v{vw}i32.p0({vt} %n0.{j}, ptr %cp{j}, i32 4, {mt} %lm{j})"]
    L += ["  ret void", "lanes:"]  # else through a stack copy, lane by lane (at most GEMV_N_MAX x QT_PANEL values)
    for col in range(ncols):
        for j in range(nv):
            L += [f"  %tp{col}.{j} = getelementptr inbounds i32, ptr %tmp, i64 {col * QT_PANEL + j * vw}",
                  f"  store {vt} %n{col}.{j}, ptr %tp{col}.{j}, align 4"]
    L += ["  br label %row", "row:", "  %r = phi i64 [ 0, %lanes ], [ %r.next, %row.end ]",
          "  %ro = mul nsw i64 %r, %c_row"]
    for col in range(ncols):
        L += [f"  %ti{col} = add nuw i64 %r, {col * QT_PANEL}",
              f"  %tq{col} = getelementptr inbounds i32, ptr %tmp, i64 %ti{col}",
              f"  %tv{col} = load i32, ptr %tq{col}",
              f"  %co{col} = mul nsw i64 %c_col, {col}", f"  %cc{col} = add nsw i64 %ro, %co{col}",
              f"  %cq{col} = getelementptr inbounds i32, ptr %c, i64 %cc{col}", f"  store i32 %tv{col}, ptr %cq{col}"]
    L += ["  br label %row.end", "row.end:", "  %r.next = add nuw i64 %r, 1", "  %rmore = icmp ult i64 %r.next, %rows",
          "  br i1 %rmore, label %row, label %done", "done:", "  ret void", "}"]
    return name, "\n".join(L)


def emit_int8_gemv(em: KernelEmitter, node: UOp, path: str, vw: int, stored_signed: bool, flip: bool,
                   corr: int) -> None:
    """The panels' loop (see the module docstring); the caller has chosen the dot product (llvm_gemm_int8)."""
    arg: GemmArg = node.arg
    quant = arg.quant
    assert quant is not None and arg.transposed and QT_PANEL % vw == 0
    pw, pb, pc, ps = (em.value(x) for x in node.src[:4])
    k4, panels = -(-arg.k // 4), -(-arg.m // QT_PANEL)
    tiles = math.prod(arg.batch) * panels
    pack, pack_def = pack_function(arg.n, arg.b.col_stride != 1 and arg.n > 1, flip, em.uses_intrinsics)
    mv, mv_def = gemv_kernel(path, vw, arg.n, stored_signed, em.uses_intrinsics)
    em.shared_functions.update({pack: pack_def, mv: mv_def})
    t_range = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, tiles),), RangeArg(-1, RangeKind.PARALLEL))
    start, stop = em.part_split(str(tiles))
    em.open_loop(t_range, start, stop)
    sc = em.stack[-1]
    line = em.emit_line
    panel, *batch = em.split_index(sc, sc.ivar, (panels, *reversed(arg.batch)))
    batch.reverse()
    m0 = line(sc, f"mul nuw nsw i64 {panel}, {QT_PANEL}")
    left = line(sc, f"sub nsw i64 {arg.m}, {m0}")
    rows = line(sc, f"select i1 {line(sc, f'icmp ult i64 {left}, {QT_PANEL}')}, i64 {left}, i64 {QT_PANEL}")
    buf = em.fresh("packed")
    em.allocas.append(f"{buf} = alloca i8, i64 {k4 * 4 * arg.n}, align 64")
    b_ptr = line(sc, f"getelementptr inbounds i8, ptr {pb}, i64 {operand_offset(em, sc, arg.b, batch, [])}", "ptr")
    first = line(sc, f"or i1 {line(sc, f'icmp eq i64 {panel}, 0')}, {line(sc, f'icmp eq i64 {sc.ivar}, {start}')}")
    call_when(em, sc, first, f"call void @{pack}(ptr {b_ptr}, ptr {buf}, i64 {arg.k}, i64 {arg.b.row_stride}, "
                             f"i64 {arg.b.col_stride}, i64 {arg.n})")
    if quant.c_tile:  # C in a stack tile (lower_gemm_int8.c_scratch_shape): rows C_TILE apart, read back from it
        tile = em.fresh("ctile")
        em.allocas.append(f"{tile} = alloca i32, i64 {arg.m * quant.c_tile}, align 64")
        em.param_values[node.src[2].arg.index] = tile
        c_ptr = line(sc, f"getelementptr inbounds i32, ptr {tile}, i64 {line(sc, f'mul nsw i64 {m0}, {quant.c_tile}')}",
                     "ptr")
        c_row = quant.c_tile
    else:
        c_ptr = line(sc, f"getelementptr inbounds i32, ptr {pc}, i64 "
                         f"{operand_offset(em, sc, arg.c, batch, [(m0, arg.c.row_stride)])}", "ptr")
        c_row = arg.c.row_stride
    w_off = line(sc, f"mul nuw nsw i64 {panel}, {k4 * 4 * QT_PANEL}")
    w_ptr = line(sc, f"getelementptr inbounds i8, ptr {pw}, i64 {w_off}", "ptr")
    s_ptr = line(sc, f"getelementptr inbounds i32, ptr {ps}, i64 {m0}", "ptr")
    sc.lines.append(f"  call void @{mv}(ptr {w_ptr}, ptr {s_ptr}, ptr {buf}, ptr {c_ptr}, i64 {k4}, i64 {c_row}, "
                    f"i64 {arg.c.col_stride}, i64 {rows}, i32 {corr})")
    if len(node.src) > 4:  # the epilogue over this panel's rows, while C is in cache
        epilogue, *batch_ranges, m_range, n_range = node.src[4:]
        m1 = line(sc, f"add nuw nsw i64 {m0}, {rows}")
        em.emit_over_tile(epilogue, list(zip(batch_ranges, batch, strict=True)), (m_range, m0, m1),
                          (n_range, "0", str(arg.n)))
    em.param_values.pop(node.src[2].arg.index, None)
    em.close_loop()
