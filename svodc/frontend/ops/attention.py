"""Attention (opsets 23-25) and RotaryEmbedding (23), following onnx.reference's definitions.

Attention is built from tensor ops: (Q*s) @ (K*s)^T with s = sqrt(scale), an optional softcap, an
additive bias (attention mask, causal frontier, sliding window, per-batch padding from
nonpad_kv_seqlen -- all of which may be run-time tensors), a softmax whose fully-masked rows are 0,
and the product with V. Grouped-query attention repeats each K/V head for its group of Q heads (a
broadcast view, not a copy). past_key/past_value are concatenated in front of K/V and returned as
present_key/present_value.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.dtypes import onnx_to_dtype
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

NEG_INF = -math.inf


def un(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def arange(n: int, shape: tuple[int, ...]) -> UOp:
    """0..n-1 as int64, reshaped to `shape` (which holds n elements)."""
    return T.reshape(UOp(Ops.WEIGHT, dtypes.int64, (), ConstData(np.arange(n, dtype=np.int64))), shape)


def to_heads(x: UOp, heads: int) -> UOp:
    """[B, S, H*D] -> [B, H, S, D]"""
    b, s, hidden = x.shape
    if hidden % heads:
        raise Unsupported(f"hidden size {hidden} does not split into {heads} heads")
    return T.permute(T.reshape(x, (b, s, heads, hidden // heads)), (0, 2, 1, 3))


def repeat_heads(x: UOp, reps: int) -> UOp:
    """[B, H, S, D] -> [B, H*reps, S, D], each head repeated reps times in a row (h0 h0 h1 h1 ...)."""
    if reps == 1:
        return x
    b, h, s, d = x.shape
    return T.reshape(T.expand(T.reshape(x, (b, h, 1, s, d)), (b, h, reps, s, d)), (b, h * reps, s, d))


def additive(allowed: UOp, dt: DType) -> UOp:
    """True -> 0, False -> -inf, in dt (select, not multiply: no 0 * inf)."""
    return T.alu(Ops.WHERE, allowed, T.const(0.0, dt, allowed.shape), T.const(NEG_INF, dt, allowed.shape))


def frontier_diff(q_len: int, kv_len: int, offset: int | UOp) -> UOp:
    """(i + offset) - j for query i and key j: [q, kv], or [B, 1, q, kv] for a per-batch offset."""
    i, j = arange(q_len, (q_len, 1)), arange(kv_len, (1, kv_len))
    if isinstance(offset, UOp):
        i = T.alu(Ops.ADD, T.reshape(i, (1, 1, q_len, 1)), T.reshape(offset, (offset.shape[0], 1, 1, 1)))
        j = T.reshape(j, (1, 1, 1, kv_len))
    elif offset:
        i = T.alu(Ops.ADD, i, T.scalar_like(i, offset))
    return T.alu(Ops.SUB, i, j)


def softmax_guarded(x: UOp) -> UOp:
    """Softmax over the last axis; a row that is all -inf gives 0s instead of NaN."""
    axis = x.ndim - 1
    m = T.reduce(x, Ops.MAX, [axis])
    safe = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, m, T.scalar_like(m, NEG_INF)), T.scalar_like(m, 0.0), m)
    e = un(Ops.EXP, T.alu(Ops.SUB, x, safe))
    total = T.reduce(e, Ops.ADD, [axis])
    total = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, total, T.scalar_like(total, 0.0)), T.scalar_like(total, 1.0), total)
    return T.alu(Ops.DIV, e, total)


@onnx_op("Attention", 23, 24, 25)
def attention(ctx: NodeContext) -> list[UOp | None]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    mask, past_k, past_v = ctx.optional_input(3), ctx.optional_input(4), ctx.optional_input(5)
    nonpad = ctx.optional_input(6) if ctx.version >= 24 else None
    if (past_k is None) != (past_v is None):
        raise Unsupported("past_key and past_value must be given together")
    if nonpad is not None and past_k is not None:
        raise Unsupported("nonpad_kv_seqlen cannot be combined with past_key/past_value")
    dt = q.dtype
    if not dt.is_float:
        raise Unsupported(f"Attention of {dt.name} is not supported")
    rank3 = q.ndim == 3
    if rank3:
        qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
        if qh is None or kvh is None:
            raise Unsupported("3-D inputs need q_num_heads and kv_num_heads")
        q, k, v = to_heads(q, qh), to_heads(k, kvh), to_heads(v, kvh)
    elif q.ndim != 4:
        raise Unsupported(f"Q of rank {q.ndim} is not 3 or 4")
    head = q.shape[3]
    scale = ctx.attr("scale")
    s = T.const(float(dt.np.type(math.sqrt(1 / math.sqrt(head) if scale is None else scale))), dt)
    if past_k is not None:
        k, v = T.concat([past_k, k], 2), T.concat([past_v, v], 2)
    present_k, present_v = k, v
    q_len, kv_len = q.shape[2], k.shape[2]
    past_len = past_k.shape[2] if past_k is not None else 0
    offset: int | UOp = past_len
    if nonpad is not None:
        nonpad = T.reshape(nonpad.cast(dtypes.int64), (nonpad.shape[0],) if nonpad.ndim else (1,))
        offset = T.alu(Ops.SUB, nonpad, T.scalar_like(nonpad, q_len))

    bias = _bias(ctx, dt, mask, q_len, kv_len, offset, nonpad)
    if q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1] or k.shape[1] != v.shape[1]:
            raise Unsupported(f"{q.shape[1]} query heads do not group over {k.shape[1]} key/value heads")
        k, v = repeat_heads(k, q.shape[1] // k.shape[1]), repeat_heads(v, q.shape[1] // k.shape[1])

    qk = matmul(T.alu(Ops.MUL, q, s), T.permute(T.alu(Ops.MUL, k, s), (0, 1, 3, 2)))
    softcap = ctx.attr("softcap")
    if softcap is not None and softcap > 0:
        qk = T.alu(Ops.MUL, un(Ops.TANH, T.alu(Ops.DIV, qk, T.scalar_like(qk, softcap))), T.scalar_like(qk, softcap))
    with_bias = qk if bias is None else T.alu(Ops.ADD, qk, bias)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    precision = ctx.attr("softmax_precision")
    logits = with_bias.cast(onnx_to_dtype(precision, "softmax_precision")) if precision is not None else with_bias
    probs = softmax_guarded(logits)
    if bias is not None:  # rows whose bias is all -inf attend nothing: 0, even where the logits are NaN
        row_max = T.reduce(bias, Ops.MAX, [bias.ndim - 1])
        masked = T.alu(Ops.CMPEQ, row_max, T.scalar_like(row_max, NEG_INF))
        probs = T.alu(Ops.WHERE, masked, T.scalar_like(probs, 0.0), probs)
    qk_out = {0: qk, 1: qk, 2: with_bias, 3: probs}.get(mode)
    if qk_out is None:
        raise Unsupported(f"qk_matmul_output_mode={mode} is not 0, 1, 2 or 3")
    y = matmul(probs.cast(dt), v)
    if rank3:
        b, h, sq, d = y.shape
        y = T.reshape(T.permute(y, (0, 2, 1, 3)), (b, sq, h * d))
    return [y, present_k if ctx.output_used(1) else None, present_v if ctx.output_used(2) else None,
            qk_out.cast(dt) if ctx.output_used(3) else None]


def _bias(ctx: NodeContext, dt: DType, mask: UOp | None, q_len: int, kv_len: int, offset: int | UOp,
          nonpad: UOp | None) -> UOp | None:
    """The additive attention bias (broadcastable to [B, H, q, kv]), or None when there is none."""
    if mask is not None and mask.shape[-1] < kv_len:  # a short mask is padded with "masked"
        pad = [(0, 0)] * (mask.ndim - 1) + [(0, kv_len - mask.shape[-1])]
        mask = T.pad(mask, pad, False if mask.dtype is dtypes.bool else NEG_INF)
    if mask is not None:
        mask = additive(mask, dt) if mask.dtype is dtypes.bool else mask.cast(dt)
    bias = mask
    if ctx.attr("is_causal", 0):
        causal = additive(T.alu(Ops.CMPLT, T.const(-1, dtypes.int64, ()), frontier_diff(q_len, kv_len, offset)), dt)
        bias = causal if bias is None else T.alu(Ops.ADD, bias, causal)
    left, right = ctx.attr("left_window_size", -1), ctx.attr("right_window_size", -1)
    if left >= 0 or right >= 0:
        diff = frontier_diff(q_len, kv_len, offset)
        allowed = T.const(True, dtypes.bool, diff.shape)
        if left >= 0:
            allowed = T.alu(Ops.AND, allowed, T.alu(Ops.CMPLT, diff, T.scalar_like(diff, left + 1)))
        if right >= 0:
            allowed = T.alu(Ops.AND, allowed, T.alu(Ops.CMPLT, T.scalar_like(diff, -right - 1), diff))
        window = additive(allowed, dt)
        bias = window if bias is None else T.alu(Ops.ADD, bias, window)
    if nonpad is not None:
        valid = T.alu(Ops.CMPLT, arange(kv_len, (1, kv_len)), T.reshape(nonpad, (nonpad.shape[0], 1)))
        padding = T.reshape(additive(valid, dt), (nonpad.shape[0], 1, 1, kv_len))
        bias = padding if bias is None else T.alu(Ops.ADD, bias, padding)
    return bias


def take_rows(table: UOp, index: UOp) -> UOp:
    """table[index] along axis 0 for a run-time integer index tensor: a select-and-sum over the rows
    (exact: one row is picked, the others add zeros). Index out of range gives zeros."""
    n = table.shape[0]
    rest = table.shape[1:]
    rows = arange(n, (n,) + (1,) * (index.ndim + len(rest)))
    hit = T.alu(Ops.CMPEQ, T.reshape(index.cast(dtypes.int64), (1, *index.shape) + (1,) * len(rest)), rows)
    view = T.reshape(table, (n,) + (1,) * index.ndim + rest)
    picked = T.alu(Ops.WHERE, hit, view, T.const(0.0, table.dtype, ()))
    return T.reduce(picked, Ops.ADD, [0], keepdims=False)


@onnx_op("RotaryEmbedding", 23)
def rotary_embedding(ctx: NodeContext) -> UOp:
    x, cos, sin, pos = ctx.input(0), ctx.input(1), ctx.input(2), ctx.optional_input(3)
    interleaved = bool(ctx.attr("interleaved", 0))
    shape = x.shape
    if x.ndim == 4:  # [B, H, S, D] -> [B, S, H, D]
        x = T.permute(x, (0, 2, 1, 3))
    elif x.ndim == 3:
        heads = ctx.attr("num_heads")
        if not heads:
            raise Unsupported("3-D input needs num_heads")
        b, s, hidden = x.shape
        x = T.reshape(x, (b, s, heads, hidden // heads))
    else:
        raise Unsupported(f"input of rank {x.ndim} is not 3 or 4")
    b, s, h, d = x.shape
    rot = ctx.attr("rotary_embedding_dim", 0) or d
    half = rot // 2
    if pos is not None:
        cos, sin = take_rows(cos, pos), take_rows(sin, pos)
    if cos.shape[-1] != half or sin.shape[-1] != half:
        raise Unsupported(f"cos/sin caches end in {cos.shape[-1]}, expected rotary_embedding_dim/2 = {half}")
    cos, sin = (T.reshape(t.cast(x.dtype), (*t.shape[:-1], 1, half)) for t in (cos, sin))
    x_rot = T.shrink(x, [(0, b), (0, s), (0, h), (0, rot)])
    if interleaved:
        x1 = T.slice_axes(x_rot, (0, 0, 0, 0), (1, 1, 1, 2), (b, s, h, half))
        x2 = T.slice_axes(x_rot, (0, 0, 0, 1), (1, 1, 1, 2), (b, s, h, half))
    else:
        x1 = T.shrink(x_rot, [(0, b), (0, s), (0, h), (0, half)])
        x2 = T.shrink(x_rot, [(0, b), (0, s), (0, h), (half, rot)])
    real = T.alu(Ops.SUB, T.alu(Ops.MUL, cos, x1), T.alu(Ops.MUL, sin, x2))
    imag = T.alu(Ops.ADD, T.alu(Ops.MUL, sin, x1), T.alu(Ops.MUL, cos, x2))
    if interleaved:
        pairs = T.concat([T.reshape(real, (b, s, h, half, 1)), T.reshape(imag, (b, s, h, half, 1))], 4)
        rotated = T.reshape(pairs, (b, s, h, rot))
    else:
        rotated = T.concat([real, imag], 3)
    out = T.concat([rotated, T.shrink(x, [(0, b), (0, s), (0, h), (rot, d)])], 3) if rot < d else rotated
    return T.reshape(out, shape) if len(shape) == 3 else T.permute(out, (0, 2, 1, 3))


@onnx_op("FlexAttention", 1, domain="ai.onnx.preview")
def flex_attention(ctx: NodeContext) -> UOp:
    """softmax((Q*s) @ (K*s)^T) @ V with s = sqrt(scale) in Q's type, the softmax and the product
    with V in softmax_precision (float32, or float64 for float64 inputs)."""
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    if q.ndim != 4 or k.ndim != 4 or v.ndim != 4:
        raise Unsupported("Q, K and V must be rank 4")
    dt = q.dtype
    if q.shape[1] % k.shape[1]:
        raise Unsupported(f"{q.shape[1]} query heads do not group over {k.shape[1]} key/value heads")
    k, v = repeat_heads(k, q.shape[1] // k.shape[1]), repeat_heads(v, q.shape[1] // k.shape[1])
    scale = ctx.attr("scale") or 1 / math.sqrt(q.shape[3])
    s = T.const(float(np.float32(math.sqrt(np.float32(scale)))), dtypes.float32).cast(dt)
    score = matmul(T.alu(Ops.MUL, q, s), T.permute(T.alu(Ops.MUL, k, s), (0, 1, 3, 2)))
    precision = ctx.attr("softmax_precision")
    p = onnx_to_dtype(precision, "softmax_precision") if precision else \
        (dtypes.float64 if dt is dtypes.float64 else dtypes.float32)
    scores = _modified(ctx, "score_mod", score.cast(p))
    probs = _modified(ctx, "prob_mod", softmax_guarded(scores))
    return matmul(probs, v.cast(p)).cast(dt)


def _modified(ctx: NodeContext, attr: str, x: UOp) -> UOp:
    """x through the node's `attr` subgraph (one rank-4 tensor in, one of the same shape out), if any."""
    if not ctx.has_attr(attr):
        return x
    outs = ctx.run_subgraph(ctx.subgraph(attr), [x])
    if len(outs) != 1 or not isinstance(outs[0], UOp) or outs[0].shape != x.shape:
        raise Unsupported(f"{attr} must give one tensor of shape {list(x.shape)}")
    return outs[0].cast(x.dtype)
