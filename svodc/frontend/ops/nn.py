"""Neural-network ONNX ops: convolution, transposed convolution, pooling."""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes, min_value
from svodc.ir.interpret import window_view
from svodc.ir.ops import ConstData, Ops, WindowArg
from svodc.ir.uop import UOp


def _spatial_pads(ctx: NodeContext, x: UOp, kernel: list[int], strides: list[int],
                  dilations: list[int]) -> list[tuple[int, int]]:
    """Explicit (begin, end) pads per spatial axis from `pads` or `auto_pad`. SAME over an axis a bounded
    dim sizes pads the end by span - 1 - begin, which gives ceil(size / stride) outputs at every size (the
    extra end padding is never read); that needs a begin pad the same at every size."""
    in_sizes = list(x.shape[2:])
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
        def begin(size: int, k: int, s: int, d: int) -> tuple[int, int]:
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
            return (total // 2 if auto_pad == "SAME_UPPER" else total - total // 2), total

        out = []
        for size, k, s, d, bounded in zip(in_sizes, kernel, strides, dilations, ctx.bounded(x)[2:], strict=True):
            small, total = begin(size, k, s, d)
            if bounded:
                if len({begin(v, k, s, d)[0] for v in range(max(1, size - 2 * s), size + 1)}) > 1:
                    raise Unsupported(f"auto_pad={auto_pad} over a bounded dim with kernel {k} and stride {s}: its "
                                      "begin pad depends on the size; fix the dim or give explicit pads")
                total = (k - 1) * d
            out.append((small, total - small))
        return out
    raise Unsupported(f"auto_pad={auto_pad!r} is not a valid value")


@onnx_op("Conv", 1, 11, 22)
def conv(ctx: NodeContext) -> UOp:
    x, w, b = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if not x.dtype.is_float:
        raise Unsupported(f"Conv of {x.dtype.name} is not supported")
    return conv_from_attrs(ctx, x, w, b)


def conv_from_attrs(ctx: NodeContext, x: UOp, w: UOp, b: UOp | None = None) -> UOp:
    """A convolution with the node's kernel_shape, strides, dilations, pads/auto_pad and group."""
    nsp = x.ndim - 2
    kernel = ctx.ints("kernel_shape", list(w.shape[2:]))
    if kernel != list(w.shape[2:]):
        raise Unsupported(f"kernel_shape {kernel} disagrees with the weight shape {w.shape}")
    strides = ctx.ints("strides", [1] * nsp)
    dilations = ctx.ints("dilations", [1] * nsp)
    pads = _spatial_pads(ctx, x, kernel, strides, dilations)
    dt = x.dtype
    if dt.emulated and dt.is_float:  # products summed in float32, rounded once (as numpy's dot does)
        y = T.conv(x.cast(dtypes.float32), w.cast(dtypes.float32), strides, dilations, pads,
                   int(ctx.attr("group", 1))).cast(dt)
    else:
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
    pads = _spatial_pads(ctx, x, kernel, strides, dilations)
    extra = [0] * nsp
    if ctx.attr("ceil_mode", 0) and any(ctx.bounded(x)[2:]):
        raise Unsupported("ceil_mode=1 over a bounded dim (its end padding depends on the size); fix the dim")
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
    kernel, strides, dilations, pads, extra = _pool_geometry(ctx, x)
    nsp = len(kernel)
    lowest = min_value(x.dtype)
    full_pads = [(0, 0), (0, 0)] + [(b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)]
    xp = T.pad(x, full_pads, lowest)
    win = T.window(xp, range(2, 2 + nsp), kernel, strides, dilations)
    window_axes = range(x.ndim, x.ndim + nsp)
    y = T.reduce(win, Ops.MAX, window_axes, keepdims=False)
    if not ctx.output_used(1):
        return [y, None]
    # Indices: the flat input index of the first maximum in each window (row-major, or column-major
    # over the spatial axes with storage_order=1); padding never wins: its index is past the end.
    shape = x.shape
    flat = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    if ctx.attr("storage_order", 0):
        n, c = shape[:2]
        sp = np.arange(math.prod(shape[2:]), dtype=np.int64).reshape(shape[2:][::-1]).transpose()
        flat = (np.arange(n * c, dtype=np.int64).reshape(n, c, *(1,) * nsp) * math.prod(shape[2:]) + sp)
    index = UOp(Ops.WEIGHT, dtypes.int64, (), ConstData(flat))
    past_end = math.prod(shape)
    index_win = T.window(T.pad(index, full_pads, past_end), range(2, 2 + nsp), kernel, strides, dilations)
    is_max = T.alu(Ops.CMPEQ, win, T.reshape(y, y.shape + (1,) * nsp))
    candidates = T.alu(Ops.WHERE, is_max, index_win, T.scalar_like(index_win, past_end))
    return [y, T.reduce(candidates, Ops.MIN, window_axes, keepdims=False)]


@onnx_op("LpPool", 1, 2, 11, 18, 22)
def lp_pool(ctx: NodeContext) -> UOp:
    """(sum over the window of |x|^p)^(1/p); padding counts as 0."""
    x = ctx.input(0)
    p = float(ctx.attr("p", 2.0))
    kernel, strides, dilations, pads, extra = _pool_geometry(ctx, x)
    nsp = len(kernel)
    xp = T.pad(x, [(0, 0), (0, 0)] + [(b, e + x_) for (b, e), x_ in zip(pads, extra, strict=True)], 0)
    win = T.window(xp, range(2, 2 + nsp), kernel, strides, dilations)
    return lp_norm_over(win, list(range(x.ndim, x.ndim + nsp)), p)


def lp_norm_over(x: UOp, axes: list[int], p: float) -> UOp:
    if p == 2.0:
        return UOp(Ops.SQRT, x.dtype, (T.reduce(T.alu(Ops.MUL, x, x), Ops.ADD, axes, keepdims=False),))
    powered = T.alu(Ops.POW, UOp(Ops.ABS, x.dtype, (x,)), T.scalar_like(x, p))
    total = T.reduce(powered, Ops.ADD, axes, keepdims=False)
    return T.alu(Ops.POW, total, T.scalar_like(total, 1.0 / p))


@onnx_op("GlobalLpPool", 1, 2, 22)
def global_lp_pool(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    out = lp_norm_over(x, list(range(2, x.ndim)), float(ctx.attr("p", 2.0)))
    return T.reshape(out, x.shape[:2] + (1,) * (x.ndim - 2))


@onnx_op("AveragePool", 1, 7, 10, 11, 19, 22)
def average_pool(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    kernel, strides, dilations, pads, extra = _pool_geometry(ctx, x)
    nsp = len(kernel)
    include_pad = bool(ctx.attr("count_include_pad", 0))
    if any(b and p != (0, 0) for b, p in zip(ctx.bounded(x)[2:], pads, strict=True)):
        raise Unsupported("padding over a bounded dim (the divisor at the edges depends on the size); fix the dim")
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


@onnx_op("ConvTranspose", 1, 11, 22)
def conv_transpose(ctx: NodeContext) -> UOp:
    """The convolution of the input, upsampled by the strides (zeros between elements), with the
    spatially flipped kernel (in/out channels swapped per group), fully padded by d*(k-1); then the
    `pads` are cropped from that full result and output_padding / output_shape extend its end."""
    x, w, b = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if not x.dtype.is_float:
        raise Unsupported(f"ConvTranspose of {x.dtype.name} is not supported")
    nsp = x.ndim - 2
    g = int(ctx.attr("group", 1))
    kernel = list(w.shape[2:])
    if ctx.ints("kernel_shape", kernel) != kernel:
        raise Unsupported(f"kernel_shape {ctx.ints('kernel_shape')} disagrees with the weight shape {w.shape}")
    strides = ctx.ints("strides", [1] * nsp)
    dilations = ctx.ints("dilations", [1] * nsp)
    out_pad = ctx.ints("output_padding", [0] * nsp)
    out_shape = ctx.ints("output_shape")
    if out_shape is not None and len(out_shape) == nsp + 2:
        out_shape = out_shape[2:]
    ins = x.shape[2:]
    full = [s * (n - 1) + (k - 1) * d + 1 for s, n, k, d in zip(strides, ins, kernel, dilations, strict=True)]
    auto_pad = ctx.attr("auto_pad", "NOTSET")
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        target = out_shape or [n * s for n, s in zip(ins, strides, strict=True)]
        total = [f + op - t for f, op, t in zip(full, out_pad, target, strict=True)]
        small = [t // 2 for t in total]
        pads = [(sm, t - sm) if auto_pad == "SAME_UPPER" else (t - sm, sm) for sm, t in zip(small, total, strict=True)]
    elif auto_pad in ("NOTSET", "", "VALID"):
        flat = ctx.ints("pads", [0] * (2 * nsp)) if auto_pad != "VALID" else [0] * (2 * nsp)
        pads = [(flat[i], flat[i + nsp]) for i in range(nsp)]
        target = out_shape or [f + op - pb - pe for f, op, (pb, pe) in zip(full, out_pad, pads, strict=True)]
    else:
        raise Unsupported(f"auto_pad={auto_pad!r} is not a valid value")

    if (g == 1 and strides == kernel and all(d == 1 for d in dilations) and target == full
            and all(p == (0, 0) for p in pads) and x.dtype is dtypes.float32):
        y = _conv_transpose_blocks(x, w, kernel, any(ctx.bounded(x)[2:]))
    else:
        y = _conv_transpose_upsampled(x, w, g, kernel, strides, dilations)
    # crop `pads` from the full result and pad (with zeros) or crop its end to the target size
    grow = [(max(0, -pb), max(0, pb + t - f)) for (pb, _), t, f in zip(pads, target, full, strict=True)]
    y = T.pad(y, [(0, 0), (0, 0), *grow])
    y = T.shrink(y, [(0, y.shape[0]), (0, y.shape[1])]
                 + [(max(0, pb), max(0, pb) + t) for (pb, _), t in zip(pads, target, strict=True)])
    if b is not None:
        y = T.alu(Ops.ADD, y, T.reshape(b, (1, b.shape[0]) + (1,) * nsp))
    return y


def _conv_transpose_blocks(x: UOp, w: UOp, kernel: list[int], bounded: bool) -> UOp:
    """Kernel == strides, no pads or dilation (the 2x2/2 upsampling of segmentation heads): every
    input position owns its own k1 x k2 block of the output, y[n, o, i*k + a] = sum_c x[n, c, i] *
    w[c, o, a]. One matrix product [O*K, C] x [C, H*W] reads x in place (no zeros multiplied, no
    im2col), then the blocks are moved into place (depth to space). Over bounded spatial dims the
    product keeps the spatial axes (H*W would merge two run-time sizes): a GEMM per row for one image,
    else a sum over C."""
    n, c, *sp = x.shape
    nsp, m = len(sp), w.shape[1]
    kk = math.prod(kernel)
    wm = T.reshape(T.permute(w, (1, *range(2, 2 + nsp), 0)), (m * kk, c))  # [(o, a), c]
    if bounded and n == 1 and nsp == 2:  # a GEMM per row: run-time batch H, run-time N W (as conv_to_row_matmuls)
        h, wd = sp
        rows = T.matmul(T.broadcast_to(T.reshape(wm, (1, m * kk, c)), (h, m * kk, c)),
                        T.permute(T.reshape(x, (c, h, wd)), (1, 0, 2)))  # [H, (o, a), W]
        prod = T.reshape(T.permute(rows, (1, 0, 2)), (1, m * kk, h, wd))
    elif bounded:
        full = (n, m * kk, c, *sp)
        xs = T.expand(T.reshape(x, (n, 1, c, *sp)), full)
        ws = T.expand(T.reshape(wm, (1, m * kk, c, *(1,) * nsp)), full)
        prod = T.reduce(T.alu(Ops.MUL, xs, ws), Ops.ADD, [2], keepdims=False)
    else:
        prod = T.matmul(T.broadcast_to(wm, (n, m * kk, c)), T.reshape(x, (n, c, math.prod(sp))))
    y = T.reshape(prod, (n, m, *kernel, *sp))
    order = [0, 1] + [i for d in range(nsp) for i in (2 + nsp + d, 2 + d)]  # [n, o, s1, k1, s2, k2, ...]
    return T.reshape(T.permute(y, order), (n, m, *(s_ * k for s_, k in zip(sp, kernel, strict=True))))


def _conv_transpose_upsampled(x: UOp, w: UOp, g: int, kernel: list[int], strides: list[int],
                              dilations: list[int]) -> UOp:
    """The general case: the full convolution of the zero-upsampled input with the flipped kernel."""
    nsp = x.ndim - 2
    for axis, s in enumerate(strides, start=2):  # upsample: s-1 zeros after every element, none after the last
        if s > 1:
            n = x.shape[axis]
            y = T.reshape(x, x.shape[:axis + 1] + (1,) + x.shape[axis + 1:])
            y = T.pad(y, [(0, 0)] * (axis + 1) + [(0, s - 1)] + [(0, 0)] * (x.ndim - axis - 1))
            y = T.reshape(y, x.shape[:axis] + (n * s,) + x.shape[axis + 1:])
            x = T.shrink(y, [(0, d) if i != axis else (0, (n - 1) * s + 1) for i, d in enumerate(y.shape)])
    c, m_g = w.shape[0], w.shape[1]
    wg = T.reshape(w, (g, c // g, m_g, *kernel))
    wg = T.reshape(T.permute(wg, (0, 2, 1, *range(3, 3 + nsp))), (g * m_g, c // g, *kernel))
    wf = T.slice_axes(wg, (0, 0, *(k - 1 for k in kernel)), (1, 1, *(-1,) * nsp), wg.shape)
    return T.conv(x, wf, [1] * nsp, dilations, [((k - 1) * d,) * 2 for k, d in zip(kernel, dilations, strict=True)], g)
