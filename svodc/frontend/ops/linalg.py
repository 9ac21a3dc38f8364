"""Matrix products: MatMul and Gemm."""

from __future__ import annotations

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


@onnx_op("MatMul", 1, 9, 13)
def matmul(ctx: NodeContext) -> UOp:
    a, b = ctx.input(0), ctx.input(1)
    if a.dtype != b.dtype or not a.dtype.is_float:
        raise Unsupported(f"MatMul of {a.dtype.name} x {b.dtype.name} is not supported")
    return T.matmul(a, b)


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
    y = T.matmul(a, b)
    if alpha != 1.0:
        y = T.alu(Ops.MUL, y, T.const(alpha, y.dtype))
    if c is not None and beta != 0.0:
        if ctx.version < 7 and not ctx.attr("broadcast", 0) and c.shape != y.shape:
            raise Unsupported(f"C of shape {c.shape} needs broadcast=1 before opset 7")
        if beta != 1.0:
            c = T.alu(Ops.MUL, c, T.const(beta, c.dtype))
        y = T.alu(Ops.ADD, y, c)
    return y
