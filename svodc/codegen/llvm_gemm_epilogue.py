"""A GEMM's epilogue applied to the accumulators in registers (codegen/llvm_gemm.py, llvm_gemm_int8.py).

The epilogue is the STORE that lowering (passes/lower_gemm.py) puts after the product: the value at
(batch, m, n), reading the product back from C. Where lanes run along n and every part of that value
that depends on n is a float op, an int32 add / sub / mul / max / min, a cast between float32, int32,
uint8 and int8, a round, a contiguous load along n, or the product itself, the tile's accumulators go
through it as vectors before the one store: C is written once, never read back (an integer GEMM's
requantization: acc + bias, to float, times the factor, round, plus the zero point, saturated to 8 bits).
What does not depend on n (a bias or BatchNormalization scale per row, index arithmetic) is the
scalar emitter's (llvm_ir.py), computed once per row and broadcast.

Anything else (an op with no vector form here, a load strided along n, a transposed GEMM whose lanes
run along m) keeps the general path: the tile is stored, then the epilogue STORE runs over it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from svodc.codegen.llvm_alu import emit_cast
from svodc.codegen.llvm_types import const, ltype
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort

if TYPE_CHECKING:
    from svodc.codegen.llvm_ir import KernelEmitter, Scope

_BIN = {Ops.ADD: "fadd", Ops.SUB: "fsub", Ops.MUL: "fmul", Ops.DIV: "fdiv"}
_CMP = {Ops.CMPLT: "olt", Ops.CMPEQ: "oeq", Ops.CMPNE: "une"}
_FLOAT_OPS = {*_BIN, Ops.NEG, Ops.RECIP, Ops.SQRT, Ops.ABS, Ops.MULACC, Ops.MAX, Ops.MIN, Ops.WHERE, Ops.ROUND, *_CMP}
_INT_BIN = {Ops.ADD: "add", Ops.SUB: "sub", Ops.MUL: "mul"}
_INT_OPS = {*_INT_BIN, Ops.MAX, Ops.MIN, Ops.WHERE}
# the element types with a vector form: float math (float64: a requantization not proven exact in float32,
# frontend/ops/rescale_exact.py), int32 accumulators, 8-bit (re)quantized values
_FLOAT_TYPES = (dtypes.float32, dtypes.float64)
_VECTOR_TYPES = (*_FLOAT_TYPES, dtypes.int32, dtypes.uint8, dtypes.int8)
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
    """An n-dependent node the vector epilogue emits: a load contiguous along n, a float32 op, an int32
    op, or a cast, of the element types with a vector form."""
    if x.op is Ops.LOAD:
        return x.dtype in _VECTOR_TYPES and x.src[0].op is Ops.PARAM and lane_coefficient(x.src[1], n, free) == 1
    if x.op in _CMP:
        return x.src[0].dtype in _FLOAT_TYPES
    if x.op is Ops.CAST:
        return x.dtype in _VECTOR_TYPES and x.src[0].dtype in _VECTOR_TYPES
    if x.dtype is dtypes.int32:
        return x.op in _INT_OPS
    return x.op in _FLOAT_OPS and x.dtype in (*_FLOAT_TYPES, dtypes.bool)


@dataclass(frozen=True)
class VectorEpilogue:
    store: UOp
    c_param: UOp
    batch_ranges: tuple[UOp, ...]
    m_range: UOp
    n_range: UOp
    c_index: UOp  # where the epilogue reads C's element (m, n)


def vector_epilogue(store: UOp, c_param: UOp, ranges: tuple[UOp, ...], free: dict[UOp, frozenset[UOp]],
                    c_index: UOp | None = None) -> VectorEpilogue | None:
    """The epilogue as a VectorEpilogue when its n-dependent part has a vector form, else None.
    c_index: the index at which the epilogue reads C's element (m, n) (default: the store's index)."""
    *batch, m, n = ranges
    buf, idx, value = store.src
    if (c_index is None and buf is not c_param) or value.dtype not in _VECTOR_TYPES \
            or lane_coefficient(idx, n, free) != 1:
        return None
    c_index = idx if c_index is None else c_index
    ops = 0
    for x in toposort([value]):
        if x.op is Ops.LOAD and x.src[0] is c_param and x.src[1] is not c_index:
            return None  # C read anywhere but the element being written
        if n not in free[x] or x.dtype.kind == "index":
            continue  # scalar: computed once per row (or an address)
        ops += 1
        if not _has_vector_form(x, n, free):
            return None
    return VectorEpilogue(store, c_param, tuple(batch), m, n, c_index) if ops <= MAX_VECTOR_OPS else None


def emit_vector_epilogue(em: KernelEmitter, sc: Scope, epi: VectorEpilogue, acc: list[list[str]], vw: int,
                         tail: int, batch: list[str], m0: str, n0: str) -> None:
    """Emit, into `sc`, the epilogue on a tile's accumulators acc[row][vector] (the last vector's first
    `tail` lanes valid) and the stores of its values; m0, n0: the tile's first row and lane."""
    line = em.emit_line
    et, align = ltype(epi.store.src[2].dtype), epi.store.src[2].dtype.itemsize
    vt, mt = f"<{vw} x {et}>", f"<{vw} x i1>"
    mask = "<" + ", ".join(f"i1 {'true' if lane < tail else 'false'}" for lane in range(vw)) + ">"
    em.uses_intrinsics.add(f"declare void @llvm.masked.store.v{vw}{_suffix(et)}.p0({vt}, ptr, i32, {mt})")
    for r, v in zip(epi.batch_ranges, batch, strict=True):
        em.bind_range(r, v)
    for i, row in enumerate(acc):
        em.bind_range(epi.m_range, line(sc, f"add nuw nsw i64 {m0}, {i}"))
        for j, a in enumerate(row):
            masked = j == len(row) - 1 and tail < vw
            em.bind_range(epi.n_range, line(em.stack[-1], f"add nuw nsw i64 {n0}, {j * vw}"))
            out = _vector_value(em, epi, a, vw, mask if masked else None)
            scope = em.stack[-1]
            p = line(scope, f"getelementptr inbounds {et}, ptr {em.value(epi.store.src[0])}, "
                            f"i64 {em.value(epi.store.src[1])}", "ptr")
            if masked and tail == 1:
                # One lane: its element stored alone. LLVM (llvmlite 0.50) widened the one-lane masked store of
                # a saturating u8 truncation to a 4-byte vmovd on AVX-512, writing the next row's first 3
                # bytes and past the buffer (QLinearConv 64 -> 64 over 33 columns, tests/test_int8_gemm.py).
                e = line(scope, f"extractelement {vt} {out}, i64 0")
                scope.lines.append(f"  store {et} {e}, ptr {p}, align {align}")
            elif masked:
                scope.lines.append(f"  call void @llvm.masked.store.v{vw}{_suffix(et)}.p0({vt} {out}, ptr {p}, "
                                   f"i32 {align}, {mt} {mask})")
            else:
                scope.lines.append(f"  store {vt} {out}, ptr {p}, align {align}")
            em.close_loop()
        em.close_loop()
    for _ in epi.batch_ranges:
        em.close_loop()


def _suffix(t: str) -> str:
    return {"float": "f32", "double": "f64"}.get(t, t)


def _splat(em: KernelEmitter, scope: Scope, t: str, x: str, vw: int) -> str:
    ins = em.emit_line(scope, f"insertelement <{vw} x {t}> poison, {t} {x}, i64 0")
    return em.emit_line(scope, f"shufflevector <{vw} x {t}> {ins}, <{vw} x {t}> poison, <{vw} x i32> zeroinitializer")


def _vector_value(em: KernelEmitter, epi: VectorEpilogue, acc: str, vw: int, mask: str | None) -> str:
    """The epilogue's value at the bound (m, n .. n + vw) as a vector (sources before users, no recursion)."""
    scope = em.stack[-1]
    line = em.emit_line
    bt = f"<{vw} x i1>"
    n = epi.n_range
    vals: dict[UOp, str] = {}

    def vty(x: UOp) -> str:
        return f"<{vw} x {ltype(x.dtype)}>"

    def vector(s: UOp) -> str:
        """A source's vector: emitted before (n-dependent), or a row's scalar broadcast."""
        if s not in vals:
            t = ltype(s.dtype)
            vals[s] = (f"splat ({t} {const(s.dtype, s.arg)})" if s.op is Ops.CONST
                       else _splat(em, scope, t, em.value(s), vw))
        return vals[s]

    for x in toposort([epi.store.src[2]]):
        if n not in em.free[x] or x.dtype.kind == "index":
            continue  # scalar: broadcast where an n-dependent op uses it (vector), or an address
        v = [] if x.op is Ops.LOAD else [vector(s) for s in x.src]
        vt = vty(x)
        if x.op is Ops.LOAD:
            if x.src[0] is epi.c_param and x.src[1] is epi.c_index:
                vals[x] = acc
                continue
            et, align = ltype(x.dtype), x.dtype.itemsize
            fn = f"llvm.masked.load.v{vw}{_suffix(et)}.p0"
            em.uses_intrinsics.add(f"declare {vt} @{fn}(ptr, i32, {bt}, {vt})")
            p = line(scope, f"getelementptr inbounds {et}, ptr {em.value(x.src[0])}, i64 {em.value(x.src[1])}", "ptr")
            vals[x] = (line(scope, f"call {vt} @{fn}(ptr {p}, i32 {align}, {bt} {mask}, {vt} zeroinitializer)")
                       if mask else line(scope, f"load {vt}, ptr {p}, align {align}"))
        elif x.op is Ops.CAST:
            vals[x] = emit_cast(em, scope, x.src[0].dtype, x.dtype, v[0], vw)
        elif x.op is Ops.WHERE:
            vals[x] = line(scope, f"select {bt} {v[0]}, {vt} {v[1]}, {vt} {v[2]}")
        elif x.dtype is dtypes.int32:
            if x.op in _INT_BIN:
                vals[x] = line(scope, f"{_INT_BIN[x.op]} {vt} {v[0]}, {v[1]}")
            else:  # MAX / MIN
                fn = f"llvm.s{x.op.name.lower()}.v{vw}i32"
                em.uses_intrinsics.add(f"declare {vt} @{fn}({vt}, {vt})")
                vals[x] = line(scope, f"call {vt} @{fn}({vt} {v[0]}, {vt} {v[1]})")
        elif x.op in _BIN:
            vals[x] = line(scope, f"{_BIN[x.op]} {vt} {v[0]}, {v[1]}")
        elif x.op in _CMP:
            ft = vty(x.src[0])
            vals[x] = line(scope, f"fcmp {_CMP[x.op]} {ft} {v[0]}, {v[1]}")
        elif x.op is Ops.NEG:
            vals[x] = line(scope, f"fneg {vt} {v[0]}")
        elif x.op is Ops.RECIP:
            vals[x] = line(scope, f"fdiv {vt} splat ({ltype(x.dtype)} 1.0), {v[0]}")
        elif x.op in (Ops.SQRT, Ops.ABS, Ops.MULACC, Ops.ROUND):
            name = {Ops.SQRT: "sqrt", Ops.ABS: "fabs", Ops.MULACC: "fmuladd", Ops.ROUND: "roundeven"}[x.op]
            fn = f"llvm.{name}.v{vw}{_suffix(ltype(x.dtype))}"
            em.uses_intrinsics.add(f"declare {vt} @{fn}({', '.join([vt] * len(x.src))})")
            vals[x] = line(scope, f"call {vt} @{fn}({', '.join(f'{vt} {s}' for s in v)})")
        else:  # MAX / MIN: NaN-propagating, as llvm_alu.float_minmax
            better = line(scope, f"fcmp {'ogt' if x.op is Ops.MAX else 'olt'} {vt} {v[0]}, {v[1]}")
            nan = line(scope, f"fcmp uno {vt} {v[0]}, {v[0]}")
            vals[x] = line(scope, f"select {bt} {line(scope, f'or {bt} {better}, {nan}')}, {vt} {v[0]}, {vt} {v[1]}")
    return vals[epi.store.src[2]]
