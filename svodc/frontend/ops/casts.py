"""Cast, CastLike and BitCast: conversions between element types.

IR CAST rounds to nearest even and does not saturate (svodc/ir/alu.py). ONNX's defaults differ for
float8 targets: saturate=1 clamps to the largest finite value first (NaN stays NaN; ±inf becomes
±max), which is what the clamp below does. float8e8m0 has its own rounding modes, built here from
the float32 bits as onnx.numpy_helper.to_float8e8m0 defines them.
"""

from __future__ import annotations

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.dtypes import onnx_to_dtype
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes, finite_max, max_value, min_value
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

SATURATING_FLOAT8 = frozenset({dtypes.float8e4m3fn, dtypes.float8e4m3fnuz, dtypes.float8e5m2,
                               dtypes.float8e5m2fnuz})
U32 = dtypes.uint32


def _u32(x: UOp, v: int) -> UOp:
    return T.const(v, U32, x.shape)


def to_float8e8m0(x: UOp, saturate: bool, round_mode: str) -> UOp:
    """The exponent of x as float8e8m0: sign ignored, inf/NaN -> 0xFF, rounding by round_mode."""
    bits = UOp(Ops.BITCAST, U32, (x.cast(dtypes.float32),))

    def field(shift: int, mask: int) -> UOp:
        return T.alu(Ops.AND, T.alu(Ops.SHR, bits, _u32(x, shift)), _u32(x, mask))

    def nonzero(mask: int) -> UOp:
        return T.alu(Ops.CMPNE, T.alu(Ops.AND, bits, _u32(x, mask)), _u32(x, 0))

    exponent = field(23, 0xFF)
    special = T.alu(Ops.CMPEQ, exponent, _u32(x, 0xFF))
    if round_mode == "nearest":
        lsb = T.alu(Ops.CMPNE, exponent, _u32(x, 0))
        tail = T.alu(Ops.OR, T.alu(Ops.OR, nonzero(0x200000), nonzero(0x1FFFFF)), lsb)
        round_up = T.alu(Ops.AND, nonzero(0x400000), tail)
    elif round_mode == "up":
        round_up = nonzero(0x7FFFFF)
    elif round_mode == "down":
        round_up = T.const(False, dtypes.bool, x.shape)
    else:
        raise Unsupported(f"round_mode={round_mode!r} is not one of 'up', 'down', 'nearest'")
    if saturate:
        round_up = T.alu(Ops.AND, round_up, T.alu(Ops.CMPNE, exponent, _u32(x, 0xFE)))
    code = T.alu(Ops.ADD, exponent, round_up.cast(U32))
    code = T.alu(Ops.WHERE, special, _u32(x, 0xFF), code)
    return UOp(Ops.BITCAST, dtypes.float8e8m0, (code.cast(dtypes.uint8),))


def cast_to(x: UOp, to: DType, saturate: bool = True, round_mode: str = "up") -> UOp:
    """ONNX Cast semantics on top of IR CAST."""
    if to is dtypes.float8e8m0 and x.dtype is not to:
        return to_float8e8m0(x, saturate, round_mode)
    if saturate and to in SATURATING_FLOAT8 and x.dtype is not to:
        hi = finite_max(to)
        if x.dtype.is_float or min_value(x.dtype) < -hi:
            x = T.alu(Ops.MAX, x, T.const(-hi, x.dtype, x.shape))
        if x.dtype.is_float or max_value(x.dtype) > hi:
            x = T.alu(Ops.MIN, x, T.const(hi, x.dtype, x.shape))
    return x.cast(to)


def _options(ctx: NodeContext) -> tuple[bool, str]:
    return bool(ctx.attr("saturate", 1)), ctx.attr("round_mode", "up")


@onnx_op("Cast", 1, 6, 9, 13, 19, 21, 23, 24, 25, 28)
def cast(ctx: NodeContext) -> UOp:
    to = ctx.attr("to")
    if ctx.version < 6 and isinstance(to, str):  # opset 1 names the type as a string
        from onnx import TensorProto

        to = TensorProto.DataType.Value(to.upper())
    return cast_to(ctx.input(0), onnx_to_dtype(int(to), where="attribute 'to'"), *_options(ctx))


@onnx_op("CastLike", 15, 19, 21, 23, 24, 25)
def cast_like(ctx: NodeContext) -> UOp:
    return cast_to(ctx.input(0), ctx.input(1).dtype, *_options(ctx))


@onnx_op("BitCast", 26)
def bitcast(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    to = ctx.dtype_attr("to")
    if to.itemsize != x.dtype.itemsize or to.bits != x.dtype.bits:
        raise Unsupported(f"BitCast from {x.dtype.name} to {to.name}: the element sizes differ")
    if x.dtype is to:
        return x
    if x.dtype is dtypes.bool or to is dtypes.bool:  # a bool is the byte 0 or 1
        return x.cast(to)
    return UOp(Ops.BITCAST, to, (x,))
