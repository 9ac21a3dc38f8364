"""Elementwise ONNX ops: arithmetic, activations, comparisons, logic, casts."""

from __future__ import annotations

import functools
import math

import numpy as np

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
for _name, _op, _versions in (
        ("Sqrt", Ops.SQRT, (1, 6, 13)), ("Exp", Ops.EXP, (1, 6, 13)), ("Log", Ops.LOG, (1, 6, 13)),
        ("Reciprocal", Ops.RECIP, (1, 6, 13)), ("Tanh", Ops.TANH, (1, 6, 13)), ("Erf", Ops.ERF, (9, 13)),
        ("Floor", Ops.FLOOR, (1, 6, 13)), ("Round", Ops.ROUND, (11, 22)), ("Sin", Ops.SIN, (7, 22)),
        ("Cos", Ops.COS, (7, 22)), ("Tan", Ops.TAN, (7, 22)), ("Asin", Ops.ASIN, (7, 22)),
        ("Acos", Ops.ACOS, (7, 22)), ("Atan", Ops.ATAN, (7, 22)), ("Sinh", Ops.SINH, (9, 22)),
        ("Cosh", Ops.COSH, (9, 22)), ("Asinh", Ops.ASINH, (9, 22)), ("Acosh", Ops.ACOSH, (9, 22)),
        ("Atanh", Ops.ATANH, (9, 22))):
    onnx_op(_name, *_versions)(_unary(_op))


@onnx_op("Ceil", 1, 6, 13)
def ceil(ctx: NodeContext) -> UOp:
    x = _unary(Ops.NEG)(ctx)
    return UOp(Ops.NEG, x.dtype, (UOp(Ops.FLOOR, x.dtype, (x,)),))


@onnx_op("Sign", 9, 13)
def sign(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    zero = T.scalar_like(x, 0)
    out = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, zero, x), T.scalar_like(x, 1),
                T.alu(Ops.WHERE, T.alu(Ops.CMPLT, x, zero), T.scalar_like(x, -1), zero))
    return T.alu(Ops.WHERE, T.alu(Ops.CMPNE, x, x), x, out) if x.dtype.is_float else out


@onnx_op("IsNaN", 9, 13, 20)
def isnan(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    return T.alu(Ops.CMPNE, x, x)


@onnx_op("IsInf", 10, 20)
def isinf(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    pos = T.alu(Ops.CMPEQ, x, T.scalar_like(x, math.inf))
    neg = T.alu(Ops.CMPEQ, x, T.scalar_like(x, -math.inf))
    detect_pos, detect_neg = ctx.attr("detect_positive", 1), ctx.attr("detect_negative", 1)
    if detect_pos and detect_neg:
        return T.alu(Ops.OR, pos, neg)
    return pos if detect_pos else neg if detect_neg else T.const(False, dtypes.bool, x.shape)


def _negative(a: UOp) -> UOp:
    """a < 0, counting -0.0 (whose reciprocal is -inf)."""
    zero = T.scalar_like(a, 0)
    return T.alu(Ops.OR, T.alu(Ops.CMPLT, a, zero), T.alu(Ops.CMPLT, UOp(Ops.RECIP, a.dtype, (a,)), zero))


def float_fmod(a: UOp, b: UOp) -> UOp:
    """C fmod: a - trunc(a/b)*b with the sign of a, computed on magnitudes and corrected into [0, |b|)
    when a/b rounded across an integer; x fmod inf = x; inf fmod y, x fmod 0 and NaN give NaN."""
    a, b = T.broadcast(a, b)
    fa, fb = UOp(Ops.ABS, a.dtype, (a,)), UOp(Ops.ABS, b.dtype, (b,))
    q = UOp(Ops.TRUNC, a.dtype, (T.alu(Ops.DIV, fa, fb),))
    r = T.alu(Ops.SUB, fa, T.alu(Ops.MUL, q, fb))
    r = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, r, T.scalar_like(r, 0)), T.alu(Ops.ADD, r, fb), r)
    r = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, r, fb), r, T.alu(Ops.SUB, r, fb))
    finite_a = T.alu(Ops.CMPLT, fa, T.scalar_like(fa, math.inf))
    r = T.alu(Ops.WHERE, T.alu(Ops.AND, T.alu(Ops.CMPEQ, fb, T.scalar_like(fb, math.inf)), finite_a), fa, r)
    return T.alu(Ops.WHERE, _negative(a), UOp(Ops.NEG, r.dtype, (r,)), r)


def float_floor_mod(a: UOp, b: UOp) -> UOp:
    """numpy/Python %: the sign of b (a zero result too), e.g. -3 % inf = inf."""
    r = float_fmod(a, b)
    a, b = T.broadcast(a, b)
    zero = T.scalar_like(r, 0)
    fix = T.alu(Ops.AND, T.alu(Ops.CMPNE, r, zero), T.alu(Ops.CMPNE, _negative(r), _negative(b)))
    r = T.alu(Ops.WHERE, fix, T.alu(Ops.ADD, r, b), r)
    signed_zero = T.alu(Ops.WHERE, _negative(b), T.scalar_like(r, -0.0), zero)
    return T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, r, zero), signed_zero, r)


@onnx_op("Mod", 10, 13, 28)
def mod(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if ctx.attr("fmod", 0):  # C fmod: the sign of the dividend
        if a.dtype.is_float:
            return float_fmod(a, b)
        return T.alu(Ops.SUB, a, T.alu(Ops.MUL, T.alu(Ops.DIV, a, b), b))
    if a.dtype.is_float:
        return float_floor_mod(a, b)
    return T.alu(Ops.MOD, a, b)  # the sign of the divisor, as Python's %


@onnx_op("BitShift", 11, 28)
def bitshift(ctx: NodeContext) -> UOp:
    direction = ctx.attr("direction")
    if direction not in ("LEFT", "RIGHT"):
        raise Unsupported(f"direction={direction!r} is not LEFT or RIGHT")
    return T.alu(Ops.SHL if direction == "LEFT" else Ops.SHR, ctx.input(0), ctx.input(1))


@onnx_op("BitwiseNot", 18)
def bitwise_not(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    return UOp(Ops.NOT, x.dtype, (x,))


for _name, _op in (("BitwiseAnd", Ops.AND), ("BitwiseOr", Ops.OR), ("BitwiseXor", Ops.XOR)):
    onnx_op(_name, 18)(_binary(_op))


@onnx_op("Clip", 1, 6, 11, 12, 13)
def clip(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version < 11:
        lo, hi = ctx.attr("min"), ctx.attr("max")
        lo = None if lo is None else T.scalar_like(x, lo)
        hi = None if hi is None else T.scalar_like(x, hi)
    else:  # scalar tensors, possibly computed at run time; max is applied last (min > max gives max)
        lo, hi = ctx.optional_input(1), ctx.optional_input(2)
    if lo is not None:
        x = T.alu(Ops.MAX, x, lo.cast(x.dtype))
    if hi is not None:
        x = T.alu(Ops.MIN, x, hi.cast(x.dtype))
    return x


@onnx_op("Pow", 1, 7, 12, 13, 15)
def pow_(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if not a.dtype.is_float:
        return int_pow(a, b)
    if b.dtype != a.dtype:
        b = b.cast(a.dtype)
    return T.alu(Ops.POW, a, b)


def int_pow(a: UOp, b: UOp) -> UOp:
    """a ** b for an integer base, exactly (wrapping like numpy), by square-and-multiply over the bits
    of b (a float exponent is truncated). b < 0 gives 0 unless |a| = 1; b >= 64 is taken as 63 + (b%2):
    for |a| >= 2 every bit of such a power has already wrapped out of a 64-bit result."""
    e = b.cast(dtypes.int64)
    e = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, T.scalar_like(e, 63), e),
              T.alu(Ops.ADD, T.scalar_like(e, 62), T.alu(Ops.AND, e, T.scalar_like(e, 1))), e)
    result, base = T.scalar_like(a, 1), a
    result, base = T.broadcast(result, base)
    result, e = T.broadcast(result, e)
    base = T.broadcast_to(base, result.shape)
    for bit in range(6):
        on = T.alu(Ops.CMPNE, T.alu(Ops.AND, e, T.scalar_like(e, 1 << bit)), T.scalar_like(e, 0))
        result = T.alu(Ops.WHERE, on, T.alu(Ops.MUL, result, base), result)
        base = T.alu(Ops.MUL, base, base)
    negative = T.alu(Ops.CMPLT, e, T.scalar_like(e, 0))
    one = T.alu(Ops.CMPEQ, a, T.scalar_like(a, 1))
    minus_one = T.alu(Ops.CMPEQ, a, T.scalar_like(a, -1)) if a.dtype.kind == "int" else one
    odd = T.alu(Ops.CMPNE, T.alu(Ops.AND, e, T.scalar_like(e, 1)), T.scalar_like(e, 0))
    inverse = T.alu(Ops.WHERE, one, T.scalar_like(a, 1),
                    T.alu(Ops.WHERE, minus_one, T.alu(Ops.WHERE, odd, T.scalar_like(a, -1), T.scalar_like(a, 1)),
                          T.scalar_like(a, 0)))
    return T.alu(Ops.WHERE, negative, T.broadcast_to(inverse, result.shape), result)


def _compare(op: Ops, swap: bool = False, negate: bool = False):
    def handler(ctx: NodeContext) -> UOp:
        a, b = ctx.input(0), ctx.input(1)
        if swap:
            a, b = b, a
        out = T.alu(op, a, b)
        return UOp(Ops.NOT, dtypes.bool, (out,)) if negate else out
    return handler


onnx_op("Equal", 1, 7, 11, 13, 19, strings=True)(_compare(Ops.CMPEQ))
onnx_op("Less", 1, 7, 9, 13)(_compare(Ops.CMPLT))
onnx_op("Greater", 1, 7, 9, 13)(_compare(Ops.CMPLT, swap=True))
onnx_op("LessOrEqual", 12, 16)(_compare(Ops.CMPLT, swap=True, negate=True))
onnx_op("GreaterOrEqual", 12, 16)(_compare(Ops.CMPLT, negate=True))


@onnx_op("Not", 1)
def not_(ctx: NodeContext) -> UOp:
    return UOp(Ops.NOT, dtypes.bool, (ctx.input(0),))


for _name, _op in (("And", Ops.AND), ("Or", Ops.OR), ("Xor", Ops.XOR)):
    onnx_op(_name, 1, 7)(_binary(_op))


@onnx_op("Where", 9, 16, strings=True)
def where(ctx: NodeContext) -> UOp:
    return T.alu(Ops.WHERE, ctx.input(0), ctx.input(1), ctx.input(2))


@onnx_op("Identity", 1, 13, 14, 16, 19, 21, 23, 24, 25, strings=True)
def identity(ctx: NodeContext):
    return ctx.value(0)  # tensors, sequences and optionals alike


@onnx_op("Dropout", 1, 6, 7, 10, 12, 13, 22)
def dropout(ctx: NodeContext) -> list[UOp | None]:
    """Inference: the identity (whatever is_test says before opset 7: a compiled model only infers).
    The mask output, if used, is all true. Training mode with ratio 0 is the identity too; with a
    ratio > 0 it draws random numbers, which a compiled model does not do."""
    if ctx.version >= 12:
        training = ctx.optional_const_input(2, "training_mode")
        if training is not None and bool(np.asarray(training).reshape(-1)[0]):
            ratio = ctx.optional_const_input(1, "ratio")
            if ratio is None or float(np.asarray(ratio).reshape(-1)[0]) != 0.0:
                raise Unsupported("training_mode=true with ratio > 0 (random dropout) is not supported")
    x = ctx.input(0)
    mask = T.const(True, dtypes.bool, x.shape) if ctx.output_used(1) else None
    return [x, mask]

