"""Elementwise ONNX ops: arithmetic, activations, comparisons, logic, casts."""

from __future__ import annotations

import functools

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def _legacy_broadcast(ctx: NodeContext, a: UOp, b: UOp) -> tuple[UOp, UOp]:
    """Opset < 7 binary ops broadcast only with broadcast=1, aligning B at `axis` of A."""
    if ctx.version >= 7 or not ctx.attr("broadcast", 0):
        if ctx.version < 7 and a.shape != b.shape:
            raise Unsupported(f"shapes {a.shape} and {b.shape} differ and broadcast=0")
        return a, b
    axis = ctx.attr("axis")
    if axis is None:
        return a, b  # suffix alignment: numpy rules give the same result
    axis = T.norm_axis(axis, a.ndim)
    shape = (1,) * axis + b.shape + (1,) * (a.ndim - axis - b.ndim)
    return a, T.reshape(b, shape)


def _binary(op: Ops):
    def handler(ctx: NodeContext) -> UOp:
        a, b = _legacy_broadcast(ctx, ctx.input(0), ctx.input(1))
        if a.dtype != b.dtype:
            raise Unsupported(f"inputs have different element types {a.dtype.name} and {b.dtype.name}")
        return T.alu(op, a, b)
    return handler


for _name, _op in (("Add", Ops.ADD), ("Sub", Ops.SUB), ("Mul", Ops.MUL), ("Div", Ops.DIV)):
    onnx_op(_name, 1, 6, 7, 13, 14)(_binary(_op))


def _variadic(op: Ops, mean: bool = False):
    def handler(ctx: NodeContext) -> UOp:
        xs = [x for x in ctx.inputs if x is not None]
        if ctx.version < 8 and len({x.shape for x in xs}) > 1:
            raise Unsupported("inputs must have equal shapes before opset 8")
        out = functools.reduce(lambda a, b: T.alu(op, a, b), xs)
        return T.alu(Ops.DIV, out, T.const(len(xs), out.dtype)) if mean else out
    return handler


onnx_op("Sum", 1, 6, 8, 13)(_variadic(Ops.ADD))
onnx_op("Mean", 1, 6, 8, 13)(_variadic(Ops.ADD, mean=True))
onnx_op("Max", 1, 6, 8, 12, 13)(_variadic(Ops.MAX))
onnx_op("Min", 1, 6, 8, 12, 13)(_variadic(Ops.MIN))


def _unary(op: Ops, float_only: bool = True):
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        if float_only and not x.dtype.is_float:
            raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
        return UOp(op, x.dtype, (x,))
    return handler


onnx_op("Neg", 1, 6, 13)(_unary(Ops.NEG, float_only=False))
onnx_op("Abs", 1, 6, 13)(_unary(Ops.ABS, float_only=False))
onnx_op("Sqrt", 1, 6, 13)(_unary(Ops.SQRT))
onnx_op("Exp", 1, 6, 13)(_unary(Ops.EXP))
onnx_op("Log", 1, 6, 13)(_unary(Ops.LOG))
onnx_op("Reciprocal", 1, 6, 13)(_unary(Ops.RECIP))
onnx_op("Tanh", 1, 6, 13)(_unary(Ops.TANH))
onnx_op("Erf", 9, 13)(_unary(Ops.ERF))
onnx_op("Floor", 1, 6, 13)(_unary(Ops.FLOOR))


@onnx_op("Relu", 1, 6, 13, 14)
def relu(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    return T.alu(Ops.MAX, x, T.scalar_like(x, 0))


@onnx_op("Sigmoid", 1, 6, 13)
def sigmoid(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    one = T.scalar_like(x, 1)
    return T.alu(Ops.RECIP, T.alu(Ops.ADD, one, UOp(Ops.EXP, x.dtype, (UOp(Ops.NEG, x.dtype, (x,)),))))


@onnx_op("LeakyRelu", 1, 6, 16)
def leaky_relu(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    alpha = T.scalar_like(x, ctx.attr("alpha", 0.01))
    return T.alu(Ops.WHERE, T.alu(Ops.CMPLT, x, T.scalar_like(x, 0)), T.alu(Ops.MUL, x, alpha), x)


@onnx_op("Clip", 1, 6, 11, 12, 13)
def clip(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
    else:
        lo_a, hi_a = ctx.optional_const_input(1, "min"), ctx.optional_const_input(2, "max")
        lo = None if lo_a is None else lo_a.item()
        hi = None if hi_a is None else hi_a.item()
    if lo is not None:
        x = T.alu(Ops.MAX, x, T.scalar_like(x, lo))
    if hi is not None:
        x = T.alu(Ops.MIN, x, T.scalar_like(x, hi))
    return x


@onnx_op("Pow", 1, 7, 12, 13, 15)
def pow_(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if b.dtype != a.dtype:
        b = b.cast(a.dtype)
    return T.alu(Ops.POW, a, b)


def _compare(op: Ops, swap: bool = False, negate: bool = False):
    def handler(ctx: NodeContext) -> UOp:
        a, b = ctx.input(0), ctx.input(1)
        if swap:
            a, b = b, a
        out = T.alu(op, a, b)
        return UOp(Ops.NOT, dtypes.bool, (out,)) if negate else out
    return handler


onnx_op("Equal", 1, 7, 11, 13, 19)(_compare(Ops.CMPEQ))
onnx_op("Less", 1, 7, 9, 13)(_compare(Ops.CMPLT))
onnx_op("Greater", 1, 7, 9, 13)(_compare(Ops.CMPLT, swap=True))
onnx_op("LessOrEqual", 12, 16)(_compare(Ops.CMPLT, swap=True, negate=True))
onnx_op("GreaterOrEqual", 12, 16)(_compare(Ops.CMPLT, negate=True))


@onnx_op("Not", 1)
def not_(ctx: NodeContext) -> UOp:
    return UOp(Ops.NOT, dtypes.bool, (ctx.input(0),))


for _name, _op in (("And", Ops.AND), ("Or", Ops.OR), ("Xor", Ops.XOR)):
    onnx_op(_name, 1, 7)(_binary(_op))


@onnx_op("Where", 9, 16)
def where(ctx: NodeContext) -> UOp:
    return T.alu(Ops.WHERE, ctx.input(0), ctx.input(1), ctx.input(2))


@onnx_op("Identity", 1, 13, 14, 16, 19, 21)
def identity(ctx: NodeContext) -> UOp:
    return ctx.input(0)


@onnx_op("Dropout", 1, 6, 7, 10, 12, 13, 22)
def dropout(ctx: NodeContext) -> list[UOp | None]:
    """Inference: the identity (whatever is_test says before opset 7: a compiled model only infers).
    The mask output, if used, is all true."""
    if ctx.version >= 12:
        training = ctx.optional_const_input(2, "training_mode")
        if training is not None and bool(training):
            raise Unsupported("training_mode=true is not supported")
    x = ctx.input(0)
    mask = T.const(True, dtypes.bool, x.shape) if ctx.output_used(1) else None
    return [x, mask]


onnx_op("Sin", 7, 22)(_unary(Ops.SIN))
