"""Reductions and softmax."""

from __future__ import annotations

import math

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def softmax_along(x: UOp, axis: int, log: bool = False) -> UOp:
    """exp(x - max) / sum(exp(x - max)), or its log, along one axis (max subtracted for range)."""
    shifted = T.alu(Ops.SUB, x, T.reduce(x, Ops.MAX, [axis]))
    e = UOp(Ops.EXP, x.dtype, (shifted,))
    total = T.reduce(e, Ops.ADD, [axis])
    if log:
        return T.alu(Ops.SUB, shifted, UOp(Ops.LOG, x.dtype, (total,)))
    return T.alu(Ops.DIV, e, total)


def _softmax(log: bool):
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        if not x.dtype.is_float:
            raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
        if ctx.version >= 13:
            return softmax_along(x, T.norm_axis(ctx.attr("axis", -1), x.ndim), log)
        # Before opset 13 the input is viewed as 2-D [prod(shape[:axis]), prod(shape[axis:])].
        axis = T.norm_axis(ctx.attr("axis", 1), x.ndim) if x.ndim else 0
        flat = T.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        return T.reshape(softmax_along(flat, 1, log), x.shape)
    return handler


onnx_op("Softmax", 1, 11, 13)(_softmax(log=False))
onnx_op("LogSoftmax", 1, 11, 13)(_softmax(log=True))
