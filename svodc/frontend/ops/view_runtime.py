"""Views whose geometry is a run-time input: Reshape's shape, Squeeze/Unsqueeze's axes, Slice's starts,
ends, axes and steps, Split's sizes. Each output dim is bounded by construction (by the input's dims
or element count), so the output is a strided read of the input at that bound (runtime_dims) with
computed dims; the values are checked as ONNX requires (an invalid one fails the run, naming the
input, instead of answering). Pads, which can grow a dim without limit, are in pad_runtime.py.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.runtime_dims import (
    DimValue,
    bounded_output,
    count_before,
    dense_strides,
    drop_named_axes,
    element,
    named_axes,
    strided_read,
    weight,
)
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

_I64 = dtypes.int64
# The largest output bound (elements) a run-time Reshape may plan: every dim is bounded only by the
# element count, so the bound is numel ** rank.
MAX_RESHAPE_BOUND = 1 << 22


def _c(v: int) -> UOp:
    return T.const(v, _I64)


def _all(conds: list[UOp]) -> UOp:
    out = T.const(True, dtypes.bool)
    for c in conds:
        out = T.alu(Ops.AND, out, c)
    return out


def _lt(a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.CMPLT, a, b)


def _where(c: UOp, a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.WHERE, c, a, b)


def squeeze_at_run_time(ctx: NodeContext, x: UOp, axes: UOp) -> UOp:
    r, k = x.ndim, T.numel(axes)
    if k > r:
        raise Unsupported(f"{k} axes to squeeze for rank {r}")
    m, valid = named_axes(axes, r)
    ones = [T.alu(Ops.OR, T.alu(Ops.CMPEQ, T.reshape(T.shrink(m, [(a, a + 1)]), ()), T.const(False, dtypes.bool)),
                  T.const(d == 1, dtypes.bool)) for a, d in enumerate(x.shape)]  # a named axis has size 1
    out, dims = drop_named_axes(x, m, k, x.shape)
    return bounded_output(ctx, out, dims, _all([valid, *ones]), 1)


def unsqueeze_at_run_time(ctx: NodeContext, x: UOp, axes: UOp) -> UOp:
    """Output axis j is 1 where named, else input axis j - (named axes before j)."""
    r, k = x.ndim, T.numel(axes)
    rank = r + k
    m, valid = named_axes(axes, rank)
    if r == 0:
        return bounded_output(ctx, T.reshape(x, (1,) * k), [1] * k, valid, 1)
    named = m.cast(_I64)
    before = count_before(named)
    src = T.alu(Ops.SUB, T.reshape(weight(np.arange(rank, dtype=np.int64)), (rank,)), before)  # [rank]
    hit = T.alu(Ops.CMPEQ, T.reshape(src, (rank, 1)), T.reshape(weight(np.arange(r, dtype=np.int64)), (1, r)))
    sel = T.alu(Ops.MUL, hit.cast(_I64), T.reshape(T.alu(Ops.SUB, _c(1), named), (rank, 1)))  # [rank, r]

    def pick(per_axis: list[int]) -> UOp:
        vec = T.reshape(weight(np.asarray(per_axis, dtype=np.int64)), (1, r))
        return T.reduce(T.alu(Ops.MUL, sel, vec), Ops.ADD, [1], keepdims=False)

    stride, size = pick(dense_strides(x.shape)), pick(list(x.shape))
    bound, lo, dims = [], [], []
    for j in range(rank):
        cand = [x.shape[i] for i in range(max(0, j - k), min(r, j + 1))]  # the input axes j may show
        bound.append(max([1, *cand]))
        lo.append(min([1, *cand]))
    out = strided_read(x, tuple(bound), [element(stride, j) for j in range(rank)])
    for j in range(rank):
        dims.append((_where(T.reshape(T.shrink(m, [(j, j + 1)]), ()), _c(1), element(size, j)), lo[j], bound[j]))
    return bounded_output(ctx, out, dims, valid, 1)


def _per_axis(x: UOp, v: UOp | None, axes: UOp | None, default: int, count: int, first: int = 0) -> list[UOp]:
    """v[first:first+count] (a vector over `axes`, or over the first `count` axes) as one scalar per
    axis of x, `default` for the axes it does not name (or all of them when v is None)."""
    out = []
    for a in range(x.ndim):
        got = _c(default)
        for j in range(count if v is not None else 0):
            hit = T.alu(Ops.OR, T.alu(Ops.CMPEQ, element(axes, j), _c(a)),
                        T.alu(Ops.CMPEQ, element(axes, j), _c(a - x.ndim))) if axes is not None \
                else T.const(j == a, dtypes.bool)
            got = _where(hit, element(v, first + j), got)
        out.append(got)
    return out


def slice_at_run_time(ctx: NodeContext, x: UOp) -> UOp:
    """ONNX Slice clamping per axis, in index arithmetic: a positive step counts from the clamped
    start up to the clamped end, a negative one down (start clamped to n-1, end to -1)."""
    count = T.numel(ctx.input(1))
    axes = ctx.optional_input(3)
    if T.numel(ctx.input(2)) != count or (axes is not None and T.numel(axes) != count):
        raise Unsupported("starts, ends and axes must have one length")
    checks = []
    if axes is not None:
        checks.append(named_axes(axes, x.ndim)[1])
    starts, ends = _per_axis(x, ctx.input(1), axes, 0, count), _per_axis(x, ctx.input(2), axes, 2**62, count)
    steps = _per_axis(x, ctx.optional_input(4), axes, 1, count)
    xs = dense_strides(x.shape)
    offset, strides, dims = _c(0), [], []
    for a, n in enumerate(x.shape):
        st, s, e = steps[a], starts[a], ends[a]
        checks.append(T.alu(Ops.CMPNE, st, _c(0)))
        pos = _lt(_c(0), st)

        def clamp(v: UOp, lo: int, hi: int, n: int = n) -> UOp:
            v = T.alu(Ops.MIN, T.alu(Ops.MAX, v, _c(-n - 1)), _c(n))  # no overflow past here
            v = _where(_lt(v, _c(0)), T.alu(Ops.ADD, v, _c(n)), v)
            return T.alu(Ops.MIN, T.alu(Ops.MAX, v, _c(lo)), _c(hi))

        s = _where(pos, clamp(s, 0, n), clamp(s, 0, n - 1))
        e = _where(pos, clamp(e, 0, n), clamp(e, -1, n - 1))
        span = _where(pos, T.alu(Ops.SUB, e, s), T.alu(Ops.SUB, s, e))
        mag = T.alu(Ops.MAX, _where(pos, st, T.alu(Ops.NEG, st)), _c(1))
        size = T.alu(Ops.MAX, T.alu(Ops.DIV, T.alu(Ops.ADD, span, T.alu(Ops.SUB, mag, _c(1))), mag), _c(0))
        offset = T.alu(Ops.ADD, offset, _where(_lt(_c(0), size), T.alu(Ops.MUL, s, _c(xs[a])), _c(0)))
        strides.append(T.alu(Ops.MUL, st, _c(xs[a])))
        dims.append((size, 0, n))
    out = strided_read(x, x.shape, strides, offset)
    return bounded_output(ctx, out, dims, _all(checks), 1)


def split_at_run_time(ctx: NodeContext, x: UOp, axis: int) -> list[UOp]:
    sizes, n, outs = ctx.input(1), x.shape[axis], ctx.num_outputs
    if T.numel(sizes) != outs:
        raise Unsupported(f"split has {T.numel(sizes)} sizes for {outs} outputs")
    xs, parts, start = dense_strides(x.shape), [], _c(0)
    total = T.reduce(T.reshape(sizes, (outs,)).cast(_I64), Ops.ADD, [0], keepdims=False)
    checks = [T.alu(Ops.CMPEQ, total, _c(n))] + [_lt(_c(-1), element(sizes, i)) for i in range(outs)]
    for i in range(outs):
        size = element(sizes, i)
        out = strided_read(x, x.shape, xs, T.alu(Ops.MUL, start, _c(xs[axis])))
        dims: list[DimValue] = [(size, 0, n) if a == axis else d for a, d in enumerate(x.shape)]
        parts.append(bounded_output(ctx, out, dims, _all(checks), 1, i))
        start = T.alu(Ops.ADD, start, size)
    return parts


def reshape_at_run_time(ctx: NodeContext, x: UOp, allowzero: bool) -> UOp:
    """Each dim: shape[j], or the input's dim j for 0 (unless allowzero), or the rest of the element
    count for one -1; every dim is at most the element count, the product must be the count."""
    shape, numel = ctx.input(1), T.numel(x)
    k = T.numel(shape)
    hi = max(numel, 1)
    if hi ** k > MAX_RESHAPE_BOUND or (allowzero and numel == 0):
        # the bound is too large to plan, or there is none (an empty input with allowzero takes any
        # dims beside a 0): its value must be fixed
        ctx.const_input(1, "shape")
    vals = [element(shape, j) for j in range(k)]
    resolved = []
    for j, v in enumerate(vals):
        copy = x.shape[j] if j < x.ndim else -2  # -2: no such input dim (an invalid 0)
        resolved.append(v if allowzero else _where(T.alu(Ops.CMPEQ, v, _c(0)), _c(copy), v))
    minus = [T.alu(Ops.CMPEQ, v, _c(-1)) for v in resolved]
    known = _c(1)
    for v, mi in zip(resolved, minus, strict=True):
        known = T.alu(Ops.MUL, known, _where(mi, _c(1), v))
    inferred = T.alu(Ops.DIV, _c(numel), T.alu(Ops.MAX, known, _c(1)))
    dims_v = [_where(mi, inferred, v) for v, mi in zip(resolved, minus, strict=True)]
    product = _c(1)
    for d in dims_v:
        product = T.alu(Ops.MUL, product, d)
    n_minus = _c(0)
    for mi in minus:
        n_minus = T.alu(Ops.ADD, n_minus, mi.cast(_I64))
    checks = [T.alu(Ops.CMPEQ, product, _c(numel)), _lt(n_minus, _c(2))] + [_lt(_c(-1), d) for d in dims_v]
    strides = []
    for j in range(k):  # the dense strides of the real shape
        st = _c(1)
        for d in dims_v[j + 1:]:
            st = T.alu(Ops.MUL, st, d)
        strides.append(st)
    bound = (hi,) * k
    out = strided_read(x, bound, strides)
    return bounded_output(ctx, out, [(d, 0, hi) for d in dims_v], _all(checks), 1)

