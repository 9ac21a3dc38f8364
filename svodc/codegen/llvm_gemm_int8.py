"""CPU code for integer GEMM nodes (GemmArg.quant; passes/lower_gemm_int8.py): C int32 = W x B, W int8
weight panels, B 8-bit activations less a zero point, exactly.

The parallel loop runs over lane tiles (`lanes` columns of C, of every batch index). Per lane tile,
the B columns are packed once into a stack buffer as [ceil(K/4)][lanes][4] bytes (four consecutive k
of one column together: the operand layout of the 4-way byte dot products), then every panel of
Q_PANEL weight rows runs the micro-kernel over it: Q_PANEL x nvec vector accumulators of vw int32
lanes, one 4-byte weight group broadcast per row and k step, the same layout for every machine.
The dot product per target (int8_path):
- vnni: vpdpbusd (AVX512-VNNI, or AVX-VNNI at 256 bits): u8 x s8 groups of 4, added to int32;
- pmaddubsw: x86 without VNNI, weights of at most 64 in magnitude (QuantGemm.a_max: 7-bit weights, as
  quantize_static's reduce_range makes): vpmaddubsw sums each u8 x s8 byte pair in int16, exactly
  (255 * 64 * 2 < 2^15), and vpmaddwd by ones adds the two pairs of a group: 2 instructions per 4 k
  and 8 lanes, with no splitting of bytes into int16 halves;
- pmaddwd: x86 without VNNI, full-range weights: the even and odd bytes of each group, zero-extended
  (activations) and sign-extended (weights) to int16, through vpmaddwd. No int16 saturation can occur
  (255 * 128 * 2 < 2^31; where vpmaddubsw's saturating pair sums would give other integers);
- sdot: aarch64 dotprod, s8 x s8 groups of 4;
- generic: every other machine, int32 multiplies and adds of the extended bytes.
The packing stores activations as the instruction's type (u8 for vnni/pmaddwd, s8 for sdot, as given
for generic): a flip of the top bit maps int8 to uint8 (x + 128) and back, and the accumulators start
at (delta - zero) * rowsum[m] for the stored value x_stored = x - delta, which makes C exact:
sum_k W[m, k] * (x[k, n] - zero) = sum_k W[m, k] * x_stored[k, n] + (delta - zero) * rowsum[m].
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from svodc.codegen.llvm_gemm import operand_offset
from svodc.codegen.llvm_gemm_epilogue import VectorEpilogue, emit_vector_epilogue, vector_epilogue
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GemmArg, Ops, RangeArg, RangeKind
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp
from svodc.passes.lower_gemm_int8 import Q_PANEL, QT_PANEL
from svodc.policy import GemmBlocking
from svodc.target import Target

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter


def int8_path(target: Target, a_max: int = 128) -> str:
    """The dot-product instruction of the target's integer GEMM micro-kernel for weights of at most
    a_max in magnitude (see the module docstring)."""
    f, vw = set(target.features), target.vector_bits // 32
    if target.arch == "x86_64":
        if (vw == 16 and "avx512vnni" in f) or (vw == 8 and "avxvnni" in f):
            return "vnni"
        # 256-bit integer vectors need AVX2 and 512-bit ones AVX512BW (AVX alone has 256-bit float only).
        if vw == 4 or (vw == 8 and "avx2" in f) or (vw == 16 and "avx512bw" in f):
            return "pmaddubsw" if a_max <= 64 and (vw > 4 or "ssse3" in f) else "pmaddwd"
    if target.arch == "aarch64" and "dotprod" in f and vw == 4:
        return "sdot"
    return "generic"


def int8_plan(arg: GemmArg, target: Target, blocking: GemmBlocking) -> tuple[int, int, int]:
    """(vw, nvec, tiles): vw int32 lanes per vector, nvec vectors per tile row (Q_PANEL x nvec
    accumulators, the activation vectors and a weight broadcast fit the registers); the tiles of the parallel
    loop: lane tiles, or panels of QT_PANEL rows where the lanes run along m (transposed: llvm_gemv_int8.py)."""
    vw = max(1, target.vector_bits // 32)
    if arg.transposed:
        return min(vw, QT_PANEL), 1, math.prod(arg.batch) * -(-arg.m // QT_PANEL)
    nvec = 2 if blocking.vector_regs <= 16 else max(2, 16 // vw)
    return vw, nvec, math.prod(arg.batch) * -(-arg.n // (nvec * vw))


def _splat(L: list[str], name: str, ty: str, n: int, value: str) -> str:
    L.append(f"  %{name}.i = insertelement <{n} x {ty}> poison, {ty} {value}, i64 0")
    L.append(f"  %{name} = shufflevector <{n} x {ty}> %{name}.i, <{n} x {ty}> poison, <{n} x i32> zeroinitializer")
    return f"%{name}"


def _iota(n: int, ty: str = "i64") -> str:
    return "<" + ", ".join(f"{ty} {i}" for i in range(n)) + ">"


def pack_function(lanes: int, strided: bool, flip: bool, intrinsics: set[str]) -> tuple[str, str]:
    """void pack(ptr src, ptr dst, i64 k, i64 k_stride, i64 n_stride, i64 valid): dst[q][l][j] = the byte
    of column l < valid at k = 4q + j < k (top bit flipped with `flip`), zero elsewhere. Full tiles of
    contiguous columns take plain vector loads; the rest masked loads (strided columns: gathers)."""
    name = f"svod.q8.pack{lanes}{'s' if strided else ''}{'f' if flip else ''}"
    bt, mt = f"<{lanes} x i8>", f"<{lanes} x i1>"
    intrinsics.add(f"declare {bt} @llvm.masked.load.v{lanes}i8.p0(ptr, i32, {mt}, {bt})")
    intrinsics.add(f"declare {bt} @llvm.masked.gather.v{lanes}i8.v{lanes}p0(<{lanes} x ptr>, i32, {mt}, {bt})")
    quad = ", ".join(f"i32 {j * lanes + lane}" for lane in range(lanes) for j in range(4))
    flip_v = "<" + ", ".join(["i8 -128"] * lanes) + ">"
    L = [f"define internal void @{name}(ptr noalias %src, ptr noalias %dst, i64 %k, i64 %ks, i64 %ns, "
         "i64 %valid) #0 {", "entry:",
         "  %k3 = add nuw i64 %k, 3", "  %k4 = udiv i64 %k3, 4", "  %kf = udiv i64 %k, 4",
         f"  %full = icmp eq i64 %valid, {lanes}"]
    vv = _splat(L, "vv", "i64", lanes, "%valid")
    L.append(f"  %lm = icmp ult <{lanes} x i64> {_iota(lanes)}, {vv}")
    nsv = _splat(L, "nsv", "i64", lanes, "%ns")
    L += [f"  %offs = mul nsw <{lanes} x i64> {_iota(lanes)}, {nsv}",
          f"  %fast.end = select i1 %full, i64 {'0' if strided else '%kf'}, i64 0"]  # what the fast loop packs
    if strided:
        L.append("  br label %slow.check")
    else:
        L += ["  %any.fast = icmp ugt i64 %fast.end, 0", "  br i1 %any.fast, label %fast, label %slow.check", "fast:",
              "  %qf = phi i64 [ 0, %entry ], [ %qf.next, %fast ]"]
        for j in range(4):
            L += [f"  %fk{j} = add nuw i64 %qf4, {j}" if j else "  %qf4 = mul nuw i64 %qf, 4",
                  f"  %fo{j} = mul nsw i64 {'%qf4' if j == 0 else f'%fk{j}'}, %ks",
                  f"  %fp{j} = getelementptr inbounds i8, ptr %src, i64 %fo{j}",
                  f"  %fr{j} = load {bt}, ptr %fp{j}, align 1"]
        _interleave(L, "f", lanes, quad, flip, flip_v, "%qf")
        L += ["  %qf.next = add nuw i64 %qf, 1", "  %more.f = icmp ult i64 %qf.next, %fast.end",
              "  br i1 %more.f, label %fast, label %slow.check"]
    L += ["slow.check:", "  %left = icmp ult i64 %fast.end, %k4", "  br i1 %left, label %slow, label %done", "slow:",
          "  %qs = phi i64 [ %fast.end, %slow.check ], [ %qs.next, %slow ]", "  %qs4 = mul nuw i64 %qs, 4"]
    for j in range(4):
        L += [f"  %sk{j} = add nuw i64 %qs4, {j}", f"  %sok{j} = icmp ult i64 %sk{j}, %k",
              f"  %sm{j} = select i1 %sok{j}, {mt} %lm, {mt} zeroinitializer",
              f"  %sc{j} = select i1 %sok{j}, i64 %sk{j}, i64 0",  # a row past k is not read (address in range)
              f"  %so{j} = mul nsw i64 %sc{j}, %ks", f"  %sp{j} = getelementptr inbounds i8, ptr %src, i64 %so{j}"]
        if strided:
            L += [f"  %sg{j} = getelementptr inbounds i8, ptr %sp{j}, <{lanes} x i64> %offs",
                  f"  %sr{j} = call {bt} @llvm.masked.gather.v{lanes}i8.v{lanes}p0(<{lanes} x ptr> %sg{j}, i32 1, "
                  f"{mt} %sm{j}, {bt} zeroinitializer)"]
        else:
            L.append(f"  %sr{j} = call {bt} @llvm.masked.load.v{lanes}i8.p0(ptr %sp{j}, i32 1, {mt} %sm{j}, "
                     f"{bt} zeroinitializer)")
    _interleave(L, "s", lanes, quad, flip, flip_v, "%qs")
    L += ["  %qs.next = add nuw i64 %qs, 1", "  %more.s = icmp ult i64 %qs.next, %k4",
          "  br i1 %more.s, label %slow, label %done", "done:", "  ret void", "}"]
    return name, "\n".join(L)


def _interleave(L: list[str], p: str, lanes: int, quad: str, flip: bool, flip_v: str, q: str) -> None:
    """Store rows %{p}r0..3 (lanes bytes each) as `lanes` groups of 4 at dst + q * 4 * lanes."""
    bt = f"<{lanes} x i8>"
    L += [f"  %{p}c01 = shufflevector {bt} %{p}r0, {bt} %{p}r1, <{2 * lanes} x i32> {_iota(2 * lanes, 'i32')}",
          f"  %{p}c23 = shufflevector {bt} %{p}r2, {bt} %{p}r3, <{2 * lanes} x i32> {_iota(2 * lanes, 'i32')}",
          f"  %{p}g = shufflevector <{2 * lanes} x i8> %{p}c01, <{2 * lanes} x i8> %{p}c23, "
          f"<{4 * lanes} x i32> <{quad}>"]
    value = f"%{p}g"
    if flip:
        wide = "<" + ", ".join(["i8 -128"] * (4 * lanes)) + ">"
        L.append(f"  %{p}x = xor <{4 * lanes} x i8> %{p}g, {wide}")
        value = f"%{p}x"
    L += [f"  %{p}do = mul nuw i64 {q}, {4 * lanes}", f"  %{p}dp = getelementptr inbounds i8, ptr %dst, i64 %{p}do",
          f"  store <{4 * lanes} x i8> {value}, ptr %{p}dp, align 16"]


def _dot(L: list[str], path: str, vw: int, acc: str, a: str, w: str, out: str, stored_signed: bool,
         intrinsics: set[str]) -> None:
    """out = acc + the 4-byte dot products of a (activation groups, <4vw x i8>) and w (a broadcast
    weight group, <vw x i32>), per int32 lane. For pmaddwd, a and w are the pre-split (even, odd)
    int16 vectors (see _split_*)."""
    vt = f"<{vw} x i32>"
    if path == "vnni":
        fn = f"llvm.x86.avx512.vpdpbusd.{vw * 32}"
        intrinsics.add(f"declare {vt} @{fn}({vt}, {vt}, {vt})")
        L.append(f"  {out} = call {vt} @{fn}({vt} {acc}, {vt} {a}, {vt} {w})")
    elif path == "pmaddwd":
        ht = f"<{2 * vw} x i16>"
        fn = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}[vw]
        intrinsics.add(f"declare {vt} @{fn}({ht}, {ht})")
        L += [f"  {out}.e = call {vt} @{fn}({ht} {a}.e, {ht} {w}.e)",
              f"  {out}.o = call {vt} @{fn}({ht} {a}.o, {ht} {w}.o)",
              f"  {out}.s = add {vt} {out}.e, {out}.o", f"  {out} = add {vt} {acc}, {out}.s"]
    elif path == "pmaddubsw":
        ht, bt = f"<{2 * vw} x i16>", f"<{4 * vw} x i8>"
        ub = {4: "llvm.x86.ssse3.pmadd.ub.sw.128", 8: "llvm.x86.avx2.pmadd.ub.sw", 16: "llvm.x86.avx512.pmaddubs.w.512"}
        wd = {4: "llvm.x86.sse2.pmadd.wd", 8: "llvm.x86.avx2.pmadd.wd", 16: "llvm.x86.avx512.pmaddw.d.512"}
        intrinsics.add(f"declare {ht} @{ub[vw]}({bt}, {bt})")
        intrinsics.add(f"declare {vt} @{wd[vw]}({ht}, {ht})")
        ones = "<" + ", ".join(["i16 1"] * (2 * vw)) + ">"
        L += [f"  {out}.w = bitcast {vt} {w} to {bt}",
              f"  {out}.p = call {ht} @{ub[vw]}({bt} {a}, {bt} {out}.w)",
              f"  {out}.s = call {vt} @{wd[vw]}({ht} {out}.p, {ht} {ones})", f"  {out} = add {vt} {acc}, {out}.s"]
    elif path == "sdot":
        intrinsics.add(f"declare {vt} @llvm.aarch64.neon.sdot.v4i32.v16i8({vt}, <16 x i8>, <16 x i8>)")
        L += [f"  {out}.w = bitcast {vt} {w} to <16 x i8>",
              f"  {out} = call {vt} @llvm.aarch64.neon.sdot.v4i32.v16i8({vt} {acc}, <16 x i8> {a}, <16 x i8> {out}.w)"]
    else:
        wt = f"<{4 * vw} x i32>"
        L += [f"  {out}.wb = bitcast {vt} {w} to <{4 * vw} x i8>",
              f"  {out}.wx = sext <{4 * vw} x i8> {out}.wb to {wt}",
              f"  {out}.ax = {'sext' if stored_signed else 'zext'} <{4 * vw} x i8> {a} to {wt}",
              f"  {out}.p = mul {wt} {out}.ax, {out}.wx"]
        s = acc
        for g in range(4):
            mask = ", ".join(f"i32 {4 * lane + g}" for lane in range(vw))
            L += [f"  {out}.g{g} = shufflevector {wt} {out}.p, {wt} poison, <{vw} x i32> <{mask}>",
                  f"  {out}.s{g} = add {vt} {s}, {out}.g{g}"]
            s = f"{out}.s{g}"
        L.append(f"  {out} = add {vt} {s}, zeroinitializer")


def activation_operand(L: list[str], path: str, vw: int, name: str, groups: str) -> None:
    """%{name}: the activation groups `groups` (<4vw x i8>) as _dot's `a` of `path` (pmaddwd: %{name}.e and .o,
    the even and odd bytes zero-extended to int16: the activations are stored unsigned there)."""
    vt, bt = f"<{vw} x i32>", f"<{4 * vw} x i8>"
    if path == "vnni":
        L.append(f"  %{name} = bitcast {bt} {groups} to {vt}")
    elif path == "pmaddwd":
        ht = f"<{2 * vw} x i16>"
        L += [f"  %{name}.h = bitcast {bt} {groups} to {ht}",
              f"  %{name}.e = and {ht} %{name}.h, <{', '.join(['i16 255'] * (2 * vw))}>",
              f"  %{name}.o = lshr {ht} %{name}.h, <{', '.join(['i16 8'] * (2 * vw))}>"]
    else:
        L.append(f"  %{name} = add {bt} {groups}, zeroinitializer")


def weight_operand(L: list[str], path: str, vw: int, w: str) -> None:
    """The weight groups w (<vw x i32>) as _dot's `w` of `path`: pmaddwd reads {w}.e and {w}.o, the even and odd
    bytes sign-extended to int16; the other paths w itself."""
    if path == "pmaddwd":
        vt, ht, eight = f"<{vw} x i32>", f"<{2 * vw} x i16>", f"<{', '.join(['i16 8'] * (2 * vw))}>"
        L += [f"  {w}.h = bitcast {vt} {w} to {ht}", f"  {w}.l = shl {ht} {w}.h, {eight}",
              f"  {w}.e = ashr {ht} {w}.l, {eight}", f"  {w}.o = ashr {ht} {w}.h, {eight}"]


def tile_type(vw: int, nvec: int) -> str:
    """The struct a returning micro-kernel gives back: its Q_PANEL x nvec accumulators, row-major."""
    return "{ " + ", ".join([f"<{vw} x i32>"] * (Q_PANEL * nvec)) + " }"


def micro_kernel(path: str, vw: int, nvec: int, stored_signed: bool, intrinsics: set[str],
                 returns: bool = False) -> tuple[str, str]:
    """void mk(ptr w, ptr sums, ptr pk, ptr c, i64 k4, i64 c_row, i64 rows, i64 valid, i32 corr): the
    C tile of one weight panel (Q_PANEL rows, the first `rows` stored) and one packed lane tile (nvec
    vectors, the first `valid` lanes stored), over k4 groups of 4 k. returns: the tile is returned
    (tile_type) instead of stored, for the epilogue in registers (c, c_row, rows and valid unused)."""
    lanes = nvec * vw
    vt, mt = f"<{vw} x i32>", f"<{vw} x i1>"
    name = f"svod.q8.mk.{path}.{nvec}v{vw}{'s' if stored_signed else 'u'}{'r' if returns else ''}"
    intrinsics.add(f"declare void @llvm.masked.store.v{vw}i32.p0({vt}, ptr, i32, {mt})")
    L = [f"define internal {tile_type(vw, nvec) if returns else 'void'} @{name}(ptr noalias %w, ptr noalias %sums, "
         "ptr noalias %pk, ptr noalias %c, i64 %k4, i64 %c_row, i64 %rows, i64 %valid, i32 %corr) #0 {", "entry:"]
    vv = _splat(L, "vv", "i64", vw, "%valid")
    for j in range(nvec):
        L += [f"  %ln{j} = add nuw <{vw} x i64> {_iota(vw)}, <{', '.join([f'i64 {j * vw}'] * vw)}>",
              f"  %lm{j} = icmp ult <{vw} x i64> %ln{j}, {vv}"]
    for r in range(Q_PANEL):
        L += [f"  %sp{r} = getelementptr inbounds i32, ptr %sums, i64 {r}", f"  %s{r} = load i32, ptr %sp{r}, align 4",
              f"  %s{r}.c = mul i32 %s{r}, %corr"]
        _splat(L, f"init{r}", "i32", vw, f"%s{r}.c")
    L += ["  br label %loop", "loop:", "  %q = phi i64 [ 0, %entry ], [ %q.next, %loop ]"]
    for r in range(Q_PANEL):
        for j in range(nvec):
            L.append(f"  %acc{r}.{j} = phi {vt} [ %init{r}, %entry ], [ %n{r}.{j}, %loop ]")
    L.append(f"  %qo = mul nuw i64 %q, {4 * lanes}")
    bt = f"<{4 * vw} x i8>"
    for j in range(nvec):
        L += [f"  %ao{j} = add nuw i64 %qo, {4 * j * vw}", f"  %ap{j} = getelementptr inbounds i8, ptr %pk, i64 %ao{j}",
              f"  %ab{j} = load {bt}, ptr %ap{j}, align 16"]
        activation_operand(L, path, vw, f"a{j}", f"%ab{j}")
    L.append(f"  %wo = mul nuw i64 %q, {4 * Q_PANEL}")
    for r in range(Q_PANEL):
        L += [f"  %wa{r} = add nuw i64 %wo, {4 * r}", f"  %wp{r} = getelementptr inbounds i8, ptr %w, i64 %wa{r}",
              f"  %ws{r} = load i32, ptr %wp{r}, align 4"]
        wb = _splat(L, f"w{r}", "i32", vw, f"%ws{r}")
        weight_operand(L, path, vw, wb)
        for j in range(nvec):
            _dot(L, path, vw, f"%acc{r}.{j}", f"%a{j}", wb, f"%n{r}.{j}", stored_signed, intrinsics)
    L += ["  %q.next = add nuw i64 %q, 1", "  %more = icmp ult i64 %q.next, %k4",
          f"  br i1 %more, label %loop, label %{'ret' if returns else 'row0'}"]
    if returns:
        tt, agg = tile_type(vw, nvec), "undef"
        L.append("ret:")
        for i, (r, j) in enumerate((r, j) for r in range(Q_PANEL) for j in range(nvec)):
            L.append(f"  %t{i} = insertvalue {tt} {agg}, {vt} %n{r}.{j}, {i}")
            agg = f"%t{i}"
        L += [f"  ret {tt} {agg}", "}"]
        return name, "\n".join(L)
    # Rows past `rows` are not stored; full lane tiles take plain stores (masked ones are slow on some
    # x86: microcoded on AMD Zen), the last one masked stores.
    L.insert(L.index("loop:") - 1, f"  %full = icmp eq i64 %valid, {lanes}")
    for r in range(Q_PANEL):
        after = f"row{r + 1}" if r + 1 < Q_PANEL else "done"
        L += [f"row{r}:", f"  %ok{r} = icmp ult i64 {r}, %rows", f"  br i1 %ok{r}, label %st{r}, label %done",
              f"st{r}:", f"  %cr{r} = mul nsw i64 %c_row, {r}"]
        for j in range(nvec):
            L += [f"  %co{r}.{j} = add nsw i64 %cr{r}, {j * vw}",
                  f"  %cp{r}.{j} = getelementptr inbounds i32, ptr %c, i64 %co{r}.{j}"]
        L.append(f"  br i1 %full, label %sf{r}, label %sm{r}")
        L.append(f"sf{r}:")
        L += [f"  store {vt} %n{r}.{j}, ptr %cp{r}.{j}, align 4" for j in range(nvec)]
        L += [f"  br label %{after}", f"sm{r}:"]
        L += [f"  call void @llvm.masked.store.v{vw}i32.p0({vt} %n{r}.{j}, ptr %cp{r}.{j}, i32 4, {mt} %lm{j})"
              for j in range(nvec)]
        L.append(f"  br label %{after}")
    L += ["done:", "  ret void", "}"]
    return name, "\n".join(L)


def rows_function(mk: str, lanes: int) -> tuple[str, str]:
    """void rows(ptr w, ptr sums, ptr pk, ptr c, i64 m, i64 k4, i64 c_row, i64 valid, i32 corr): the
    micro-kernel over every weight panel of one packed lane tile."""
    name = f"{mk}.rows"
    L = [f"define internal void @{name}(ptr noalias %w, ptr noalias %sums, ptr noalias %pk, ptr noalias %c, i64 %m, "
         "i64 %k4, i64 %c_row, i64 %valid, i32 %corr) #0 {", "entry:", "  br label %loop", "loop:",
         "  %p = phi i64 [ 0, %entry ], [ %p.next, %loop ]",
         f"  %r0 = mul nuw i64 %p, {Q_PANEL}", "  %left = sub nsw i64 %m, %r0",
         f"  %few = icmp ult i64 %left, {Q_PANEL}", f"  %rows = select i1 %few, i64 %left, i64 {Q_PANEL}",
         f"  %wpo = mul nuw i64 %k4, {4 * Q_PANEL}", "  %wo = mul nuw i64 %p, %wpo",
         "  %wp = getelementptr inbounds i8, ptr %w, i64 %wo",
         "  %sp = getelementptr inbounds i32, ptr %sums, i64 %r0",
         "  %co = mul nsw i64 %r0, %c_row", "  %cp = getelementptr inbounds i32, ptr %c, i64 %co",
         f"  call void @{mk}(ptr %wp, ptr %sp, ptr %pk, ptr %cp, i64 %k4, i64 %c_row, i64 %rows, i64 %valid, "
         "i32 %corr)",
         "  %p.next = add nuw i64 %p, 1", "  %r1 = mul nuw i64 %p.next, " + str(Q_PANEL),
         "  %more = icmp ult i64 %r1, %m", "  br i1 %more, label %loop, label %done", "done:", "  ret void", "}"]
    return name, "\n".join(L)


def emit_int8_gemm(em: KernelEmitter, node: UOp, target: Target, blocking: GemmBlocking) -> None:
    arg: GemmArg = node.arg
    quant = arg.quant
    assert quant is not None and not arg.runtime
    path = int8_path(target, quant.a_max)
    vw, nvec, tiles = int8_plan(arg, target, blocking)
    lanes = nvec * vw
    stored_signed = {"vnni": False, "pmaddwd": False, "pmaddubsw": False, "sdot": True}.get(path, quant.b_signed)
    flip = stored_signed != quant.b_signed
    delta = 0 if not flip else (128 if stored_signed else -128)  # x = x_stored + delta
    corr = delta - quant.b_zero
    if arg.transposed:  # few activation columns: lanes along m
        from svodc.codegen.llvm_gemv_int8 import emit_int8_gemv

        emit_int8_gemv(em, node, path, vw, stored_signed, flip, corr)
        return
    pw, pb, pc, ps = (em.value(x) for x in node.src[:4])
    k4 = -(-arg.k // 4)
    strided = arg.b.col_stride != 1 and arg.n > 1
    pack, pack_def = pack_function(lanes, strided, flip, em.uses_intrinsics)
    mk, mk_def = micro_kernel(path, vw, nvec, stored_signed, em.uses_intrinsics)
    rows, rows_def = rows_function(mk, lanes)
    em.shared_functions.update({pack: pack_def, mk: mk_def, rows: rows_def})

    vepi = _vector_epilogue(em, node, blocking)
    t_range = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, tiles),), RangeArg(-1, RangeKind.PARALLEL))
    start, stop = em.part_split(str(tiles))
    em.open_loop(t_range, start, stop)
    sc = em.stack[-1]
    line = em.emit_line
    lane_tiles = -(-arg.n // lanes)
    lt, *batch = em.split_index(sc, sc.ivar, (lane_tiles, *reversed(arg.batch)))
    batch.reverse()
    n0 = line(sc, f"mul nuw nsw i64 {lt}, {lanes}")
    left = line(sc, f"sub nsw i64 {arg.n}, {n0}")
    few = line(sc, f"icmp ult i64 {left}, {lanes}")
    valid = line(sc, f"select i1 {few}, i64 {left}, i64 {lanes}")
    b_ptr = line(sc, f"getelementptr inbounds i8, ptr {pb}, i64 "
                     f"{operand_offset(em, sc, arg.b, batch, [(n0, arg.b.col_stride)])}", "ptr")
    buf = em.fresh("packed")
    em.allocas.append(f"{buf} = alloca i8, i64 {k4 * 4 * lanes}, align 64")
    sc.lines.append(f"  call void @{pack}(ptr {b_ptr}, ptr {buf}, i64 {arg.k}, i64 {arg.b.row_stride}, "
                    f"i64 {arg.b.col_stride}, i64 {valid})")
    if vepi is not None:
        mk_r, mk_r_def = micro_kernel(path, vw, nvec, stored_signed, em.uses_intrinsics, returns=True)
        em.shared_functions[mk_r] = mk_r_def
        _panels_in_registers(em, node, vepi, mk_r, (vw, nvec), buf, k4, corr, batch, n0, few)
        em.close_loop()
        return
    if quant.c_tile:  # C in a stack tile (lower_gemm_int8.c_scratch_shape): the epilogue's C is the tile less n0
        assert lanes <= quant.c_tile and len(node.src) > 4
        c_ptr = em.fresh("ctile")
        em.allocas.append(f"{c_ptr} = alloca i32, i64 {arg.m * quant.c_tile}, align 64")
        neg = line(sc, f"sub nsw i64 0, {n0}")
        em.param_values[node.src[2].arg.index] = line(sc, f"getelementptr i32, ptr {c_ptr}, i64 {neg}", "ptr")
    else:
        c_ptr = line(sc, f"getelementptr inbounds i32, ptr {pc}, i64 "
                         f"{operand_offset(em, sc, arg.c, batch, [(n0, 1)])}", "ptr")
    sc.lines.append(f"  call void @{rows}(ptr {pw}, ptr {ps}, ptr {buf}, ptr {c_ptr}, i64 {arg.m}, i64 {k4}, "
                    f"i64 {arg.c.row_stride}, i64 {valid}, i32 {corr})")
    if len(node.src) > 4:
        _epilogue(em, node, batch, n0, lanes, valid, few)
    em.param_values.pop(node.src[2].arg.index, None)
    em.close_loop()


def _vector_epilogue(em: KernelEmitter, node: UOp, blocking: GemmBlocking) -> VectorEpilogue | None:
    """The epilogue on the accumulators in registers (llvm_gemm_epilogue.py) where it has a vector form
    and reads C only as its element (m, n) (in the stack tile or, unbatched, the whole-product scratch:
    lower_gemm_int8.Int8GemmLowerer), else None."""
    arg: GemmArg = node.arg
    if len(node.src) <= 4 or not blocking.epilogue_in_registers or (math.prod(arg.batch) > 1 and not arg.quant.c_tile):
        return None
    epilogue, *ranges = node.src[4:]
    c_index = graph_rewrite(ranges[-2] * (arg.quant.c_tile or arg.n) + ranges[-1], pm_symbolic)
    return vector_epilogue(epilogue, node.src[2], tuple(ranges), em.free, c_index)


def _panels_in_registers(em: KernelEmitter, node: UOp, vepi: VectorEpilogue, mk: str, shape: tuple[int, int],
                         pk: str, k4: int, corr: int, batch: list[str], n0: str, few: str) -> None:
    """Per weight panel of this lane tile: the micro-kernel's accumulators, then the epilogue on them
    and its stores (C never stored). Two copies: full lane tiles, and the last one (n % lanes lanes,
    its last vector masked) where n is not a multiple of the lanes."""
    arg: GemmArg = node.arg
    vw, nvec = shape
    pw, ps = em.value(node.src[0]), em.value(node.src[3])
    sc, line, tt = em.stack[-1], em.emit_line, tile_type(vw, nvec)
    edge = arg.n % (nvec * vw)
    e = em.fresh_label()
    variants = [("full", nvec * vw)] + ([("edge", edge)] if edge else [])
    sc.lines.append(f"  br i1 {few}, label %R{e}.edge, label %R{e}.full" if edge else f"  br label %R{e}.full")
    full_panels, rows_left = divmod(arg.m, Q_PANEL)
    for tag, lanes in variants:
        sc.lines.append(f"R{e}.{tag}:")
        used = -(-lanes // vw)
        tail = lanes - (used - 1) * vw
        for looped, rows in ((True, Q_PANEL), (False, rows_left)):
            if (full_panels if looped else rows_left) == 0:
                continue
            if looped:
                em.open_loop(UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, full_panels),),
                                 RangeArg(-3, RangeKind.LOOP)), "0", str(full_panels))
            s = em.stack[-1]
            panel = s.ivar if looped else str(full_panels)
            m0 = line(s, f"mul nuw nsw i64 {panel}, {Q_PANEL}")
            w_off = line(s, f"mul nuw nsw i64 {panel}, {k4 * 4 * Q_PANEL}")
            wp = line(s, f"getelementptr inbounds i8, ptr {pw}, i64 {w_off}", "ptr")
            sp = line(s, f"getelementptr inbounds i32, ptr {ps}, i64 {m0}", "ptr")
            res = line(s, f"call {tt} @{mk}(ptr {wp}, ptr {sp}, ptr {pk}, ptr null, i64 {k4}, i64 0, i64 0, "
                          f"i64 0, i32 {corr})")
            acc = [[line(s, f"extractvalue {tt} {res}, {r * nvec + j}") for j in range(used)] for r in range(rows)]
            emit_vector_epilogue(em, s, vepi, acc, vw, tail, batch, m0, n0)
            if looped:
                em.close_loop()
        sc.lines.append(f"  br label %R{e}.done")
    sc.lines.append(f"R{e}.done:")


def _epilogue(em: KernelEmitter, node: UOp, batch: list[str], n0: str, lanes: int, valid: str, few: str) -> None:
    """The kernel's STORE over every row and this lane tile's columns, while its C block is in cache.
    Two copies: full lane tiles get a constant trip count (straight vector code), the last the general loop."""
    epilogue, *batch_ranges, m_range, n_range = node.src[4:]
    sc = em.stack[-1]
    e = em.fresh_label()
    sc.lines.append(f"  br i1 {few}, label %E{e}.edge, label %E{e}.full")
    for tag, width in (("full", str(lanes)), ("edge", valid)):
        sc.lines.append(f"E{e}.{tag}:")
        n1 = em.emit_line(sc, f"add nuw nsw i64 {n0}, {width}")
        em.emit_over_tile(epilogue, list(zip(batch_ranges, batch, strict=True)), (m_range, "0", str(node.arg.m)),
                          (n_range, n0, n1))
        sc.lines.append(f"  br label %E{e}.done")
    sc.lines.append(f"E{e}.done:")
