"""Ops whose output shape depends on the data: NonZero, Compress, Unique, NonMaxSuppression.

When the data that decides the shape is known at compile time the result folds (Compress's kept
positions become a constant GATHER). NonZero and Compress also take it at run time: the output is
sized at its bound (every element, or the whole axis, selected), the kernel compacts the selected
positions (an exclusive prefix count of the mask, a scatter of each position to its rank; O(n^2)
like CumSum) and writes the count as a computed dim; Unique likewise, ranking rows pairwise.
NonMaxSuppression still needs its inputs fixed (NeedsConstant, `--input-value`).
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, is_constant
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.runtime_dims import bounded_output, count_before, dense_strides, earlier
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GatherArg, Ops, ScatterArg
from svodc.ir.uop import UOp

_I64 = dtypes.int64


def compact(mask: UOp) -> tuple[UOp, UOp]:
    """(positions [n], count): positions[j] is the index of the j-th true element of mask [n] for
    j < count (the rest are 0)."""
    n = T.numel(mask)
    m = mask.cast(_I64)
    rank = count_before(m)
    slot = T.alu(Ops.WHERE, mask, rank, T.const(n, _I64, (n,)))  # unselected: one spare slot past the end
    pos = UOp(Ops.SCATTER, _I64, (T.const(0, _I64, (n + 1,)), slot, weight(np.arange(n, dtype=np.int64))),
              ScatterArg(0))
    return T.shrink(pos, [(0, n)]), T.reduce(m, Ops.ADD, [0], keepdims=False)


@onnx_op("NonZero", 9, 13)
def non_zero(ctx: NodeContext) -> UOp:
    if not is_constant(ctx.input(0)) and T.numel(ctx.input(0)):
        x = ctx.input(0)
        n = T.numel(x)
        flat = T.reshape(x, (n,))
        pos, count = compact(T.alu(Ops.CMPNE, flat, T.scalar_like(flat, 0)))
        coords = [T.alu(Ops.MOD, T.alu(Ops.IDIV, pos, T.const(st, _I64)), T.const(d, _I64))
                  for st, d in zip(dense_strides(x.shape), x.shape, strict=True)]
        out = T.concat([T.reshape(c, (1, n)) for c in coords], 0) if coords else T.const(0, _I64, (0, n))
        return bounded_output(ctx, out, [x.ndim, (count, 0, n)], None, 0)
    x = ctx.const_input(0, "the input (its number of non-zeros is the output's shape)")
    return weight(np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1))


@onnx_op("Compress", 9, 11, 28)
def compress(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = T.reshape(x, (T.numel(x),)), 0
    axis = T.norm_axis(axis, x.ndim)
    if not is_constant(ctx.input(1)) and x.shape[axis]:
        n, c = x.shape[axis], T.reshape(ctx.input(1), (T.numel(ctx.input(1)),)).cast(dtypes.bool)
        c = T.shrink(c, [(0, n)]) if T.numel(c) >= n else T.pad(c, [(0, n - T.numel(c))], False)
        pos, count = compact(c)
        dims = [(count, 0, n) if a == axis else d for a, d in enumerate(x.shape)]
        return bounded_output(ctx, gather_axis(x, pos, axis), dims, None, 1)
    cond = np.asarray(ctx.const_input(1, "condition (it decides the output's shape)")).reshape(-1).astype(bool)
    keep = np.nonzero(cond[:x.shape[axis]])[0].astype(np.int64)
    if keep.size == 0:
        return T.const(0, x.dtype, x.shape[:axis] + (0,) + x.shape[axis + 1:])
    return gather_axis(x, weight(keep), axis)


def _rows(x: UOp, axis: int | None) -> tuple[UOp, list[int]]:
    """x as rows [n, m] (the slices along `axis`, or each element), and the order that moved axis first."""
    if axis is None:
        return T.reshape(x, (T.numel(x), 1)), []
    order = [axis] + [a for a in range(x.ndim) if a != axis]
    xt = T.permute(x, order)
    return T.reshape(xt, (x.shape[axis], T.numel(x) // max(x.shape[axis], 1))), order


def unique_at_run_time(ctx: NodeContext, x: UOp, axis: int | None) -> list[UOp]:
    """Rows compared pairwise (O(n^2 m^2) for n rows of m elements): a row is kept at its first
    occurrence; its rank is the number of kept rows before it in sorted (lexicographic) order, or in
    first-occurrence order when sorted=0."""
    rows, order = _rows(x, axis)
    n, m = rows.shape
    a = T.expand(T.reshape(rows, (n, 1, m)), (n, n, m))  # [i, j, k] = row i
    b = T.expand(T.reshape(rows, (1, n, m)), (n, n, m))  # [i, j, k] = row j
    same_k = T.alu(Ops.CMPEQ, a, b)
    diff = T.alu(Ops.CMPEQ, same_k, T.const(False, dtypes.bool)).cast(_I64)
    same = T.alu(Ops.CMPEQ, T.reduce(diff, Ops.ADD, [2], keepdims=False), T.const(0, _I64))  # [i, j]
    diffs_before = T.reduce(T.alu(Ops.WHERE, earlier(m), T.reshape(diff, (n, n, 1, m)), T.const(0, _I64)),
                            Ops.ADD, [3], keepdims=False)  # [i, j, k]: components l < k that differ
    first_diff = T.alu(Ops.CMPEQ, diffs_before, T.const(0, _I64))
    below = T.alu(Ops.AND, first_diff, T.alu(Ops.CMPLT, b, a))  # row j < row i, decided at component k
    j_less = T.alu(Ops.CMPLT, T.const(0, _I64), T.reduce(below.cast(_I64), Ops.ADD, [2], keepdims=False))
    seen = T.reduce(T.alu(Ops.AND, same, earlier(n)).cast(_I64), Ops.ADD, [1], keepdims=False)
    kept = T.alu(Ops.CMPEQ, seen, T.const(0, _I64))  # [n]: first occurrence
    kept_j = T.expand(T.reshape(kept, (1, n)), (n, n))
    before = j_less if ctx.attr("sorted", 1) else earlier(n)
    rank = T.reduce(T.alu(Ops.AND, kept_j, before).cast(_I64), Ops.ADD, [1], keepdims=False)  # [n]
    first = T.reduce(T.alu(Ops.WHERE, same, T.reshape(weight(np.arange(n, dtype=np.int64)), (1, n)),
                           T.const(n, _I64, (n, n))), Ops.MIN, [1], keepdims=False)  # first occurrence of row i
    inverse = UOp(Ops.GATHER, _I64, (rank, first), GatherArg(0))
    slot = T.alu(Ops.WHERE, kept, rank, T.const(n, _I64, (n,)))  # dropped rows: a spare slot past the end

    def scatter(values: UOp) -> UOp:  # values [n, w] to their ranks
        w = values.shape[1]
        target = T.const(0, values.dtype, (n + 1, w))
        upd = UOp(Ops.SCATTER, values.dtype, (target, T.expand(T.reshape(slot, (n, 1)), (n, w)), values),
                  ScatterArg(0))
        return T.shrink(upd, [(0, n), (0, w)])

    count = T.reduce(kept.cast(_I64), Ops.ADD, [0], keepdims=False)
    y = scatter(rows)
    if axis is not None:  # rows back to slices, the axis where it was
        moved = T.reshape(y, (n,) + tuple(x.shape[a] for a in order[1:]))
        y = T.permute(moved, [order.index(a) for a in range(x.ndim)])
    else:
        y = T.reshape(y, (n,))
    idx = T.reshape(scatter(T.reshape(weight(np.arange(n, dtype=np.int64)), (n, 1))), (n,))
    counts = T.reshape(scatter(T.reshape(T.reduce(same.cast(_I64), Ops.ADD, [1], keepdims=False), (n, 1))), (n,))
    y_dims = [(count, 0, n)] if axis is None else [(count, 0, n) if a == axis else d for a, d in enumerate(x.shape)]
    return [bounded_output(ctx, y, y_dims, None, 0), bounded_output(ctx, idx, [(count, 0, n)], None, 0, 1),
            inverse, bounded_output(ctx, counts, [(count, 0, n)], None, 0, 3)]


@onnx_op("Unique", 11, 28)
def unique(ctx: NodeContext) -> list[UOp]:
    if not is_constant(ctx.input(0)) and T.numel(ctx.input(0)):
        ax = ctx.attr("axis")
        return unique_at_run_time(ctx, ctx.input(0), None if ax is None else T.norm_axis(int(ax), ctx.input(0).ndim))
    x = ctx.const_input(0, "the input (its number of distinct values is the output's shape)")
    axis = ctx.attr("axis")
    if axis is None:
        y, idx, inv, counts = np.unique(x, True, True, True)
    else:
        y, idx, inv, counts = np.unique(x, True, True, True, axis=int(axis))
    if not ctx.attr("sorted", 1):  # first-occurrence order (the ONNX reference's construction)
        order = np.argsort(idx)
        rank = np.empty_like(order)
        rank[order] = np.arange(len(order))
        idx, counts = idx[order], counts[order]
        y = np.take(x, idx, axis=0 if axis is None else int(axis))
        inv = rank[inv.reshape(-1)]
    if y.size == 0 and x.size:
        raise Unsupported("Unique produced no values")
    as_i64 = [np.asarray(a, dtype=np.int64).reshape(-1) for a in (idx, inv, counts)]
    return [weight(np.ascontiguousarray(y)), *(weight(a) for a in as_i64)]


@onnx_op("NonMaxSuppression", 10, 11)
def non_max_suppression(ctx: NodeContext) -> UOp:
    """The number of selected boxes depends on the boxes and scores, so every input must be known at
    compile time; the selection is then computed now by the onnx package's reference implementation."""
    from onnx.reference import ReferenceEvaluator

    names = list(ctx.node.input)
    feeds = {n: ctx.const_input(i, f"input {n!r} (the selected boxes decide the output's shape)")
             for i, n in enumerate(names) if n}
    (selected,) = ReferenceEvaluator(ctx.node).run(None, feeds)
    return weight(np.asarray(selected, dtype=np.int64).reshape(-1, 3))
