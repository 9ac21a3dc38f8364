"""Normalizations: Batch, Layer, Group, Instance, RMS, MeanVariance, Lp, and LRN.

float16/bfloat16 inputs are normalized in float32 (ONNX's stash_type=1: the statistics in float32)
and the results rounded once. Variances are computed in two passes (the mean first, then the mean
squared deviation), which keeps them non-negative and accurate for inputs with a large mean.
"""

from __future__ import annotations

import math

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.activations import in_float32
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def un(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def mean(x: UOp, axes: list[int]) -> UOp:
    n = math.prod(x.shape[a] for a in axes)
    return T.alu(Ops.DIV, T.reduce(x, Ops.ADD, axes), T.const(n or math.nan, x.dtype))


def moments(x: UOp, axes: list[int]) -> tuple[UOp, UOp, UOp]:
    """(mean, x - mean, population variance) over axes (reduced axes kept as 1)."""
    m = mean(x, axes)
    diff = T.alu(Ops.SUB, x, m)
    return m, diff, mean(T.alu(Ops.MUL, diff, diff), axes)


def inv_std(var: UOp, eps: float) -> UOp:
    return un(Ops.RECIP, un(Ops.SQRT, T.alu(Ops.ADD, var, T.scalar_like(var, eps))))


def per_channel(t: UOp, x: UOp) -> UOp:
    """A [C] tensor viewed as [1, C, 1, ...] against x [N, C, ...], in x's dtype."""
    return T.reshape(t.cast(x.dtype), (1, t.shape[0]) + (1,) * (x.ndim - 2))


def _float(ctx: NodeContext, x: UOp) -> UOp:
    if not x.dtype.is_float:
        raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
    return x


@onnx_op("BatchNormalization", 1, 6, 7, 9, 14, 15)
def batch_norm(ctx: NodeContext) -> list[UOp | None]:
    if ctx.version <= 7 and ctx.attr("spatial", 1) == 0:
        raise Unsupported("spatial=0 is not supported")
    if ctx.version < 7 and ctx.attr("is_test", 0) == 0 and any(ctx.output_used(i) for i in range(1, 5)):
        raise Unsupported("training outputs before opset 7 are not supported")
    x, scale, bias, mean_in, var_in = (ctx.input(i) for i in range(5))
    eps = ctx.attr("epsilon", 1e-5)
    if ctx.version >= 14 and ctx.attr("training_mode", 0):
        return _batch_norm_training(ctx, x, scale, bias, mean_in, var_in, eps)
    scale, bias, mean_in, var_in = (per_channel(t, x) for t in (scale, bias, mean_in, var_in))
    # y = x * a + c with a = scale / sqrt(var + eps), c = bias - mean * a: two ops per element, and
    # when the statistics are constants, a and c fold at compile time.
    a = T.alu(Ops.MUL, scale, inv_std(var_in, eps))
    c = T.alu(Ops.SUB, bias, T.alu(Ops.MUL, mean_in, a))
    return [T.alu(Ops.ADD, T.alu(Ops.MUL, x, a), c)]


def _batch_norm_training(ctx: NodeContext, x: UOp, scale: UOp, bias: UOp, mean_in: UOp, var_in: UOp,
                         eps: float) -> list[UOp | None]:
    """Statistics of this batch; running statistics updated with momentum (outputs 1 and 2)."""
    momentum = ctx.attr("momentum", 0.9)
    axes = [0, *range(2, x.ndim)]
    m, diff, var = moments(x, axes)
    y = T.alu(Ops.ADD, T.alu(Ops.MUL, T.alu(Ops.MUL, diff, inv_std(var, eps)), per_channel(scale, x)),
              per_channel(bias, x))
    flat_m, flat_v = T.reshape(m, (x.shape[1],)), T.reshape(var, (x.shape[1],))

    def running(old: UOp, batch: UOp) -> UOp:
        old = old.cast(x.dtype)
        return T.alu(Ops.ADD, T.alu(Ops.MUL, old, T.scalar_like(old, momentum)),
                     T.alu(Ops.MUL, batch, T.scalar_like(batch, 1 - momentum)))
    return [y, running(mean_in, flat_m), running(var_in, flat_v)]


@onnx_op("LayerNormalization", 17)
def layer_norm(ctx: NodeContext) -> list[UOp | None]:
    x = _float(ctx, ctx.input(0))
    scale, bias = ctx.input(1), ctx.optional_input(2)
    axis = T.norm_axis(ctx.attr("axis", -1), x.ndim)
    eps = ctx.attr("epsilon", 1e-5)
    axes = list(range(axis, x.ndim))

    def stats(x: UOp) -> tuple[UOp, UOp, UOp]:
        m, diff, var = moments(x, axes)
        return m, diff, inv_std(var, eps)

    m = in_float32(lambda x: stats(x)[0])(x) if ctx.output_used(1) else None
    inv = in_float32(lambda x: stats(x)[2])(x) if ctx.output_used(2) else None

    def normalize(x: UOp, scale: UOp, *bias: UOp) -> UOp:
        _, diff, inv = stats(x)
        y = T.alu(Ops.MUL, T.alu(Ops.MUL, diff, inv), scale.cast(x.dtype))
        return T.alu(Ops.ADD, y, bias[0].cast(x.dtype)) if bias else y
    y = in_float32(normalize)(x, scale, *([bias] if bias is not None else []))
    return [y, m, inv]


@onnx_op("RMSNormalization", 23)
def rms_norm(ctx: NodeContext) -> UOp:
    x = _float(ctx, ctx.input(0))
    axis = T.norm_axis(ctx.attr("axis", -1), x.ndim)
    eps = ctx.attr("epsilon", 1e-5)

    def fn(x: UOp, scale: UOp) -> UOp:
        ms = mean(T.alu(Ops.MUL, x, x), list(range(axis, x.ndim)))
        return T.alu(Ops.MUL, T.alu(Ops.MUL, x, inv_std(ms, eps)), scale.cast(x.dtype))
    return in_float32(fn)(x, ctx.input(1))


@onnx_op("GroupNormalization", 18, 21)
def group_norm(ctx: NodeContext) -> UOp:
    x = _float(ctx, ctx.input(0))
    scale, bias = ctx.input(1), ctx.input(2)
    groups = int(ctx.attr("num_groups"))
    eps = ctx.attr("epsilon", 1e-5)
    n, c = x.shape[:2]
    if c % groups:
        raise Unsupported(f"{c} channels do not split into {groups} groups")
    if ctx.version < 21:  # scale and bias per group: repeat them for each channel of the group
        scale, bias = (T.reshape(T.expand(T.reshape(t, (groups, 1)), (groups, c // groups)), (c,))
                       for t in (scale, bias))

    def fn(x: UOp, scale: UOp, bias: UOp) -> UOp:
        g = T.reshape(x, (n, groups, math.prod(x.shape[1:]) // groups))
        _, diff, var = moments(g, [2])
        y = T.reshape(T.alu(Ops.MUL, diff, inv_std(var, eps)), x.shape)
        return T.alu(Ops.ADD, T.alu(Ops.MUL, y, per_channel(scale, x)), per_channel(bias, x))
    return in_float32(fn)(x, scale, bias)


@onnx_op("InstanceNormalization", 1, 6, 22)
def instance_norm(ctx: NodeContext) -> UOp:
    x = _float(ctx, ctx.input(0))
    eps = ctx.attr("epsilon", 1e-5)

    def fn(x: UOp, scale: UOp, bias: UOp) -> UOp:
        _, diff, var = moments(x, list(range(2, x.ndim)))
        y = T.alu(Ops.MUL, diff, inv_std(var, eps))
        return T.alu(Ops.ADD, T.alu(Ops.MUL, y, per_channel(scale, x)), per_channel(bias, x))
    return in_float32(fn)(x, ctx.input(1), ctx.input(2))


@onnx_op("MeanVarianceNormalization", 1, 9, 13)
def mean_variance_norm(ctx: NodeContext) -> UOp:
    x = _float(ctx, ctx.input(0))
    if ctx.version < 9:
        if not ctx.attr("across_channels", 0) and ctx.attr("normalize_variance", 1):
            axes = [0, 2, 3]
        else:
            raise Unsupported("across_channels=1 or normalize_variance=0 (opset 1) is not supported")
    else:
        axes = [T.norm_axis(a, x.ndim) for a in ctx.ints("axes", [0, 2, 3])]

    def fn(x: UOp) -> UOp:
        _, diff, var = moments(x, axes)
        return T.alu(Ops.DIV, diff, T.alu(Ops.ADD, un(Ops.SQRT, var), T.scalar_like(var, 1e-9)))
    return in_float32(fn)(x)


@onnx_op("LpNormalization", 1, 22)
def lp_norm(ctx: NodeContext) -> UOp:
    x = _float(ctx, ctx.input(0))
    axis = T.norm_axis(ctx.attr("axis", -1), x.ndim)
    p = ctx.attr("p", 2)
    if p not in (1, 2):
        raise Unsupported(f"p={p} is not 1 or 2")

    def fn(x: UOp) -> UOp:
        if p == 1:
            norm = T.reduce(un(Ops.ABS, x), Ops.ADD, [axis])
        else:
            norm = un(Ops.SQRT, T.reduce(T.alu(Ops.MUL, x, x), Ops.ADD, [axis]))
        zero = T.alu(Ops.CMPEQ, norm, T.scalar_like(norm, 0))
        return T.alu(Ops.WHERE, zero, T.scalar_like(x, 0), T.alu(Ops.DIV, x, norm))  # 0/0 gives 0
    return in_float32(fn)(x)


@onnx_op("LRN", 1, 13)
def lrn(ctx: NodeContext) -> UOp:
    """y = x / (bias + alpha/size * sum of x^2 over a channel window) ^ beta"""
    x = ctx.input(0)
    size = int(ctx.attr("size"))
    alpha, beta, bias = ctx.attr("alpha", 1e-4), ctx.attr("beta", 0.75), ctx.attr("bias", 1.0)
    before, after = (size - 1) // 2, size - 1 - (size - 1) // 2

    def fn(x: UOp) -> UOp:
        sq = T.alu(Ops.MUL, x, x)
        padded = T.pad(sq, [(0, 0), (before, after)] + [(0, 0)] * (x.ndim - 2), 0)
        win = T.window(padded, [1], [size], [1], [1])
        total = T.reduce(win, Ops.ADD, [x.ndim], keepdims=False)
        base = T.alu(Ops.ADD, T.alu(Ops.MUL, total, T.const(alpha / size, x.dtype)), T.const(bias, x.dtype))
        return T.alu(Ops.DIV, x, T.alu(Ops.POW, base, T.const(beta, x.dtype)))
    return in_float32(fn)(x)
