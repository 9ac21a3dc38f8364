"""Matrix products: MatMul and Gemm."""

from __future__ import annotations

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def matmul(a: UOp, b: UOp) -> UOp:
    """numpy.matmul, also in how emulated floats (float16, bfloat16) multiply: the products are
    summed in float32 and the sum is rounded once."""
    dt = a.dtype
    if dt.emulated and dt.is_float:
        return T.matmul(a.cast(dtypes.float32), b.cast(dtypes.float32)).cast(dt)
    return T.matmul(a, b)


@onnx_op("MatMul", 1, 9, 13)
def matmul_op(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype != b.dtype:
        raise Unsupported(f"MatMul of {a.dtype.name} x {b.dtype.name} is not supported")
    return matmul(a, b)


@onnx_op("Gemm", 1, 6, 7, 9, 11, 13)
def gemm(ctx: NodeContext) -> UOp:
    """Y = alpha * A' B' + beta * C"""
    a, b, c = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    if a.ndim != 2 or b.ndim != 2:
        raise Unsupported(f"Gemm needs 2-D A and B, got {a.shape} and {b.shape}")
    if ctx.attr("transA", 0):
        a = T.permute(a, (1, 0))
    if ctx.attr("transB", 0):
        b = T.permute(b, (1, 0))
    alpha, beta = ctx.attr("alpha", 1.0), ctx.attr("beta", 1.0)
    y = matmul(a, b)
    if alpha != 1.0:
        y = T.alu(Ops.MUL, y, T.const(alpha, y.dtype))
    if c is not None and beta != 0.0:
        if ctx.version < 7 and not ctx.attr("broadcast", 0) and c.shape != y.shape:
            raise Unsupported(f"C of shape {c.shape} needs broadcast=1 before opset 7")
        if beta != 1.0:
            c = T.alu(Ops.MUL, c, T.const(beta, c.dtype))
        y = T.alu(Ops.ADD, y, c)
    return y
