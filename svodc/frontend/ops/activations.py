"""Activation functions, written as compositions of IR ops.

expm1 and log1p are written here so that small arguments keep their relative precision (exp(x) - 1
loses every digit of a tiny x); the rest follow the ONNX definitions directly.
"""

from __future__ import annotations

import math

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def c(x: UOp, v: float) -> UOp:
    return T.scalar_like(x, v)


def un(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def add(a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.ADD, a, b)


def mul(a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.MUL, a, b)


def where(cond: UOp, a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.WHERE, cond, a, b)


def lt(a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.CMPLT, a, b)


def expm1(x: UOp) -> UOp:
    """exp(x) - 1: a Taylor polynomial for |x| < 0.5 (relative error < 1e-9), exp(x) - 1 beyond."""
    z = c(x, 0.0)
    for k in range(11, 0, -1):  # x (1 + x/2 (1 + x/3 (...)))
        z = mul(mul(x, c(x, 1.0 / k)), add(c(x, 1.0), z)) if k > 1 else mul(x, add(c(x, 1.0), z))
    return where(lt(un(Ops.ABS, x), c(x, 0.5)), z, T.alu(Ops.SUB, un(Ops.EXP, x), c(x, 1.0)))


def log1p(x: UOp) -> UOp:
    """log(1 + x) with Kahan's correction: log(u) * x / (u - 1) for u = 1 + x (exact when u == 1: x)."""
    u = add(c(x, 1.0), x)
    d = T.alu(Ops.SUB, u, c(x, 1.0))
    corrected = T.alu(Ops.DIV, mul(un(Ops.LOG, u), x), d)
    return where(T.alu(Ops.CMPEQ, d, c(x, 0.0)), x, where(T.alu(Ops.CMPEQ, u, c(x, math.inf)), u, corrected))


def sigmoid(x: UOp) -> UOp:
    return un(Ops.RECIP, add(c(x, 1.0), un(Ops.EXP, un(Ops.NEG, x))))


def softplus(x: UOp) -> UOp:
    """log(1 + e^x) = max(x, 0) + log1p(e^-|x|): never overflows."""
    return add(T.alu(Ops.MAX, x, c(x, 0.0)), log1p(un(Ops.EXP, un(Ops.NEG, un(Ops.ABS, x)))))


def elu(x: UOp, alpha: float) -> UOp:
    return where(lt(x, c(x, 0.0)), mul(c(x, alpha), expm1(x)), x)


def _float_input(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if not x.dtype.is_float:
        raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
    return x


def in_float32(fn):
    """Run a composite function of emulated-float tensors (float16, bfloat16...) in float32 and round
    the result once, instead of rounding after every op of the composition."""
    def wrapped(*xs: UOp, **kw) -> UOp:
        dt = xs[0].dtype
        if not (dt.emulated and dt.is_float):
            return fn(*xs, **kw)
        return fn(*(x.cast(dtypes.float32) if x.dtype == dt else x for x in xs), **kw).cast(dt)
    return wrapped


def _activation(fn, *versions: int, name: str):
    @onnx_op(name, *versions)
    def handler(ctx: NodeContext) -> UOp:
        return in_float32(lambda x: fn(ctx, x))(_float_input(ctx))
    return handler


_activation(lambda ctx, x: sigmoid(x), 1, 6, 13, name="Sigmoid")
_activation(lambda ctx, x: softplus(x), 1, 22, name="Softplus")
_activation(lambda ctx, x: T.alu(Ops.DIV, x, add(c(x, 1.0), un(Ops.ABS, x))), 1, 22, name="Softsign")
_activation(lambda ctx, x: elu(x, ctx.attr("alpha", 1.0)), 1, 6, 22, name="Elu")
_activation(lambda ctx, x: mul(c(x, ctx.attr("gamma", 1.05070102214813232421875)),
                               elu(x, ctx.attr("alpha", 1.67326319217681884765625))), 1, 6, 22, name="Selu")
_activation(lambda ctx, x: mul(x, un(Ops.TANH, softplus(x))), 18, 22, name="Mish")
_activation(lambda ctx, x: mul(x, sigmoid(mul(c(x, ctx.attr("alpha", 1.0)), x))), 24, name="Swish")


@onnx_op("Celu", 12, 28)
def celu(ctx: NodeContext) -> UOp:
    alpha = ctx.attr("alpha", 1.0)

    def fn(x: UOp) -> UOp:
        neg = mul(c(x, alpha), expm1(T.alu(Ops.DIV, x, c(x, alpha))))
        return add(T.alu(Ops.MAX, x, c(x, 0.0)), T.alu(Ops.MIN, neg, c(x, 0.0)))
    return in_float32(fn)(_float_input(ctx))


def hard_sigmoid(x: UOp, alpha: float, beta: float) -> UOp:
    return T.alu(Ops.MIN, T.alu(Ops.MAX, add(mul(c(x, alpha), x), c(x, beta)), c(x, 0.0)), c(x, 1.0))


_activation(lambda ctx, x: hard_sigmoid(x, ctx.attr("alpha", 0.2), ctx.attr("beta", 0.5)), 1, 6, 22,
            name="HardSigmoid")
_activation(lambda ctx, x: mul(x, hard_sigmoid(x, 1 / 6, 0.5)), 14, 22, name="HardSwish")


@onnx_op("Gelu", 20)
def gelu(ctx: NodeContext) -> UOp:
    mode = ctx.attr("approximate", "none")
    if mode not in ("none", "tanh"):
        raise Unsupported(f"approximate={mode!r} is not 'none' or 'tanh'")

    def fn(x: UOp) -> UOp:
        if mode == "tanh":
            inner = mul(c(x, math.sqrt(2 / math.pi)), add(x, mul(c(x, 0.044715), mul(x, mul(x, x)))))
            gate = un(Ops.TANH, inner)
        else:
            gate = un(Ops.ERF, mul(x, c(x, 1 / math.sqrt(2))))
        return mul(mul(c(x, 0.5), x), add(c(x, 1.0), gate))
    return in_float32(fn)(_float_input(ctx))


@onnx_op("ThresholdedRelu", 10, 22)
def thresholded_relu(ctx: NodeContext) -> UOp:
    x = _float_input(ctx)
    return where(lt(c(x, ctx.attr("alpha", 1.0)), x), x, c(x, 0.0))


@onnx_op("Shrink", 9)
def shrink(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    lambd, bias = ctx.attr("lambd", 0.5), ctx.attr("bias", 0.0)
    if not x.dtype.is_float:  # integer types: the thresholds in x's type (ONNX casts them)
        lambd, bias = int(lambd), int(bias)
    below = lt(x, c(x, -lambd))
    above = lt(c(x, lambd), x)
    return where(below, add(x, c(x, bias)), where(above, T.alu(Ops.SUB, x, c(x, bias)), c(x, 0)))


@onnx_op("PRelu", 1, 6, 7, 9, 16)
def prelu(ctx: NodeContext) -> UOp:
    x, slope = ctx.input(0), ctx.input(1)
    if ctx.version < 7 and slope.ndim == 1 and x.ndim > 2 and slope.shape[0] == x.shape[1]:
        slope = T.reshape(slope, (1, slope.shape[0]) + (1,) * (x.ndim - 2))  # old per-channel slope
    return where(lt(x, T.scalar_like(x, 0)), T.alu(Ops.MUL, x, slope.cast(x.dtype)), x)


@onnx_op("LeakyRelu", 1, 6, 16)
def leaky_relu(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    return where(lt(x, c(x, 0.0)), mul(x, c(x, ctx.attr("alpha", 0.01))), x)


@onnx_op("Relu", 1, 6, 13, 14)
def relu(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    return T.alu(Ops.MAX, x, T.scalar_like(x, 0))


@onnx_op("SwiGLU", 28)
def swiglu(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if a.shape != b.shape:
        raise Unsupported(f"A {a.shape} and B {b.shape} must have the same shape")
    alpha = ctx.attr("alpha", 1.0)
    return in_float32(lambda a, b: mul(mul(a, sigmoid(mul(c(a, alpha), a))), b))(a, b)
