"""Reductions (ReduceSum ... ReduceLogSumExp), Softmax, LogSoftmax and Hardmax."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.reduce_runtime import reduce_at_run_time, runtime_axes
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp


def unary(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def reduce_axes(ctx: NodeContext, x: UOp, axes_input_since: int) -> list[int]:
    """The axes to reduce: attribute before `axes_input_since`, optional input 1 after; none given
    means all axes, unless noop_with_empty_axes (then none: the op is the identity)."""
    if ctx.version >= axes_input_since:
        # run-time axes of length 0 are known to be empty (their shape says so)
        a = None if runtime_axes(ctx) is not None else ctx.optional_const_input(1, "axes")
        axes = None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]
    else:
        axes = ctx.ints("axes")
    if not axes:
        return [] if ctx.attr("noop_with_empty_axes", 0) else list(range(x.ndim))
    return sorted({T.norm_axis(a, x.ndim) for a in axes})


# A reduction over the node's axes with an associative op, its result kept at size 1 on those axes (or,
# for run-time axes, broadcast back over them: reduce_runtime.py), and the number of elements reduced.
Reducer = Callable[[UOp, Ops], UOp]


def reduce_kind(kind: str, x: UOp, red: Reducer, count: Callable[[], UOp]) -> UOp:
    """Reduce{kind} of x as prologue, associative reduction, epilogue (keepdims layout)."""
    if kind in ("Sum", "Max", "Min", "Prod"):
        return red(x, {"Sum": Ops.ADD, "Max": Ops.MAX, "Min": Ops.MIN, "Prod": Ops.MUL}[kind])
    if kind == "Mean":
        return T.alu(Ops.DIV, red(x, Ops.ADD), count())
    if kind == "L1":
        return red(unary(Ops.ABS, x), Ops.ADD)
    if kind in ("L2", "SumSquare"):
        sq = red(T.alu(Ops.MUL, x, x), Ops.ADD)
        if kind == "SumSquare":
            return sq
        return unary(Ops.SQRT, sq) if x.dtype.is_float else unary(Ops.SQRT, sq.cast(dtypes.float64)).cast(x.dtype)
    if kind == "LogSum":
        return unary(Ops.LOG, red(x, Ops.ADD))
    if kind == "LogSumExp":
        if not x.dtype.is_float:
            return unary(Ops.LOG, red(unary(Ops.EXP, x), Ops.ADD))
        # log(sum(exp(x))) with the maximum taken out first, so large inputs do not overflow; an all -inf
        # (or empty) slice shifts by 0 instead of -inf, so exp sees -inf, not NaN
        m = red(x, Ops.MAX)
        finite_m = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, m, T.scalar_like(m, -math.inf)), T.scalar_like(m, 0), m)
        total = red(unary(Ops.EXP, T.alu(Ops.SUB, x, finite_m)), Ops.ADD)
        return T.alu(Ops.ADD, unary(Ops.LOG, total), finite_m)
    raise AssertionError(kind)


def _reduce_handler(kind: str, axes_input_since: int):
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        if kind in ("Mean", "LogSum", "LogSumExp", "L2") and x.dtype is dtypes.bool:
            raise Unsupported(f"Reduce{kind} of bool is not defined")
        if ctx.version >= axes_input_since and (ax := runtime_axes(ctx)) is not None and T.numel(ax):
            return reduce_at_run_time(ctx, x, kind, reduce_kind)
        axes = reduce_axes(ctx, x, axes_input_since)
        if not axes:
            return x
        count = math.prod(x.shape[a] for a in axes)
        out = reduce_kind(kind, x, lambda t, op: T.reduce(t, op, axes), lambda: T.const(count or math.nan, x.dtype))
        return out if ctx.attr("keepdims", 1) else T.reshape(out, tuple(s for i, s in enumerate(x.shape)
                                                                          if i not in axes))
    return handler


onnx_op("ReduceSum", 1, 11, 13)(_reduce_handler("Sum", 13))
for _kind, _versions in (("Mean", (1, 11, 13, 18)), ("Max", (1, 11, 12, 13, 18, 20)),
                         ("Min", (1, 11, 12, 13, 18, 20)), ("Prod", (1, 11, 13, 18)), ("L1", (1, 11, 13, 18)),
                         ("L2", (1, 11, 13, 18)), ("SumSquare", (1, 11, 13, 18)), ("LogSum", (1, 11, 13, 18, 28)),
                         ("LogSumExp", (1, 11, 13, 18, 28))):
    onnx_op(f"Reduce{_kind}", *_versions)(_reduce_handler(_kind, 18))


def softmax_along(x: UOp, axis: int, log: bool = False) -> UOp:
    """exp(x - max) / sum(exp(x - max)), or its log, along one axis (max subtracted for range)."""
    shifted = T.alu(Ops.SUB, x, T.reduce(x, Ops.MAX, [axis]))
    e = unary(Ops.EXP, shifted)
    total = T.reduce(e, Ops.ADD, [axis])
    if log:
        return T.alu(Ops.SUB, shifted, unary(Ops.LOG, total))
    return T.alu(Ops.DIV, e, total)


def iota(shape: tuple[int, ...], axis: int, dtype=dtypes.int64) -> UOp:
    """The index along `axis`, broadcast to `shape` (a small weight viewed through EXPAND)."""
    n = shape[axis]
    w = UOp(Ops.WEIGHT, dtype, (), ConstData(np.arange(n, dtype=dtype.np)))
    return T.expand(T.reshape(w, tuple(n if i == axis else 1 for i in range(len(shape)))), shape)


def hardmax_along(x: UOp, axis: int) -> UOp:
    """1 at the first maximum along axis, 0 elsewhere."""
    idx = iota(x.shape, axis)
    at_max = T.alu(Ops.CMPEQ, x, T.reduce(x, Ops.MAX, [axis]))
    first = T.reduce(T.alu(Ops.WHERE, at_max, idx, T.scalar_like(idx, x.shape[axis])), Ops.MIN, [axis])
    return T.alu(Ops.CMPEQ, idx, first).cast(x.dtype)


def _softmax_family(kind: str):
    def along(x: UOp, axis: int) -> UOp:
        return hardmax_along(x, axis) if kind == "Hardmax" else softmax_along(x, axis, kind == "LogSoftmax")

    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        if not x.dtype.is_float:
            raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
        if x.ndim == 0:
            return along(T.reshape(x, (1,)), 0).reshape(())
        if ctx.version >= 13:
            return along(x, T.norm_axis(ctx.attr("axis", -1), x.ndim))
        # Before opset 13 the input is viewed as 2-D [prod(shape[:axis]), prod(shape[axis:])].
        axis = T.norm_axis(ctx.attr("axis", 1), x.ndim)
        if axis == x.ndim - 1 and any(ctx.bounded(x)):  # the same, without merging the bounded axes
            return along(x, axis)
        flat = T.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        return T.reshape(along(flat, 1), x.shape)
    return handler


onnx_op("Softmax", 1, 11, 13)(_softmax_family("Softmax"))
onnx_op("LogSoftmax", 1, 11, 13)(_softmax_family("LogSoftmax"))
onnx_op("Hardmax", 1, 11, 13)(_softmax_family("Hardmax"))
