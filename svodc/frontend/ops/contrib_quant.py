"""onnxruntime's quantized contrib ops (domain com.microsoft), as emitted by its quantization tools:
QLinearAdd, QLinearMul, QLinearGlobalAveragePool, QLinearConcat, QLinearSigmoid, QGemm (static
QOperator format), DynamicQuantizeMatMul, MatMulIntegerToFloat, DynamicQuantizeLSTM (dynamic), and
the com.microsoft QuantizeLinear / DequantizeLinear.

Integer semantics, the same rules as the ONNX QLinear ops in quantize.py: integer products and sums
exactly in int32; the real-valued rescale factor computed from the float32 scales in float32 (as
onnxruntime computes it); the rescale itself in float64 (the exact product, as onnx.reference
computes QLinearConv), rounded half to even, plus the output zero point, saturated. Ops defined as
dequantize -> float function -> quantize (sigmoid, concat of differently scaled inputs) follow
QuantizeLinear exactly: x / scale in float32, rounded half to even.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.ops.activations import sigmoid
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.ops.quantize import (
    dequantize_linear,
    dynamic_quantize,
    minus_zero_point,
    quantize_linear,
    requantize,
    saturate_int,
    un,
)
from svodc.frontend.ops.rnn import LSTM_ACTIVATIONS, Layer, lstm_layers
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes, max_value, min_value
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

MS = "com.microsoft"
BYTES = (dtypes.uint8, dtypes.int8)
F32, F64, I32 = dtypes.float32, dtypes.float64, dtypes.int32

onnx_op("QuantizeLinear", 1, domain=MS)(quantize_linear)
onnx_op("DequantizeLinear", 1, domain=MS)(dequantize_linear)


def scalar(p: UOp | None, what: str) -> UOp | None:
    """A per-tensor scale or zero point as a 0-d tensor."""
    if p is None:
        return None
    if math.prod(p.shape) != 1:
        raise Unsupported(f"{what} must be a scalar (per-tensor), got shape {p.shape}")
    return T.reshape(p, ())


def _centered(x: UOp, zp: UOp | None) -> UOp:
    """x - zero point, in int32."""
    return x.cast(I32) if zp is None else T.alu(Ops.SUB, x.cast(I32), zp.cast(I32))


def _ratio(num: UOp, den: UOp) -> UOp:
    return T.alu(Ops.DIV, num.cast(F32), den.cast(F32))


def _out_type(zp: UOp | None, x: UOp) -> DType:
    return zp.dtype if zp is not None else x.dtype


def _qparams(ctx: NodeContext, first: int, n: int) -> list[UOp | None]:
    """n consecutive (x, scale, zero point) inputs as given, scales and zero points as scalars."""
    out = []
    for i in range(first, first + n):
        v = ctx.optional_input(i)
        out.append(v if (i - first) % 3 == 0 else scalar(v, f"input {i} ({ctx.node.input[i]!r})"))
    return out


@onnx_op("QLinearAdd", 1, domain=MS)
def qlinear_add(ctx: NodeContext) -> UOp:
    """C = round((A_scale/C_scale)(A - A_zp) + (B_scale/C_scale)(B - B_zp)) + C_zp."""
    a, a_s, a_z, b, b_s, b_z, c_s = _qparams(ctx, 0, 7)
    c_z = scalar(ctx.optional_input(7), "C_zero_point")
    to = _out_type(c_z, a)
    ra, rb = _ratio(a_s, c_s), _ratio(b_s, c_s)
    if _float32_add_is_exact(a, a_z, ra, b, b_z, rb, c_z, to):
        ya = T.alu(Ops.MUL, _centered(a, a_z).cast(F32), ra)
        yb = T.alu(Ops.MUL, _centered(b, b_z).cast(F32), rb)
        y = un(Ops.ROUND, T.alu(Ops.ADD, ya, yb))
        return (y if c_z is None else T.alu(Ops.ADD, y, c_z.cast(F32))).cast(to)
    ya = T.alu(Ops.MUL, _centered(a, a_z).cast(F64), ra.cast(F64))
    yb = T.alu(Ops.MUL, _centered(b, b_z).cast(F64), rb.cast(F64))
    return requantize(T.alu(Ops.ADD, ya, yb), None, c_z, to, F64)


def _float32_add_is_exact(a: UOp, a_z: UOp | None, ra: UOp, b: UOp, b_z: UOp | None, rb: UOp, c_z: UOp | None,
                          to: DType) -> bool:
    """Does float32 (round(float32(a') * ra + float32(b') * rb) + c_z, saturated) give the float64
    rescale's integers for every pair of 8-bit inputs? Checked on all 65,536 pairs: a proof, not a sample."""
    consts = [p for p in (a_z, b_z, c_z, ra, rb) if p is not None]
    if a.dtype not in BYTES or b.dtype not in BYTES or not to.is_int or not all(is_constant(p) for p in consts):
        return False
    za, zb, zc = (int(constant_value(p)) if p is not None else 0 for p in (a_z, b_z, c_z))
    fa, fb = np.float32(constant_value(ra)), np.float32(constant_value(rb))
    av = np.arange(min_value(a.dtype), max_value(a.dtype) + 1, dtype=np.int64)[:, None] - za
    bv = np.arange(min_value(b.dtype), max_value(b.dtype) + 1, dtype=np.int64)[None, :] - zb
    lo, hi = min_value(to), max_value(to)
    want = np.clip(np.rint(av * np.float64(fa) + bv * np.float64(fb) + zc), lo, hi)
    got = np.clip(np.rint(av.astype(np.float32) * fa + bv.astype(np.float32) * fb) + np.float32(zc), lo, hi)
    return bool(np.array_equal(want, got))


@onnx_op("QLinearMul", 1, domain=MS)
def qlinear_mul(ctx: NodeContext) -> UOp:
    """C = round((A - A_zp)(B - B_zp) * A_scale B_scale / C_scale) + C_zp."""
    a, a_s, a_z, b, b_s, b_z, c_s = _qparams(ctx, 0, 7)
    c_z = scalar(ctx.optional_input(7), "C_zero_point")
    acc = T.alu(Ops.MUL, _centered(a, a_z), _centered(b, b_z))
    factor = T.alu(Ops.DIV, T.alu(Ops.MUL, a_s.cast(F32), b_s.cast(F32)), c_s.cast(F32))
    return requantize(acc, factor, c_z, _out_type(c_z, a), F64)


@onnx_op("QLinearGlobalAveragePool", 1, domain=MS)
def qlinear_global_average_pool(ctx: NodeContext) -> UOp:
    """Y = round(sum(X - x_zp) * x_scale / (y_scale * count)) + y_zp over the spatial dims."""
    x, x_s, x_z, y_s = _qparams(ctx, 0, 4)
    y_z = scalar(ctx.optional_input(4), "y_zero_point")
    axes = list(range(1, x.ndim - 1)) if ctx.attr("channels_last", 0) else list(range(2, x.ndim))
    count = math.prod(x.shape[a] for a in axes)
    acc = T.reduce(_centered(x, x_z), Ops.ADD, axes, keepdims=True)
    factor = _ratio(x_s, T.alu(Ops.MUL, y_s.cast(F32), T.const(float(count), F32)))
    return requantize(acc, factor, y_z, _out_type(y_z, x), F64)


def _same_constants(a: UOp | None, b: UOp | None) -> bool:
    if a is None or b is None:
        return a is b
    return is_constant(a) and is_constant(b) and bool((constant_value(a) == constant_value(b)).all())


def _requantize_to(x: UOp, x_s: UOp, x_z: UOp | None, y_s: UOp, y_z: UOp | None) -> UOp:
    """x re-expressed with scale y_s and zero point y_z: QuantizeLinear(DequantizeLinear(x)); x itself
    where both are already the output's (as onnxruntime copies such inputs)."""
    if _same_constants(x_s, y_s) and _same_constants(x_z, y_z) and x.dtype == _out_type(y_z, x):
        return x
    real = T.alu(Ops.MUL, _centered(x, x_z).cast(F32), x_s.cast(F32))
    return quantize_real(real, y_s, y_z, _out_type(y_z, x))


def quantize_real(real: UOp, scale: UOp, zp: UOp | None, to: DType) -> UOp:
    """QuantizeLinear of a float32 tensor with per-tensor parameters."""
    q = un(Ops.ROUND, T.alu(Ops.DIV, real, scale.cast(F32))).cast(I32)
    if zp is not None:
        q = T.alu(Ops.ADD, q, zp.cast(I32))
    return saturate_int(q, to)


@onnx_op("QLinearConcat", 1, domain=MS)
def qlinear_concat(ctx: NodeContext) -> UOp:
    y_s, y_z = scalar(ctx.input(0), "Y_scale"), scalar(ctx.input(1), "Y_zero_point")
    if (len(ctx.inputs) - 2) % 3:
        raise Unsupported(f"inputs after Y_scale and Y_zero_point must be (tensor, scale, zero point) triples, "
                          f"got {len(ctx.inputs) - 2}")
    parts = []
    for i in range(2, len(ctx.inputs), 3):
        x, x_s, x_z = _qparams(ctx, i, 3)
        parts.append(_requantize_to(x, x_s, x_z, y_s, y_z))
    return T.concat(parts, T.norm_axis(int(ctx.attr("axis")), parts[0].ndim))


@onnx_op("QLinearSigmoid", 1, domain=MS)
def qlinear_sigmoid(ctx: NodeContext) -> UOp:
    x, x_s, x_z, y_s = _qparams(ctx, 0, 4)
    y_z = scalar(ctx.optional_input(4), "Y_zero_point")
    real = sigmoid(T.alu(Ops.MUL, _centered(x, x_z).cast(F32), x_s.cast(F32)))
    return quantize_real(real, y_s, y_z, _out_type(y_z, x))


def _per_column(p: UOp | None, n: int, what: str) -> UOp | None:
    """A scale or zero point of B: a scalar, or one value per column (of n)."""
    if p is None or math.prod(p.shape) == 1:
        return scalar(p, what)
    if p.shape != (n,):
        raise Unsupported(f"{what} of shape {p.shape} is neither a scalar nor one value per column ({n})")
    return p


@onnx_op("QGemm", 1, domain=MS)
def qgemm(ctx: NodeContext) -> UOp:
    """Y = alpha * a_scale * b_scale * ((A - a_zp)(B - b_zp) + C), requantized to y_scale / y_zero_point
    when they are given, float32 otherwise (C is int32 on the accumulator's scale)."""
    a, a_s, a_z = _qparams(ctx, 0, 3)
    b = ctx.input(3)
    if ctx.attr("transA", 0):
        a = T.permute(a, (1, 0))
    if ctx.attr("transB", 0):
        b = T.permute(b, (1, 0))
    n = b.shape[1]
    b_s, b_z = _per_column(ctx.input(4), n, "b_scale"), _per_column(ctx.optional_input(5), n, "b_zero_point")
    c, y_s = ctx.optional_input(6), scalar(ctx.optional_input(7), "y_scale")
    y_z = scalar(ctx.optional_input(8), "y_zero_point")
    acc = T.matmul(_centered(a, a_z), _centered(b, b_z))
    if c is not None:
        acc = T.alu(Ops.ADD, acc, c.cast(I32))
    scale = T.alu(Ops.MUL, T.alu(Ops.MUL, T.const(float(ctx.attr("alpha", 1.0)), F32), a_s.cast(F32)), b_s.cast(F32))
    if y_s is None:
        return T.alu(Ops.MUL, acc.cast(F32), scale)
    return requantize(acc, T.alu(Ops.DIV, scale, y_s.cast(F32)), y_z, _out_type(y_z, a), F64)


def _float_matmul_of_integers(a: UOp, a_z: UOp | None, b: UOp, b_z: UOp | None, scale: UOp, bias: UOp | None) -> UOp:
    """(A - a_zp)(B - b_zp) exactly in int32, times the float32 scale, plus the bias."""
    y = T.alu(Ops.MUL, matmul(minus_zero_point(a, a_z, a.ndim - 2), minus_zero_point(b, b_z, b.ndim - 1)).cast(F32),
              scale)
    return y if bias is None else T.alu(Ops.ADD, y, bias.cast(F32))


@onnx_op("MatMulIntegerToFloat", 1, domain=MS)
def matmul_integer_to_float(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    n = b.shape[-1]
    a_s, b_s = scalar(ctx.input(2), "a_scale"), _per_column(ctx.input(3), n, "b_scale")
    a_z, b_z = scalar(ctx.optional_input(4), "a_zero_point"), _per_column(ctx.optional_input(5), n, "b_zero_point")
    scale = T.alu(Ops.MUL, a_s.cast(F32), b_s.cast(F32))
    return _float_matmul_of_integers(a, a_z, b, b_z, scale, ctx.optional_input(6)).cast(a_s.dtype)


@onnx_op("DynamicQuantizeMatMul", 1, domain=MS)
def dynamic_quantize_matmul(ctx: NodeContext) -> UOp:
    """A quantized to uint8 as DynamicQuantizeLinear does (scale and zero point from A's range), then
    MatMulIntegerToFloat with the given quantized B."""
    a, b = ctx.input(0), ctx.input(1)
    n = b.shape[-1]
    b_s, b_z = _per_column(ctx.input(2), n, "b_scale"), _per_column(ctx.optional_input(3), n, "b_zero_point")
    qa, a_s, a_z = dynamic_quantize(a)
    scale = T.alu(Ops.MUL, a_s.cast(F32), b_s.cast(F32))
    return _float_matmul_of_integers(qa, a_z, b, b_z, scale, ctx.optional_input(4)).cast(a.dtype)


@dataclass(frozen=True)
class QuantizedWeight:
    """One direction's quantized [in, 4h] weight with its per-tensor or per-column scale and zero point."""
    q: UOp
    scale: UOp
    zp: UOp


class QuantizedLayer(Layer):
    """LSTM layer with weights W [dirs, in, 4h] and R [dirs, h, 4h] in int8/uint8. Each projection
    quantizes its activations (all of X at once for the input projection, the batch's hidden state at
    each step) to uint8 as DynamicQuantizeLinear does, multiplies exactly in int32 and scales by
    a_scale * w_scale, as onnxruntime's kernel does."""

    step_loop = False  # not yet: its per-step dynamic quantization of h is untried inside a step graph

    def __init__(self, ctx: NodeContext, scales: dict[str, tuple[UOp, UOp]]):
        super().__init__(ctx, 4, LSTM_ACTIVATIONS)
        self.scales = scales

    def _direction(self, name: str, w: UOp, d: int) -> QuantizedWeight:
        scale, zp = self.scales[name]
        g = w.shape[2]

        def per_dir(p: UOp) -> UOp:
            if math.prod(p.shape) == w.shape[0]:
                return T.reshape(T.shrink(T.reshape(p, (w.shape[0],)), [(d, d + 1)]), ())
            return T.reshape(T.shrink(p, [(d, d + 1), (0, g)]), (g,))
        return QuantizedWeight(T.reshape(T.shrink(w, [(d, d + 1), (0, w.shape[1]), (0, g)]), w.shape[1:]),
                               per_dir(scale), per_dir(zp))

    def weights(self, d: int):
        g = self.gates * self.hidden
        if self.b is None:
            wb = rb = T.const(0.0, self.x.dtype, (g,))
        else:
            bd = T.reshape(T.shrink(self.b, [(d, d + 1), (0, 2 * g)]), (2 * g,))
            wb, rb = T.shrink(bd, [(0, g)]), T.shrink(bd, [(g, 2 * g)])
        return self._direction("W", self.w, d), self._direction("R", self.r, d), wb, rb

    def project(self, a: UOp, weight: QuantizedWeight) -> UOp:
        qa, a_s, a_z = dynamic_quantize(a)
        scale = T.alu(Ops.MUL, a_s.cast(F32), weight.scale.cast(F32))
        return _float_matmul_of_integers(qa, a_z, weight.q, weight.zp, scale, None).cast(a.dtype)


@onnx_op("DynamicQuantizeLSTM", 1, domain=MS)
def dynamic_quantize_lstm(ctx: NodeContext) -> list[UOp | None]:
    scales = {"W": (ctx.input(8), ctx.input(9)), "R": (ctx.input(10), ctx.input(11))}
    return lstm_layers(ctx, QuantizedLayer(ctx, scales))
