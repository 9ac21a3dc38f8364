"""Linear algebra: MatMul, Gemm, Einsum, Det."""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp


def matmul(a: UOp, b: UOp) -> UOp:
    """numpy.matmul, also in how emulated floats (float16, bfloat16) multiply: the products are
    summed in float32 and the sum is rounded once."""
    dt = a.dtype
    if dt.emulated and dt.is_float:
        return T.matmul(a.cast(dtypes.float32), b.cast(dtypes.float32)).cast(dt)
    return T.matmul(a, b)


@onnx_op("MatMul", 1, 9, 13)
def matmul_op(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype != b.dtype:
        raise Unsupported(f"MatMul of {a.dtype.name} x {b.dtype.name} is not supported")
    if b.ndim == 2 and a.ndim > 2 and a.dtype.is_float and not any(ctx.bounded(a)[:-1]):
        # One B for every batch: the batch is more rows of one GEMM (issue 13: a PyTorch MHA export's [seq, 1, E]
        # @ W ran as seq GEMMs of one row). Not over a bounded dim: the merged axis would be dim * factor, which
        # the GEMM does not take; not for integer products, whose GEMM finds its 8-bit operands under the zero
        # point's subtraction (ops/quantize.py builds those, not this op).
        rows = matmul(T.reshape(a, (math.prod(a.shape[:-1]), a.shape[-1])), b)
        return T.reshape(rows, (*a.shape[:-1], b.shape[1]))
    return matmul(a, b)


@onnx_op("Gemm", 1, 6, 7, 9, 11, 13)
def gemm(ctx: NodeContext) -> UOp:
    """Y = alpha * A' B' + beta * C"""
    a, b, c = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if a.ndim != 2 or b.ndim != 2:
        raise Unsupported(f"Gemm needs 2-D A and B, got {a.shape} and {b.shape}")
    if ctx.attr("transA", 0):
        a = T.permute(a, (1, 0))
    if ctx.attr("transB", 0):
        b = T.permute(b, (1, 0))
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    y = matmul(a, b)
    if alpha != 1.0:
        y = T.alu(Ops.MUL, y, T.const(alpha, y.dtype))
    if c is not None and beta != 0.0:
        if ctx.version < 7 and not ctx.attr("broadcast", 0) and c.shape != y.shape:
            raise Unsupported(f"C of shape {c.shape} needs broadcast=1 before opset 7")
        if beta != 1.0:
            c = T.alu(Ops.MUL, c, T.const(beta, c.dtype))
        y = T.alu(Ops.ADD, y, c)
    return y


def _einsum_terms(equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's subscripts (ellipsis expanded to upper-case letters) and the output's."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise Unsupported(f"equation {equation!r} names {len(terms)} operands, the node has {len(ranks)}")
    ell = max((r - len(t.replace("...", "")) for t, r in zip(terms, ranks, strict=True) if "..." in t), default=0)
    ell_letters = "".join(chr(ord("A") + i) for i in range(ell))
    out_terms = []
    for t, r in zip(terms, ranks, strict=True):
        if "..." in t:
            n = r - len(t.replace("...", ""))
            t = t.replace("...", ell_letters[ell - n:])
        if len(t) != r or not all(c.isalpha() for c in t):
            raise Unsupported(f"subscripts {t!r} do not fit an operand of rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell_letters)
    else:  # implicit output: the ellipsis, then the letters used once, in alphabetical order
        counts = {c: "".join(out_terms).count(c) for c in "".join(out_terms)}
        out = ell_letters + "".join(sorted(c for c, k in counts.items() if k == 1 and c.islower()))
    return out_terms, out


def _diagonal(x: UOp, term: str) -> tuple[UOp, str]:
    """Take the diagonal over repeated subscripts of one operand ('ii' -> 'i')."""
    while len(set(term)) < len(term):
        c = next(c for c in term if term.count(c) > 1)
        a, b = term.index(c), term.index(c, term.index(c) + 1)
        rest = [i for i in range(x.ndim) if i not in (a, b)]
        x = T.permute(x, [*rest, a, b])
        n = x.shape[-1]
        if x.shape[-2] != n:
            raise Unsupported(f"subscript {c!r} spans axes of sizes {x.shape[-2]} and {n}")
        flat = T.reshape(x, (*x.shape[:-2], n * n))
        x = T.slice_axes(flat, (0,) * (x.ndim - 2) + (0,), (1,) * (x.ndim - 2) + (n + 1,), (*x.shape[:-2], n))
        term = "".join(term[i] for i in rest) + c
    return x, term


@onnx_op("Einsum", 12, 28)
def einsum(ctx: NodeContext) -> UOp:
    """Every operand viewed over all subscripts (broadcast), multiplied, and summed over the
    subscripts the output lacks; float16/bfloat16 multiply and sum in float32."""
    xs = [x for x in ctx.inputs if x is not None]
    terms, out = _einsum_terms(ctx.attr("equation"), [x.ndim for x in xs])
    dt = xs[0].dtype
    wide = dtypes.float32 if dt.emulated and dt.is_float else dt
    letters: list[str] = []
    sizes: dict[str, int] = {}
    views = []
    for x, t in zip(xs, terms, strict=True):
        x, t = _diagonal(x.cast(wide), t)
        for c, d in zip(t, x.shape, strict=True):
            if c not in sizes or sizes[c] == 1:
                sizes[c] = d
            elif d not in (1, sizes[c]):
                raise Unsupported(f"subscript {c!r} has sizes {sizes[c]} and {d}")
            if c not in letters:
                letters.append(c)
        views.append((x, t))
    if any(c not in sizes for c in out):
        raise Unsupported(f"output subscripts {out!r} name a letter no operand has")
    order = [c for c in out] + [c for c in letters if c not in out]
    full = tuple(sizes[c] for c in order)
    prod = None
    for x, t in views:
        x = T.permute(x, sorted(range(len(t)), key=lambda i: order.index(t[i])))
        t = "".join(sorted(t, key=order.index))
        shaped = T.reshape(x, tuple(x.shape[t.index(c)] if c in t else 1 for c in order))
        x = T.expand(shaped, full)
        prod = x if prod is None else T.alu(Ops.MUL, prod, x)
    summed = list(range(len(out), len(order)))
    result = T.reduce(prod, Ops.ADD, summed, keepdims=False) if summed else prod
    return result.cast(dt)


@onnx_op("Det", 11, 22)
def det(ctx: NodeContext) -> UOp:
    """Gaussian elimination with partial pivoting, unrolled over the (compile-time) matrix size;
    det = sign of the row permutation * product of the pivots."""
    a = ctx.input(0)
    if not a.dtype.is_float or a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise Unsupported(f"Det needs float [..., n, n] matrices, got {a.dtype.name}{list(a.shape)}")
    dt = a.dtype
    a = a.cast(dtypes.float64) if dt is not dtypes.float64 else a
    n = a.shape[-1]
    batch = a.shape[:-2]
    rows = T.reshape(UOp(Ops.WEIGHT, dtypes.int64, (), ConstData(np.arange(n, dtype=np.int64))),
                     (1,) * len(batch) + (n, 1))
    sign = T.const(1.0, a.dtype, batch + (1, 1))
    result = T.const(1.0, a.dtype, batch + (1, 1))
    for k in range(n):
        col = T.shrink(a, [(0, d) for d in batch] + [(0, n), (k, k + 1)])  # [..., n, 1]
        mag = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, rows, T.scalar_like(rows, k)), T.scalar_like(col, -1.0),
                    UOp(Ops.ABS, col.dtype, (col,)))
        best = T.reduce(mag, Ops.MAX, [a.ndim - 2])
        first = T.reduce(T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, mag, best), T.expand(rows, mag.shape),
                               T.scalar_like(rows, n)), Ops.MIN, [a.ndim - 2])  # [..., 1, 1]
        is_p, is_k = T.alu(Ops.CMPEQ, rows, first), T.alu(Ops.CMPEQ, rows, T.scalar_like(rows, k))
        row_p = T.reduce(T.alu(Ops.WHERE, is_p, a, T.scalar_like(a, 0.0)), Ops.ADD, [a.ndim - 2])
        row_k = T.shrink(a, [(0, d) for d in batch] + [(k, k + 1), (0, n)])
        a = T.alu(Ops.WHERE, is_k, row_p, T.alu(Ops.WHERE, is_p, row_k, a))  # swap rows k and p
        sign = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, first, T.scalar_like(first, k)), sign, T.alu(Ops.NEG, sign))
        pivot = T.shrink(a, [(0, d) for d in batch] + [(k, k + 1), (k, k + 1)])
        result = T.alu(Ops.MUL, result, pivot)
        zero = T.alu(Ops.CMPEQ, pivot, T.scalar_like(pivot, 0.0))
        safe = T.alu(Ops.WHERE, zero, T.scalar_like(pivot, 1.0), pivot)
        factor = T.alu(Ops.DIV, T.shrink(a, [(0, d) for d in batch] + [(0, n), (k, k + 1)]), safe)
        factor = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, T.scalar_like(rows, k), rows), factor, T.scalar_like(factor, 0.0))
        a = T.alu(Ops.SUB, a, T.alu(Ops.MUL, factor, T.shrink(a, [(0, d) for d in batch] + [(k, k + 1), (0, n)])))
    return T.reshape(T.alu(Ops.MUL, sign, result), batch).cast(dt)
