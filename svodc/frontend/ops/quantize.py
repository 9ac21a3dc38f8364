"""Quantization: QuantizeLinear, DequantizeLinear (per tensor, per axis, blocked; integer, float8
and float4 types), DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearMatMul, QLinearConv.

Rounding and intermediate precisions follow onnx.reference: round half to even; QLinear* rescale
the int32 accumulator in float64 (numpy promotes int32 * float32 to float64), or in float32 where
rescale_exact.py proves that gives the same integers for every accumulator.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.dtypes import onnx_to_dtype
from svodc.frontend.ops.casts import cast_to
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.ops.nn import conv_from_attrs
from svodc.frontend.ops.rescale_exact import float32_rescale_is_exact
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes, max_value, min_value
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

F32, F64, I32 = dtypes.float32, dtypes.float64, dtypes.int32
VERSIONS = (10, 13, 19, 21, 23, 24, 25, 28)


def un(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def quant_param(p: UOp, x: UOp, axis: int, block: int) -> UOp:
    """A scale or zero point broadcast against x: a scalar, per `axis`, or per block of `block`
    elements along `axis` (each value repeated over its block, the last block possibly short)."""
    if p.ndim == 0 or math.prod(p.shape) == 1:
        return T.reshape(p, ())
    axis = T.norm_axis(axis, x.ndim)
    if not block:
        if p.ndim != 1 or p.shape[0] != x.shape[axis]:
            raise Unsupported(f"scale/zero point of shape {p.shape} does not fit axis {axis} of {x.shape}")
        return T.reshape(p, tuple(p.shape[0] if i == axis else 1 for i in range(x.ndim)))
    if p.ndim != x.ndim:
        raise Unsupported(f"blocked scale/zero point of shape {p.shape} needs the rank of x {x.shape}")
    nb = p.shape[axis]
    grown = T.reshape(p, p.shape[:axis + 1] + (1,) + p.shape[axis + 1:])
    grown = T.expand(grown, p.shape[:axis + 1] + (block,) + p.shape[axis + 1:])
    grown = T.reshape(grown, p.shape[:axis] + (nb * block,) + p.shape[axis + 1:])
    if nb * block < x.shape[axis]:
        raise Unsupported(f"{nb} blocks of {block} do not cover axis {axis} of size {x.shape[axis]}")
    full = T.shrink(grown, [(0, x.shape[axis]) if i == axis else (0, d) for i, d in enumerate(grown.shape)])
    if full.shape != x.shape:
        raise Unsupported(f"blocked scale/zero point of shape {p.shape} does not fit x {x.shape}")
    return full


def _axis_block(ctx: NodeContext, x: UOp) -> tuple[int, int]:
    """The quantization axis (normalized where a per-axis parameter uses it) and the block size."""
    return int(ctx.attr("axis", 1)), int(ctx.attr("block_size", 0) or 0)


def saturate_int(y: UOp, to: DType) -> UOp:
    """Clamp to `to`'s range and cast (y already integral)."""
    y = T.alu(Ops.MAX, y, T.scalar_like(y, min_value(to)))
    return T.alu(Ops.MIN, y, T.scalar_like(y, max_value(to))).cast(to)


@onnx_op("QuantizeLinear", *VERSIONS)
def quantize_linear(ctx: NodeContext) -> UOp:
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    axis, block = _axis_block(ctx, x)
    to = zp.dtype if zp is not None else ctx.dtype_attr("output_dtype", 2) if ctx.attr("output_dtype") else \
        dtypes.uint8
    precision = ctx.attr("precision")
    if precision:
        p = onnx_to_dtype(precision, "precision")
        q = T.alu(Ops.DIV, x.cast(p), quant_param(scale, x, axis, block).cast(p))
    else:
        q = T.alu(Ops.DIV, x, quant_param(scale, x, axis, block).cast(x.dtype))
    if to.is_int:
        qi = un(Ops.ROUND, q).cast(I32)
        if zp is not None:
            qi = T.alu(Ops.ADD, qi, quant_param(zp, x, axis, block).cast(I32))
        return saturate_int(qi, to)
    if to is dtypes.float4e2m1:  # no inf/NaN: the cast itself saturates
        if zp is not None:
            q = T.alu(Ops.ADD, q, quant_param(zp, x, axis, block).cast(q.dtype))
        return q.cast(to)
    if to.is_float and to.itemsize == 1 and to is not dtypes.float8e8m0:
        return cast_to(q, to, saturate=bool(ctx.attr("saturate", 1)))  # float8: the zero point is 0
    raise Unsupported(f"QuantizeLinear to {to.name} is not supported")


@onnx_op("DequantizeLinear", *VERSIONS)
def dequantize_linear(ctx: NodeContext) -> UOp:
    x, scale, zp = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    axis, block = _axis_block(ctx, x)
    out = ctx.dtype_attr("output_dtype") if ctx.attr("output_dtype") else scale.dtype
    dx = x.cast(F32)
    if zp is not None and x.dtype.is_int:  # float8/float4 zero points are 0 by definition
        dx = T.alu(Ops.SUB, dx, quant_param(zp, x, axis, block).cast(F32))
    return T.alu(Ops.MUL, dx, quant_param(scale, x, axis, block).cast(F32)).cast(out)


@onnx_op("DynamicQuantizeLinear", 11)
def dynamic_quantize_linear(ctx: NodeContext) -> list[UOp]:
    return dynamic_quantize(ctx.input(0))


def dynamic_quantize(x_in: UOp) -> list[UOp]:
    """uint8 y, scale, zero point: scale (max(0, max x) - min(0, min x)) / 255 and the matching zero point."""
    x = x_in.cast(F32)
    axes = list(range(x.ndim))
    hi = T.alu(Ops.MAX, T.reduce(x, Ops.MAX, axes, keepdims=False), T.const(0.0, F32, ()))
    lo = T.alu(Ops.MIN, T.reduce(x, Ops.MIN, axes, keepdims=False), T.const(0.0, F32, ()))
    span = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, hi, lo), T.const(1.0, F32, ()), T.alu(Ops.SUB, hi, lo))
    scale = T.alu(Ops.DIV, span, T.const(255.0, F32, ()))
    zp0 = T.alu(Ops.SUB, T.const(0.0, F32, ()), T.alu(Ops.DIV, lo, scale))
    zp = un(Ops.ROUND, T.alu(Ops.MIN, T.alu(Ops.MAX, zp0, T.const(0.0, F32, ())), T.const(255.0, F32, ())))
    y = T.alu(Ops.ADD, un(Ops.ROUND, T.alu(Ops.DIV, x, scale)), zp)
    y = T.alu(Ops.MIN, T.alu(Ops.MAX, y, T.scalar_like(y, 0.0)), T.scalar_like(y, 255.0))
    return [y.cast(dtypes.uint8), scale.cast(x_in.dtype), zp.cast(dtypes.uint8)]


def minus_zero_point(x: UOp, zp: UOp | None, axis: int | None) -> UOp:
    """x - zp in int32; a vector zero point applies along `axis` of x."""
    xi = x.cast(I32)
    if zp is None:
        return xi
    z = zp.cast(I32)
    if z.ndim == 1 and z.shape[0] != 1 and axis is not None:
        z = T.reshape(z, tuple(z.shape[0] if i == axis else 1 for i in range(x.ndim)))
    elif math.prod(z.shape) == 1:
        z = T.reshape(z, ())
    return T.alu(Ops.SUB, xi, z)


@onnx_op("MatMulInteger", 10)
def matmul_integer(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    a_zp, b_zp = ctx.optional_input(2), ctx.optional_input(3)
    return matmul(minus_zero_point(a, a_zp, a.ndim - 2), minus_zero_point(b, b_zp, b.ndim - 1))


@onnx_op("ConvInteger", 10)
def conv_integer(ctx: NodeContext) -> UOp:
    x, w = ctx.input(0), ctx.input(1)
    x_zp, w_zp = ctx.optional_input(2), ctx.optional_input(3)
    return conv_from_attrs(ctx, minus_zero_point(x, x_zp, None), minus_zero_point(w, w_zp, 0))


def requantize(acc: UOp, factor: UOp | None, zp: UOp | None, to: DType, rescale_dtype: DType) -> UOp:
    """round(acc * factor + zp) (factor None: 1), saturated to `to`; computed in rescale_dtype, or in
    float32 where that is proven to give the same integers (rescale_exact.py)."""
    if rescale_dtype is F64 and factor is not None and _float32_is_exact(acc, factor, zp, to):
        # The cast to `to` saturates; the zero point, an integer, is added to an integral float exactly
        # wherever the result is not saturated anyway. A zero point of 0 is not added (x + 0.0 differs
        # from x only at -0.0, whose integer is the same): one op less per element.
        y = un(Ops.ROUND, T.alu(Ops.MUL, acc.cast(F32), factor))
        if zp is not None and not constant_value(zp).any():
            zp = None
        return (y if zp is None else T.alu(Ops.ADD, y, zp.cast(F32))).cast(to)
    y = acc.cast(rescale_dtype)
    if factor is not None:
        y = T.alu(Ops.MUL, y, factor.cast(rescale_dtype))
    if zp is not None:
        y = T.alu(Ops.ADD, y, zp.cast(rescale_dtype))
    return saturate_int(un(Ops.ROUND, y), to)


def _max_abs(x: UOp) -> int | None:
    """max |x| of an integer tensor: its values where constant, else its 8-bit source's range."""
    if is_constant(x):
        v = constant_value(x)
        return int(np.abs(v.astype(np.int64)).max()) if v.size else 0
    src = x.src[0] if x.op is Ops.SUB else x
    if src.op is Ops.CAST and src.src[0].dtype in (dtypes.uint8, dtypes.int8):
        return 255  # an 8-bit value less an 8-bit zero point
    return None


def _float32_sums_exact(ctx: NodeContext, x: UOp, w: UOp, bias: UOp | None) -> bool:
    """A grouped (depthwise) convolution whose every partial sum, bias included, is an integer below
    2^24, so float32 computes it exactly in any order: the generic loops then vectorize as the float
    ones do (LLVM leaves an int32 product of bytes over a short row scalar), and the accumulator needs
    no conversion before the rescale. Ungrouped ones go to the integer GEMM."""
    if int(ctx.attr("group", 1)) == 1:
        return False
    bounds = [_max_abs(x), _max_abs(w), 0 if bias is None else _max_abs(bias.cast(I32))]
    if any(b is None for b in bounds):
        return False
    xb, wb, bb = bounds
    return math.prod(w.shape[1:]) * xb * wb + bb < 2 ** 24


def _float32_is_exact(acc: UOp, factor: UOp, zp: UOp | None, to: DType) -> bool:
    """An int32 accumulator (or float32 holding integers exactly), constant float32 factor and zero point
    whose float32 rescale is exact."""
    if acc.dtype not in (I32, F32) or factor.dtype is not F32 or not to.is_int or to.itemsize > 2:
        return False
    if not is_constant(factor) or (zp is not None and not is_constant(zp)):
        return False
    zeros = constant_value(zp).astype(np.int64) if zp is not None else np.zeros((), np.int64)
    return float32_rescale_is_exact(constant_value(factor), zeros, min_value(to), max_value(to))


def _scale_factor(*scales: UOp) -> UOp:
    """a_scale * b_scale / y_scale in the scales' own type (as numpy computes it)."""
    a, b, y = scales
    return T.alu(Ops.DIV, T.alu(Ops.MUL, a, b.cast(a.dtype)), y.cast(a.dtype))


@onnx_op("QLinearMatMul", 10, 21)
def qlinear_matmul(ctx: NodeContext) -> UOp:
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (ctx.optional_input(i) for i in range(8))
    acc = matmul(minus_zero_point(a, a_zp, a.ndim - 2), minus_zero_point(b, b_zp, b.ndim - 1))
    factor = _scale_factor(*(T.reshape(s, ()) if math.prod(s.shape) == 1 else s for s in (a_scale, b_scale, y_scale)))
    return requantize(acc, factor, None if y_zp is None else T.reshape(y_zp, ()) if math.prod(y_zp.shape) == 1
                       else y_zp, y_zp.dtype if y_zp is not None else a.dtype, F64)


@onnx_op("QLinearConv", 10)
def qlinear_conv(ctx: NodeContext) -> UOp:
    x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = (ctx.optional_input(i) for i in range(8))
    bias = ctx.optional_input(8)
    xc, wc = minus_zero_point(x, x_zp, None), minus_zero_point(w, w_zp, 0)
    acc_type = F32 if _float32_sums_exact(ctx, xc, wc, bias) else I32
    acc = conv_from_attrs(ctx, xc.cast(acc_type), wc.cast(acc_type))
    if bias is not None:
        acc = T.alu(Ops.ADD, acc, T.reshape(bias.cast(acc_type), (1, bias.shape[0]) + (1,) * (acc.ndim - 2)))
    if math.prod(w_scale.shape) > 1:  # per output channel
        w_scale = T.reshape(w_scale, (1, w_scale.shape[0]) + (1,) * (acc.ndim - 2))
    factor = _scale_factor(*(T.reshape(s, ()) if math.prod(s.shape) == 1 else s for s in (x_scale, w_scale, y_scale)))
    zp = None if y_zp is None else T.reshape(y_zp, ())
    return requantize(acc, factor, zp, y_zp.dtype if y_zp is not None else x.dtype, F64)
