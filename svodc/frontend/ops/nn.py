"""Neural-network ONNX ops: convolution, normalization, pooling."""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import min_value
from svodc.ir.interpret import window_view
from svodc.ir.ops import ConstData, Ops, WindowArg
from svodc.ir.uop import UOp


def _spatial_pads(ctx: NodeContext, in_sizes: list[int], kernel: list[int], strides: list[int],
                  dilations: list[int]) -> list[tuple[int, int]]:
    """Explicit (begin, end) pads per spatial axis from `pads` or `auto_pad`."""
    n = len(in_sizes)
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("NOTSET", ""):
        pads = ctx.ints("pads", [0] * (2 * n))
        if len(pads) != 2 * n:
            raise Unsupported(f"pads has {len(pads)} values, expected {2 * n}")
        return [(pads[i], pads[i + n]) for i in range(n)]
    if auto_pad == "VALID":
        return [(0, 0)] * n
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = []
        for size, k, s, d in zip(in_sizes, kernel, strides, dilations, strict=True):
            target = -(-size // s)
            total = max(0, (target - 1) * s + (k - 1) * d + 1 - size)
            small = total // 2
            out.append((small, total - small) if auto_pad == "SAME_UPPER" else (total - small, small))
        return out
    raise Unsupported(f"auto_pad={auto_pad!r} is not a valid value")


@onnx_op("Conv", 1, 11, 22)
def conv(ctx: NodeContext) -> UOp:
    x, w, b = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if not x.dtype.is_float:
        raise Unsupported(f"Conv of {x.dtype.name} is not supported")
    nsp = x.ndim - 2
    kernel = ctx.ints("kernel_shape", list(w.shape[2:]))
    if kernel != list(w.shape[2:]):
        raise Unsupported(f"kernel_shape {kernel} disagrees with the weight shape {w.shape}")
    strides = ctx.ints("strides", [1] * nsp)
    dilations = ctx.ints("dilations", [1] * nsp)
    pads = _spatial_pads(ctx, list(x.shape[2:]), kernel, strides, dilations)
    y = T.conv(x, w, strides, dilations, pads, int(ctx.attr("group", 1)))
    if b is not None:
        y = T.alu(Ops.ADD, y, T.reshape(b, (1, b.shape[0]) + (1,) * nsp))
    return y


def _pool_geometry(ctx: NodeContext, x: UOp) -> tuple[list[int], list[int], list[int], list[tuple[int, int]],
                                                      list[int]]:
    """kernel, strides, dilations, explicit pads, and the extra end padding ceil_mode adds."""
    nsp = x.ndim - 2
    kernel = ctx.ints("kernel_shape")
    if kernel is None or len(kernel) != nsp:
        raise Unsupported(f"kernel_shape must have {nsp} values")
    strides = ctx.ints("strides", [1] * nsp)
    dilations = ctx.ints("dilations", [1] * nsp)
    pads = _spatial_pads(ctx, list(x.shape[2:]), kernel, strides, dilations)
    extra = [0] * nsp
    if ctx.attr("ceil_mode", 0):
        for i, (size, k, s, d) in enumerate(zip(x.shape[2:], kernel, strides, dilations, strict=True)):
            span = (k - 1) * d + 1
            padded = size + pads[i][0] + pads[i][1]
            out = -(-(padded - span) // s) + 1
            if (out - 1) * s >= size + pads[i][0]:
                out -= 1  # the last window would start in the end padding
            extra[i] = max(0, (out - 1) * s + span - padded)
    return kernel, strides, dilations, pads, extra


@onnx_op("MaxPool", 1, 8, 10, 11, 12, 22)
def max_pool(ctx: NodeContext) -> list[UOp | None]:
    x = ctx.input(0)
    if ctx.output_used(1):
        raise Unsupported("the Indices output is not supported")
    if ctx.attr("storage_order", 0):
        raise Unsupported("storage_order=1 is only meaningful for Indices, which is not supported")
    kernel, strides, dilations, pads, extra = _pool_geometry(ctx, x)
    nsp = len(kernel)
    lowest = min_value(x.dtype)
    xp = T.pad(x, [(0, 0), (0, 0)] + [(b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)], lowest)
    win = T.window(xp, range(2, 2 + nsp), kernel, strides, dilations)
    return [T.reduce(win, Ops.MAX, range(x.ndim, x.ndim + nsp), keepdims=False)]


@onnx_op("AveragePool", 1, 7, 10, 11, 19, 22)
def average_pool(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    kernel, strides, dilations, pads, extra = _pool_geometry(ctx, x)
    nsp = len(kernel)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    xp = T.pad(x, [(0, 0), (0, 0)] + [(b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)], 0)
    win = T.window(xp, range(2, 2 + nsp), kernel, strides, dilations)
    total = T.reduce(win, Ops.ADD, range(x.ndim, x.ndim + nsp), keepdims=False)
    # The divisor per output position, computed now: the window cells that are inside the input
    # (or inside the explicit pads when count_include_pad=1); ceil_mode's extra cells never count.
    ones = np.ones(x.shape[2:], dtype=np.float64)
    if include_pad:
        ones = np.pad(ones, pads, constant_values=1.0)
        ones = np.pad(ones, [(0, e) for e in extra])
    else:
        ones = np.pad(ones, [(b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)])
    counts = window_view(ones, WindowArg(tuple(range(nsp)), tuple(kernel), tuple(strides), tuple(dilations)))
    counts = counts.sum(axis=tuple(range(nsp, 2 * nsp)))
    divisor = UOp(Ops.WEIGHT, x.dtype, (), ConstData(np.maximum(counts, 1).astype(x.dtype.np)))
    return T.alu(Ops.DIV, total, T.reshape(divisor, (1, 1) + counts.shape))


def _global_pool(op: Ops):
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        axes = range(2, x.ndim)
        out = T.reduce(x, op, axes)
        if op is Ops.ADD:
            out = T.alu(Ops.DIV, out, T.const(math.prod(x.shape[2:]), x.dtype))
        return out
    return handler


onnx_op("GlobalAveragePool", 1, 22)(_global_pool(Ops.ADD))
onnx_op("GlobalMaxPool", 1, 22)(_global_pool(Ops.MAX))
