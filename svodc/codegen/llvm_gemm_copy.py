"""Operand copies in the CPU GEMM's tile loop (codegen/llvm_gemm.py): the vector panel of a lane tile
copied contiguous (copy_panel), and a run-time scalar side packed per block of row tiles (the blocked
tile order, the pack; gemm_plan.py decides where)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from svodc.gemm_plan import CpuGemmPlan

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope


def copy_name(nvec: int, vw: int, prefetch: bool = False) -> str:
    """The name of copy_panel's function for these lanes (and prefetch)."""
    return f"svod.copy.{nvec}v{vw}{'p' if prefetch else ''}"


def call_when(em: KernelEmitter, sc: Scope, cond: str, call: str) -> None:
    """A void `call` instruction run only where `cond` (an i1) holds; the code after it runs either way."""
    p = em.fresh_label()
    sc.lines += [f"  br i1 {cond}, label %P{p}.do, label %P{p}.go", f"P{p}.do:", f"  {call}", f"  br label %P{p}.go",
                 f"P{p}.go:"]


def copy_panel(nvec: int, vw: int, intrinsics: set[str], prefetch: bool = False) -> str:
    """void copy(ptr src, ptr dst, i64 k, i64 src_k, i64 valid): dst[k][nvec * vw] = the first `valid`
    lanes of rows src + k * src_k, zero past them (so the micro-kernel's masked tail reads zeros).

    prefetch: each row of the next lane tile's panel (the nvec * vw floats after this one's) is
    prefetched to L2 as this one is copied. Its rows are a page or more apart, so no hardware stream
    prefetcher follows them, and the next copy would wait on a cache miss per row; the row tiles
    between the two copies cover the prefetches' latency. A prefetch never faults, so the one past
    the last lane tile reads nothing the GEMM owns and costs only a line."""
    vt, mt = f"<{vw} x float>", f"<{vw} x i1>"
    iota = "<" + ", ".join(f"i64 {i}" for i in range(vw)) + ">"
    intrinsics.add(f"declare {vt} @llvm.masked.load.v{vw}f32.p0(ptr, i32, {mt}, {vt})")
    if prefetch:
        intrinsics.add("declare void @llvm.prefetch.p0(ptr, i32, i32, i32)")
    L = [f"define internal void @{copy_name(nvec, vw, prefetch)}(ptr noalias %src, ptr noalias %dst, "
         "i64 %kn, i64 %src_k, i64 %valid) #0 {", "entry:",
         f"  %vi = insertelement <{vw} x i64> poison, i64 %valid, i64 0",
         f"  %vv = shufflevector <{vw} x i64> %vi, <{vw} x i64> poison, <{vw} x i32> zeroinitializer"]
    for j in range(nvec):
        L.append(f"  %lane{j} = add nuw <{vw} x i64> {iota}, <{', '.join([f'i64 {j * vw}'] * vw)}>")
        L.append(f"  %mask{j} = icmp ult <{vw} x i64> %lane{j}, %vv")
    L += ["  br label %loop", "loop:", "  %k = phi i64 [ 0, %entry ], [ %k.next, %loop ]",
          "  %so = mul nsw i64 %k, %src_k", f"  %do = mul nsw i64 %k, {nvec * vw}"]
    for j in range(nvec):
        L += [f"  %sa{j} = add nsw i64 %so, {j * vw}", f"  %sp{j} = getelementptr inbounds float, ptr %src, i64 %sa{j}",
              f"  %x{j} = call {vt} @llvm.masked.load.v{vw}f32.p0(ptr %sp{j}, i32 4, {mt} %mask{j}, "
              f"{vt} zeroinitializer)",
              f"  %da{j} = add nsw i64 %do, {j * vw}", f"  %dp{j} = getelementptr inbounds float, ptr %dst, i64 %da{j}",
              f"  store {vt} %x{j}, ptr %dp{j}, align 4"]
    # one prefetch per 64-byte line of the next panel's row: at each 16 floats and at its last float
    for i, off in enumerate(sorted({*range(0, nvec * vw, 16), nvec * vw - 1}) if prefetch else ()):
        L += [f"  %pa{i} = add i64 %so, {nvec * vw + off}", f"  %pp{i} = getelementptr float, ptr %src, i64 %pa{i}",
              f"  call void @llvm.prefetch.p0(ptr %pp{i}, i32 0, i32 2, i32 1)"]
    L += ["  %k.next = add nuw i64 %k, 1", "  %more = icmp ult i64 %k.next, %kn",
          "  br i1 %more, label %loop, label %done", "done:", "  ret void", "}"]
    return "\n".join(L)


def copy_all_panels(nvec: int, vw: int) -> str:
    """void copy_all(ptr src, ptr dst, i64 k, i64 src_k, i64 lanes_total): every lane tile's panel of the
    vector side (nvec * vw lanes each, the last one `lanes_total` mod that, zero-filled) copied by
    svod.copy (copy_panel, without prefetch) to dst, panel after panel, k * nvec * vw floats each."""
    lanes = nvec * vw
    copy = f"@{copy_name(nvec, vw)}"
    return "\n".join([
        f"define internal void @svod.copyall.{nvec}v{vw}(ptr noalias %src, ptr noalias %dst, i64 %kn, i64 %src_k, "
        "i64 %lanes_total) #0 {", "entry:", "  br label %loop", "loop:",
        "  %l0 = phi i64 [ 0, %entry ], [ %l0.next, %loop ]",
        "  %left = sub nsw i64 %lanes_total, %l0", f"  %short = icmp ult i64 %left, {lanes}",
        f"  %valid = select i1 %short, i64 %left, i64 {lanes}",
        "  %sp = getelementptr inbounds float, ptr %src, i64 %l0", "  %do = mul nsw i64 %l0, %kn",
        "  %dp = getelementptr inbounds float, ptr %dst, i64 %do",
        f"  call void {copy}(ptr %sp, ptr %dp, i64 %kn, i64 %src_k, i64 %valid)",
        f"  %l0.next = add nuw nsw i64 %l0, {lanes}", "  %more = icmp ult i64 %l0.next, %lanes_total",
        "  br i1 %more, label %loop, label %done", "done:", "  ret void", "}"])


def pack_rows(rows: int) -> str:
    """void pack(ptr src, ptr dst, i64 nrows, i64 k, i64 src_k, i64 src_row, i64 tile_stride): row r of
    src (elements src_k apart along k, rows src_row apart) to dst[r // rows][k][r % rows], row tiles
    tile_stride elements apart: what the micro-kernels read as a scalar side (k stride rows, row stride 1).

    Whole row tiles go k by k, each k's `rows` floats (one per row stream) stored contiguous: LLVM
    vectorizes that loop along k (vector loads of each row, interleaved into vector stores) where A's k
    is contiguous. The rows of a last partial tile go row by row."""
    L = [f"define internal void @svod.pack.{rows}(ptr noalias %src, ptr noalias %dst, i64 %nrows, i64 %kn, "
         "i64 %src_k, i64 %src_row, i64 %tile_stride) #0 {", "entry:",
         f"  %full = udiv i64 %nrows, {rows}", "  %anyfull = icmp ugt i64 %full, 0",
         "  br i1 %anyfull, label %tile, label %tail", "tile:",
         "  %t = phi i64 [ 0, %entry ], [ %t.next, %tile.end ]",
         f"  %tr0 = mul nsw i64 %t, {rows}", "  %tsbase = mul nsw i64 %tr0, %src_row",
         "  %tdbase = mul nsw i64 %t, %tile_stride", "  br label %tk", "tk:",
         "  %tkk = phi i64 [ 0, %tile ], [ %tkk.next, %tk ]",
         "  %tso0 = mul nsw i64 %tkk, %src_k", "  %tso = add nsw i64 %tsbase, %tso0",
         f"  %tdo0 = mul nsw i64 %tkk, {rows}", "  %tdo = add nsw i64 %tdbase, %tdo0"]
    for r in range(rows):
        L += [f"  %tro{r} = mul nsw i64 %src_row, {r}", f"  %tsa{r} = add nsw i64 %tso, %tro{r}",
              f"  %tsp{r} = getelementptr inbounds float, ptr %src, i64 %tsa{r}",
              f"  %tx{r} = load float, ptr %tsp{r}, align 4",
              f"  %tda{r} = add nsw i64 %tdo, {r}", f"  %tdp{r} = getelementptr inbounds float, ptr %dst, i64 %tda{r}",
              f"  store float %tx{r}, ptr %tdp{r}, align 4"]
    L += ["  %tkk.next = add nuw i64 %tkk, 1", "  %tkmore = icmp ult i64 %tkk.next, %kn",
          "  br i1 %tkmore, label %tk, label %tile.end", "tile.end:",
          "  %t.next = add nuw i64 %t, 1", "  %tmore = icmp ult i64 %t.next, %full",
          "  br i1 %tmore, label %tile, label %tail", "tail:",
          f"  %rstart = mul nuw i64 %full, {rows}", "  %anytail = icmp ult i64 %rstart, %nrows",
          "  br i1 %anytail, label %row, label %done", "row:",
          "  %r = phi i64 [ %rstart, %tail ], [ %r.next, %row.end ]",
          f"  %tile_i = udiv i64 %r, {rows}", f"  %within = urem i64 %r, {rows}",
          "  %dt = mul nsw i64 %tile_i, %tile_stride", "  %dbase = add nsw i64 %dt, %within",
          "  %sbase = mul nsw i64 %r, %src_row", "  br label %kloop", "kloop:",
          "  %k = phi i64 [ 0, %row ], [ %k.next, %kloop ]",
          "  %so0 = mul nsw i64 %k, %src_k", "  %so = add nsw i64 %sbase, %so0",
          "  %sp = getelementptr inbounds float, ptr %src, i64 %so", "  %x = load float, ptr %sp, align 4",
          f"  %do0 = mul nsw i64 %k, {rows}", "  %do = add nsw i64 %dbase, %do0",
          "  %dp = getelementptr inbounds float, ptr %dst, i64 %do", "  store float %x, ptr %dp, align 4",
          "  %k.next = add nuw i64 %k, 1", "  %kmore = icmp ult i64 %k.next, %kn",
          "  br i1 %kmore, label %kloop, label %row.end", "row.end:",
          "  %r.next = add nuw i64 %r, 1", "  %rmore = icmp ult i64 %r.next, %nrows",
          "  br i1 %rmore, label %row, label %done", "done:", "  ret void", "}"]
    return "\n".join(L)


def blocked_tile(em: KernelEmitter, sc: Scope, plan: CpuGemmPlan, t: str, start: str
                  ) -> tuple[str, str, str, str, list[str]]:
    """Tile t of a blocked tile loop (row tiles innermost, then lane tiles, then blocks of
    block_row_tiles row tiles, the last block possibly smaller, then batch): (row tile, lane tile, row
    tile within its block, whether t is the first tile of its block in this part, batch indices)."""
    line = em.emit_line
    block, last_block = plan.block_row_tiles, plan.row_blocks - 1
    w, *batch = em.split_index(sc, t, (plan.row_tiles * plan.lane_tiles, *reversed(plan.batch)))
    batch.reverse()
    per_block = block * plan.lane_tiles
    b = line(sc, f"udiv i64 {w}, {per_block}")
    within = line(sc, f"urem i64 {w}, {per_block}")
    tiles_in = str(block)
    if plan.row_tiles - last_block * block != block:
        tiles_in = line(sc, f"select i1 {line(sc, f'icmp eq i64 {b}, {last_block}')}, "
                            f"i64 {plan.row_tiles - last_block * block}, i64 {block}")
    lt = line(sc, f"udiv i64 {within}, {tiles_in}")
    rin = line(sc, f"urem i64 {within}, {tiles_in}")
    rt = line(sc, f"add nuw nsw i64 {line(sc, f'mul nuw nsw i64 {b}, {block}')}, {rin}")
    first = line(sc, f"or i1 {line(sc, f'icmp eq i64 {within}, 0')}, {line(sc, f'icmp eq i64 {t}, {start}')}")
    return rt, lt, rin, first, batch


def pack_block(em: KernelEmitter, sc: Scope, plan: CpuGemmPlan, src_k: int, src_row: int, src_ptr: str,
               first: str, block_m0: str, rin: str, k_size: str) -> str:
    """Pack the block's rows (at src_ptr: elements src_k apart along k, rows src_row apart) to a stack
    buffer when `first`; the pointer to row tile `rin`'s rows in it."""
    line = em.emit_line
    rows, kc = plan.rows, plan.k_block or plan.k_total
    name = f"svod.pack.{rows}"
    em.shared_functions[name] = pack_rows(rows)
    buf = em.fresh("rows")
    em.allocas.append(f"{buf} = alloca float, i64 {plan.block_row_tiles * rows * kc}, align 64")
    nrows = line(sc, f"sub nsw i64 {plan.rows_total}, {block_m0}")
    nrows = line(sc, f"select i1 {line(sc, f'icmp ult i64 {nrows}, {plan.block_row_tiles * rows}')}, "
                     f"i64 {nrows}, i64 {plan.block_row_tiles * rows}")
    call_when(em, sc, first, f"call void @{name}(ptr {src_ptr}, ptr {buf}, i64 {nrows}, i64 {k_size}, i64 {src_k}, "
                             f"i64 {src_row}, i64 {rows * kc})")
    return line(sc, f"getelementptr inbounds float, ptr {buf}, i64 {line(sc, f'mul nuw nsw i64 {rin}, {rows * kc}')}",
                "ptr")
