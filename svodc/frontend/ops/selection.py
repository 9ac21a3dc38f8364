"""Ops whose output shape depends on the data: NonZero, Compress, Unique.

A static compiler can only compile them when the data that decides the shape is known at compile
time: NonZero and Unique need their input, Compress its condition (the data itself may be a run-time
value: the kept positions become a constant GATHER). Otherwise they report the inputs to fix
(NeedsConstant, `--input-value`).
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.uop import UOp


@onnx_op("NonZero", 9, 13)
def non_zero(ctx: NodeContext) -> UOp:
    x = ctx.const_input(0, "the input (its number of non-zeros is the output's shape)")
    return weight(np.array(np.nonzero(x), dtype=np.int64).reshape(x.ndim, -1))


@onnx_op("Compress", 9, 11, 28)
def compress(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    cond = np.asarray(ctx.const_input(1, "condition (it decides the output's shape)")).reshape(-1).astype(bool)
    axis = ctx.attr("axis")
    if axis is None:
        x, axis = T.reshape(x, (T.numel(x),)), 0
    axis = T.norm_axis(axis, x.ndim)
    keep = np.nonzero(cond[:x.shape[axis]])[0].astype(np.int64)
    if keep.size == 0:
        return T.const(0, x.dtype, x.shape[:axis] + (0,) + x.shape[axis + 1:])
    return gather_axis(x, weight(keep), axis)


@onnx_op("Unique", 11, 28)
def unique(ctx: NodeContext) -> list[UOp]:
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
