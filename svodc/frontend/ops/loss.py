"""Losses: NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

The value at the target class is picked with a compare-and-sum over the class axis (exact: one term
is the value, the others add zeros), so run-time targets need no gather, and a target outside
[0, C) -- an ignore_index, say -- picks nothing. Weights are looked up the same way, with the target
clipped into range as the reference does; ignored positions weigh 0, and the mean divides by the
sum of the weights.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.activations import in_float32
from svodc.frontend.ops.reduction import softmax_along
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

I64 = dtypes.int64


def _pick(table: UOp, classes: UOp, target: UOp) -> UOp:
    """sum over axis 1 of where(class == target, table, 0): table [N or 1, C, ...], target [N, 1, ...]."""
    hit = T.alu(Ops.CMPEQ, classes, target)
    picked = T.alu(Ops.WHERE, hit, table, T.const(0.0, table.dtype, ()))
    return T.reduce(picked, Ops.ADD, [1], keepdims=False)


def nll(ctx: NodeContext, logp: UOp, target: UOp, weight: UOp | None) -> UOp:
    """The loss of log-probabilities logp [N, C, d...] against integer targets [N, d...]."""
    if logp.ndim < 2 or target.shape != (logp.shape[0], *logp.shape[2:]):
        raise Unsupported(f"input {logp.shape} and target {target.shape} do not fit [N, C, d...] / [N, d...]")
    reduction = ctx.attr("reduction", "mean")
    if reduction not in ("none", "sum", "mean"):
        raise Unsupported(f"reduction={reduction!r} is not none, sum or mean")
    ignore = ctx.attr("ignore_index")
    n_classes = logp.shape[1]
    t = T.reshape(target.cast(I64), (target.shape[0], 1, *target.shape[1:]))
    classes = T.reshape(UOp(Ops.WEIGHT, I64, (), ConstData(np.arange(n_classes, dtype=np.int64))),
                        (1, n_classes) + (1,) * (logp.ndim - 2))
    loss = T.alu(Ops.NEG, _pick(logp, classes, t))
    kept = None if ignore is None else T.alu(Ops.CMPNE, target.cast(I64), T.const(int(ignore), I64, ()))
    w = None
    if weight is not None:
        clipped = T.alu(Ops.MIN, T.alu(Ops.MAX, t, T.scalar_like(t, 0)), T.scalar_like(t, n_classes - 1))
        w = _pick(T.reshape(weight.cast(logp.dtype), (1, n_classes) + (1,) * (logp.ndim - 2)), classes, clipped)
        if kept is not None:
            w = T.alu(Ops.WHERE, kept, w, T.scalar_like(w, 0.0))
    elif kept is not None:
        w = T.alu(Ops.WHERE, kept, T.const(1.0, logp.dtype, kept.shape), T.const(0.0, logp.dtype, kept.shape))
    if w is not None:
        loss = T.alu(Ops.MUL, loss, w)
    axes = list(range(loss.ndim))
    if reduction == "none":
        return loss
    total = T.reduce(loss, Ops.ADD, axes, keepdims=False)
    if reduction == "sum":
        return total
    if w is not None:
        return T.alu(Ops.DIV, total, T.reduce(w, Ops.ADD, axes, keepdims=False))
    return T.alu(Ops.DIV, total, T.const(float(math.prod(loss.shape)) or math.nan, total.dtype, ()))


@onnx_op("NegativeLogLikelihoodLoss", 12, 13, 22)
def negative_log_likelihood_loss(ctx: NodeContext) -> UOp:
    x, target, weight = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if not x.dtype.is_float:
        raise Unsupported(f"NegativeLogLikelihoodLoss of {x.dtype.name} is not supported")
    extra = [weight] if weight is not None else []
    return in_float32(lambda x, *w: nll(ctx, x, target, w[0] if w else None))(x, *extra)


@onnx_op("SoftmaxCrossEntropyLoss", 12, 13)
def softmax_cross_entropy_loss(ctx: NodeContext) -> list[UOp | None]:
    x, target, weight = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if not x.dtype.is_float or x.ndim < 2:
        raise Unsupported(f"SoftmaxCrossEntropyLoss needs float scores [N, C, ...], got {x.dtype.name}{list(x.shape)}")
    extra = [weight] if weight is not None else []
    logp = in_float32(lambda x: softmax_along(x, 1, log=True))(x)
    loss = in_float32(lambda lp, *w: nll(ctx, lp, target, w[0] if w else None))(logp, *extra)
    return [loss, logp if ctx.output_used(1) else None]
