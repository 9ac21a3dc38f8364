"""onnxruntime's fused float contrib ops (domain com.microsoft), as its transformer optimizer and graph
optimizer emit them: Gelu, BiasGelu, FastGelu, FusedMatMul, FusedConv, SkipLayerNormalization,
EmbedLayerNormalization. Each is the composition of the plain ops it fuses (onnxruntime's
ContribOperators.md), so the compiler's matmul, convolution and normalization paths apply.
"""

from __future__ import annotations

import math

import onnx
from onnx import helper

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.activations import hard_sigmoid, in_float32, sigmoid
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.ops.nn import conv_from_attrs
from svodc.frontend.ops.normalization import inv_std, moments
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

MS = "com.microsoft"


def derived(ctx: NodeContext, inputs: list, version: int, **attrs) -> NodeContext:
    """A context for the plain ONNX op a contrib op reduces to: the same node with `inputs`, at
    op `version`, attributes replaced by `attrs` (None removes one)."""
    node = onnx.NodeProto()
    node.CopyFrom(ctx.node)
    keep = [a for a in node.attribute if a.name not in attrs]
    del node.attribute[:]
    node.attribute.extend(keep)
    node.attribute.extend(helper.make_attribute(k, v) for k, v in attrs.items() if v is not None)
    return NodeContext(node, inputs, version, version)


def _c(x: UOp, v: float) -> UOp:
    return T.scalar_like(x, v)


def _float(ctx: NodeContext, i: int) -> UOp:
    x = ctx.input(i)
    if not x.dtype.is_float:
        raise Unsupported(f"{ctx.node.op_type} of {x.dtype.name} is not supported")
    return x


def erf_gelu(x: UOp) -> UOp:
    """0.5 x (1 + erf(x / sqrt 2))"""
    gate = UOp(Ops.ERF, x.dtype, (T.alu(Ops.MUL, x, _c(x, 1 / math.sqrt(2))),))
    return T.alu(Ops.MUL, T.alu(Ops.MUL, _c(x, 0.5), x), T.alu(Ops.ADD, _c(x, 1.0), gate))


def tanh_gelu(x: UOp) -> UOp:
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))"""
    cube = T.alu(Ops.MUL, x, T.alu(Ops.MUL, x, x))
    inner = T.alu(Ops.MUL, _c(x, math.sqrt(2 / math.pi)), T.alu(Ops.ADD, x, T.alu(Ops.MUL, _c(x, 0.044715), cube)))
    gate = UOp(Ops.TANH, x.dtype, (inner,))
    return T.alu(Ops.MUL, T.alu(Ops.MUL, _c(x, 0.5), x), T.alu(Ops.ADD, _c(x, 1.0), gate))


def _with_bias(ctx: NodeContext, x: UOp, i: int) -> UOp:
    b = ctx.optional_input(i)
    return x if b is None else T.alu(Ops.ADD, x, b.cast(x.dtype))


@onnx_op("Gelu", 1, domain=MS)
def gelu(ctx: NodeContext) -> UOp:
    return in_float32(erf_gelu)(_float(ctx, 0))


@onnx_op("BiasGelu", 1, domain=MS)
def bias_gelu(ctx: NodeContext) -> UOp:
    return in_float32(erf_gelu)(_with_bias(ctx, _float(ctx, 0), 1))


@onnx_op("FastGelu", 1, domain=MS)
def fast_gelu(ctx: NodeContext) -> UOp:
    return in_float32(tanh_gelu)(_with_bias(ctx, _float(ctx, 0), 1))


def _swap_last(x: UOp) -> UOp:
    if x.ndim < 2:
        raise Unsupported(f"cannot transpose the last two axes of a rank-{x.ndim} tensor")
    return T.permute(x, tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


@onnx_op("FusedMatMul", 1, domain=MS)
def fused_matmul(ctx: NodeContext) -> UOp:
    """alpha * matmul(A', B'), ' transposing the last two axes where transA / transB ask."""
    a, b = _float(ctx, 0), _float(ctx, 1)
    if ctx.attr("transBatchA", 0) or ctx.attr("transBatchB", 0):
        raise Unsupported("transBatchA / transBatchB are not supported")
    if ctx.attr("transA", 0):
        a = _swap_last(a)
    if ctx.attr("transB", 0):
        b = _swap_last(b)
    y = matmul(a, b)
    alpha = float(ctx.attr("alpha", 1.0))
    return y if alpha == 1.0 else T.alu(Ops.MUL, y, T.const(alpha, y.dtype))


def _activation(name: str, params: list[float], x: UOp) -> UOp:
    """FusedConv's activations (onnxruntime's MLAS activation kinds) with their parameters."""
    if name == "Relu":
        return T.alu(Ops.MAX, x, _c(x, 0.0))
    if name == "Tanh":
        return UOp(Ops.TANH, x.dtype, (x,))
    if name == "Sigmoid":
        return sigmoid(x)
    if name == "LeakyRelu":
        alpha = params[0] if params else 0.01
        return T.alu(Ops.WHERE, T.alu(Ops.CMPLT, x, _c(x, 0.0)), T.alu(Ops.MUL, x, _c(x, alpha)), x)
    if name == "Clip":
        lo, hi = (params + [-math.inf, math.inf][len(params):])[:2]
        return T.alu(Ops.MIN, T.alu(Ops.MAX, x, _c(x, lo)), _c(x, hi))
    if name == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params):])[:2]
        return hard_sigmoid(x, alpha, beta)
    raise Unsupported(f"FusedConv activation {name!r} is not supported")


@onnx_op("FusedConv", 1, domain=MS)
def fused_conv(ctx: NodeContext) -> UOp:
    """activation(Conv(X, W, B) + Z)"""
    y = conv_from_attrs(ctx, _float(ctx, 0), ctx.input(1), ctx.optional_input(2))
    y = _with_bias(ctx, y, 3)
    name = ctx.attr("activation")
    return y if not name else _activation(name, [float(p) for p in ctx.attr("activation_params") or []], y)


def layer_norm_last(x: UOp, gamma: UOp, beta: UOp | None, eps: float) -> tuple[UOp, UOp, UOp]:
    """LayerNormalization over the last axis: (y, mean, 1/std), the statistics with the axis kept."""
    m, diff, var = moments(x, [x.ndim - 1])
    inv = inv_std(var, eps)
    y = T.alu(Ops.MUL, T.alu(Ops.MUL, diff, inv), gamma.cast(x.dtype))
    return (y if beta is None else T.alu(Ops.ADD, y, beta.cast(x.dtype))), m, inv


@onnx_op("SkipLayerNormalization", 1, domain=MS)
def skip_layer_norm(ctx: NodeContext) -> list[UOp | None]:
    """LayerNorm(input + skip + bias) over the last axis; also the statistics and the sum."""
    x = _float(ctx, 0)
    total = _with_bias(ctx, T.alu(Ops.ADD, x, ctx.input(1).cast(x.dtype)), 4)
    eps = float(ctx.attr("epsilon", 1e-12))

    def norm(t: UOp) -> UOp:
        return layer_norm_last(t, ctx.input(2), ctx.optional_input(3), eps)[0]

    y = in_float32(norm)(total)
    stats = layer_norm_last(total.cast(dtypes.float32), ctx.input(2), None, eps) if (
        ctx.output_used(1) or ctx.output_used(2)) else None
    return [y, stats[1] if stats and ctx.output_used(1) else None,
            stats[2] if stats and ctx.output_used(2) else None, total if ctx.output_used(3) else None]


def _positions(ctx: NodeContext, batch: int, seq: int) -> UOp:
    """position_ids [B, S] or [1, S], or 0..S-1 for every batch entry."""
    pos = ctx.optional_input(8)
    if pos is None:
        from svodc.frontend.ops.attention import arange

        return T.expand(arange(seq, (1, seq)), (batch, seq))
    return T.expand(pos.cast(dtypes.int64), (batch, seq))


@onnx_op("EmbedLayerNormalization", 1, domain=MS)
def embed_layer_norm(ctx: NodeContext) -> list[UOp | None]:
    """LayerNorm(word[input_ids] + position[position_ids] + segment[segment_ids]); mask_index is the
    number of non-zero mask entries per batch row (int32), and embedding_sum the sum before the norm."""
    ids, seg_ids = ctx.input(0), ctx.optional_input(1)
    word, pos_table, seg_table = ctx.input(2), ctx.input(3), ctx.optional_input(4)
    b, s = ids.shape
    total = T.alu(Ops.ADD, gather_axis(word, ids.cast(dtypes.int64), 0),
                  gather_axis(pos_table, _positions(ctx, b, s), 0))
    if seg_ids is not None and seg_table is not None:
        total = T.alu(Ops.ADD, total, gather_axis(seg_table, seg_ids.cast(dtypes.int64), 0))
    y = in_float32(lambda t: layer_norm_last(t, ctx.input(5), ctx.input(6), float(ctx.attr("epsilon", 1e-12)))[0])(
        total)
    mask = ctx.optional_input(7)
    if mask is not None:
        nonzero = T.alu(Ops.CMPNE, mask, T.scalar_like(mask, 0)).cast(dtypes.int32)
        mask_index = T.reduce(nonzero, Ops.ADD, [1], keepdims=False)
    else:
        mask_index = T.const(s, dtypes.int32, (b,)) if ctx.output_used(1) else None
    return [y, mask_index if ctx.output_used(1) else None, total if ctx.output_used(2) else None]
