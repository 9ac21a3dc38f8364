"""A GEMM's epilogue applied to the accumulators in registers (codegen/llvm_gemm.py).

The epilogue is the STORE that lowering (passes/lower_gemm.py) puts after the product: the value at
(batch, m, n), reading the product back from C. Where lanes run along n and every part of that value
that depends on n is a float op, a contiguous load along n, or the product itself, the tile's
accumulators go through it as vectors before the one store: C is written once, never read back.
What does not depend on n (a bias or BatchNormalization scale per row, index arithmetic) is the
scalar emitter's (llvm_ir.py), computed once per row and broadcast.

Anything else (an op with no vector form here, a load strided along n, a transposed GEMM whose lanes
run along m) keeps the general path: the tile is stored, then the epilogue STORE runs over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from svodc.codegen.llvm_types import const
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope

_BIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.DIV: "fdiv"}
_CMP = {Ops.CMPLT: "olt", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}
_FLOAT_OPS = {*_BIN, Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.ABS, Ops.MULACC, Ops.MAX, Ops.MIN, Ops.WHERE, *_CMP}
MAX_VECTOR_OPS = 48  # n-dependent ops per epilogue: each tile shape gets rows x vectors copies of them


def lane_coefficient(idx: UOp, n: UOp, free: dict[UOp, frozenset[UOp]]) -> int | None:
    """d idx / d n where idx is affine in the range n (ADD, SUB, MUL by a constant), else None;
    free: each node's ranges (KernelEmitter.free)."""
    if idx is n:
        return 1
    if n not in free[idx]:
        return 0
    if idx.op in (Ops.ADD, Ops.SUB):
        a, b = (lane_coefficient(s, n, free) for s in idx.src)
        if a is None or b is None:
            return None
        return a + b if idx.op is Ops.ADD else a - b
    if idx.op is Ops.MUL:
        for x, y in (idx.src, reversed(idx.src)):
            if y.op is Ops.CONST:
                c = lane_coefficient(x, n, free)
                return None if c is None else c * int(y.arg)
    return None


def _has_vector_form(x: UOp, n: UOp, free: dict[UOp, frozenset[UOp]]) -> bool:
    """An n-dependent node the vector epilogue emits: a float32 load contiguous along n, or a float op."""
    if x.op is Ops.LOAD:
        return x.dtype is dtypes.float32 and x.src[0].op is Ops.PARAM and lane_coefficient(x.src[1], n, free) == 1
    if x.op in _CMP:
        return x.src[0].dtype is dtypes.float32
    return x.op in _FLOAT_OPS and x.dtype in (dtypes.float32, dtypes.bool)


@dataclass(frozen=True)
class VectorEpilogue:
    store: UOp
    c_param: UOp
    batch_ranges: tuple[UOp, ...]
    m_range: UOp
    n_range: UOp


def vector_epilogue(store: UOp, c_param: UOp, ranges: tuple[UOp, ...], free: dict[UOp, frozenset[UOp]]
                    ) -> VectorEpilogue | None:
    """The epilogue as a VectorEpilogue when its n-dependent part has a vector form, else None."""
    *batch, m, n = ranges
    buf, idx, value = store.src
    if buf is not c_param or value.dtype is not dtypes.float32 or lane_coefficient(idx, n, free) != 1:
        return None
    ops = 0
    for x in toposort([value]):
        if x.op is Ops.LOAD and x.src[0] is c_param and x.src[1] is not idx:
            return None  # C read anywhere but the element being written
        if n not in free[x] or x.dtype.kind == "index":
            continue  # scalar: computed once per row (or an address)
        ops += 1
        if not _has_vector_form(x, n, free):
            return None
    return VectorEpilogue(store, c_param, tuple(batch), m, n) if ops <= MAX_VECTOR_OPS else None


def emit_vector_epilogue(em: KernelEmitter, sc: Scope, epi: VectorEpilogue, acc: list[list[str]], vw: int,
                         tail: int, batch: list[str], m0: str, n0: str) -> None:
    """Emit, into `sc`, the epilogue on a tile's accumulators acc[row][vector] (the last vector's first
    `tail` lanes valid) and the stores of its values; m0, n0: the tile's first row and lane."""
    vt, mt = f"<{vw} x float>", f"<{vw} x i1>"
    line = em.emit_line
    mask = "<" + ", ".join(f"i1 {'true' if lane < tail else 'false'}" for lane in range(vw)) + ">"
    em.uses_intrinsics.add(f"declare {vt} @llvm.masked.load.v{vw}f32.p0(ptr, i32, {mt}, {vt})")
    em.uses_intrinsics.add(f"declare void @llvm.masked.store.v{vw}f32.p0({vt}, ptr, i32, {mt})")
    for r, v in zip(epi.batch_ranges, batch, strict=True):
        em.bind_range(r, v)
    for i, row in enumerate(acc):
        em.bind_range(epi.m_range, line(sc, f"add nuw nsw i64 {m0}, {i}"))
        for j, a in enumerate(row):
            masked = j == len(row) - 1 and tail < vw
            em.bind_range(epi.n_range, line(em.stack[-1], f"add nuw nsw i64 {n0}, {j * vw}"))
            out = _vector_value(em, epi, a, vw, mask if masked else None)
            scope = em.stack[-1]
            p = line(scope, f"getelementptr inbounds float, ptr {em.value(epi.c_param)}, "
                            f"i64 {em.value(epi.store.src[1])}", "ptr")
            if masked:
                scope.lines.append(f"  call void @llvm.masked.store.v{vw}f32.p0({vt} {out}, ptr {p}, i32 4, "
                                   f"{mt} {mask})")
            else:
                scope.lines.append(f"  store {vt} {out}, ptr {p}, align 4")
            em.close_loop()
        em.close_loop()
    for _ in epi.batch_ranges:
        em.close_loop()


def _splat(em: KernelEmitter, scope: Scope, t: str, x: str, vw: int) -> str:
    ins = em.emit_line(scope, f"insertelement <{vw} x {t}> poison, {t} {x}, i64 0")
    return em.emit_line(scope, f"shufflevector <{vw} x {t}> {ins}, <{vw} x {t}> poison, <{vw} x i32> zeroinitializer")


def _vector_value(em: KernelEmitter, epi: VectorEpilogue, acc: str, vw: int, mask: str | None) -> str:
    """The epilogue's value at the bound (m, n .. n + vw) as a vector (sources before users, no recursion)."""
    scope = em.stack[-1]
    line = em.emit_line
    vt, bt = f"<{vw} x float>", f"<{vw} x i1>"
    n, idx = epi.n_range, epi.store.src[1]
    vals: dict[UOp, str] = {}

    def vector(s: UOp) -> str:
        """A source's vector: emitted before (n-dependent), or a row's scalar (float or bool) broadcast."""
        if s not in vals:
            t = "float" if s.dtype is dtypes.float32 else "i1"
            vals[s] = ("<" + ", ".join([f"{t} {const(s.dtype, s.arg)}"] * vw) + ">" if s.op is Ops.CONST
                       else _splat(em, scope, t, em.value(s), vw))
        return vals[s]

    for x in toposort([epi.store.src[2]]):
        if n not in em.free[x] or x.dtype.kind == "index":
            continue  # scalar: broadcast where an n-dependent op uses it (vector), or an address
        v = [] if x.op is Ops.LOAD else [vector(s) for s in x.src]  # float ops take floats and bools only
        if x.op is Ops.LOAD:
            if x.src[0] is epi.c_param and x.src[1] is idx:
                vals[x] = acc
                continue
            p = line(scope, f"getelementptr inbounds float, ptr {em.value(x.src[0])}, i64 {em.value(x.src[1])}", "ptr")
            vals[x] = (line(scope, f"call {vt} @llvm.masked.load.v{vw}f32.p0(ptr {p}, i32 4, {bt} {mask}, "
                                   f"{vt} zeroinitializer)") if mask else line(scope, f"load {vt}, ptr {p}, align 4"))
        elif x.op in _BIN:
            vals[x] = line(scope, f"{_BIN[x.op]} {vt} {v[0]}, {v[1]}")
        elif x.op in _CMP:
            vals[x] = line(scope, f"fcmp {_CMP[x.op]} {vt} {v[0]}, {v[1]}")
        elif x.op is Ops.WHERE:
            t = vt if x.dtype is dtypes.float32 else bt
            vals[x] = line(scope, f"select {bt} {v[0]}, {t} {v[1]}, {t} {v[2]}")
        elif x.op is Ops.NEG:
            vals[x] = line(scope, f"fneg {vt} {v[0]}")
        elif x.op is Ops.RECIP:
            vals[x] = line(scope, f"fdiv {vt} {_splat(em, scope, 'float', const(x.dtype, 1.0), vw)}, {v[0]}")
        elif x.op in (Ops.SQRT, Ops.ABS, Ops.MULACC):
            name = {Ops.SQRT: "sqrt", Ops.ABS: "fabs", Ops.MULACC: "fmuladd"}[x.op]
            args = ", ".join([vt] * len(x.src))
            em.uses_intrinsics.add(f"declare {vt} @llvm.{name}.v{vw}f32({args})")
            vals[x] = line(scope, f"call {vt} @llvm.{name}.v{vw}f32({', '.join(f'{vt} {s}' for s in v)})")
        else:  # MAX / MIN: NaN-propagating, as llvm_alu.float_minmax
            better = line(scope, f"fcmp {'ogt' if x.op is Ops.MAX else 'olt'} {vt} {v[0]}, {v[1]}")
            nan = line(scope, f"fcmp uno {vt} {v[0]}, {v[0]}")
            vals[x] = line(scope, f"select {bt} {line(scope, f'or {bt} {better}, {nan}')}, {vt} {v[0]}, {vt} {v[1]}")
    return vals[epi.store.src[2]]
