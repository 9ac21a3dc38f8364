"""onnxruntime's attention contrib ops (domain com.microsoft): Attention (fused QKV projection),
MultiHeadAttention, GroupQueryAttention and RotaryEmbedding, built from the same tensor ops as ONNX
Attention-23 (attention.py): scores = Q K^T * scale + bias, softmax over keys, times V.

Masks follow onnxruntime's CPU kernels: Attention and MultiHeadAttention add mask_filter_value
(default -10000) at masked and future positions; GroupQueryAttention excludes them (-inf).
GroupQueryAttention's cache is the past (fully valid) followed by the new keys: seqlens_k masks keys
at or past each row's total length, but a right-padded past is not compacted.
"""

from __future__ import annotations

import math

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.attention import (
    additive,
    arange,
    frontier_diff,
    repeat_heads,
    rotary_embedding,
    softmax_guarded,
    to_heads,
)
from svodc.frontend.ops.contrib_nn import derived
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

MS = "com.microsoft"
I64 = dtypes.int64


def _split_last(x: UOp, sizes: list[int]) -> list[UOp]:
    out, start = [], 0
    for n in sizes:
        out.append(T.shrink(x, [(0, d) for d in x.shape[:-1]] + [(start, start + n)]))
        start += n
    if start != x.shape[-1]:
        raise Unsupported(f"sizes {sizes} do not add up to the last dimension {x.shape[-1]}")
    return out


def _merge_heads(y: UOp) -> UOp:
    """[B, N, S, D] -> [B, S, N*D]"""
    b, n, s, d = y.shape
    return T.reshape(T.permute(y, (0, 2, 1, 3)), (b, s, n * d))


def _filled(allowed: UOp, dt: DType, fill: float) -> UOp:
    """True -> 0, False -> fill (an additive mask)."""
    return T.alu(Ops.WHERE, allowed, T.const(0.0, dt, allowed.shape), T.const(fill, dt, allowed.shape))


def _key_mask(mask: UOp, batch: int, q_len: int, kv_len: int) -> UOp:
    """Which keys each query may see, [B, 1, q or 1, kv] bool, from onnxruntime's mask_index forms:
    raw 0/1 [B, kv] or [B, q, kv]; right-padding lengths [B]; end then start positions [2B]."""
    j = arange(kv_len, (1, kv_len))
    if mask.ndim == 1 and mask.shape[0] in (batch, 2 * batch):
        m = mask.cast(I64)
        end = T.reshape(T.shrink(m, [(0, batch)]), (batch, 1))
        ok = T.alu(Ops.CMPLT, j, end)
        if mask.shape[0] == 2 * batch:
            start = T.reshape(T.shrink(m, [(batch, 2 * batch)]), (batch, 1))
            ok = T.alu(Ops.AND, ok, T.alu(Ops.CMPLT, T.alu(Ops.SUB, start, T.scalar_like(start, 1)), j))
        return T.reshape(ok, (batch, 1, 1, kv_len))
    if mask.ndim == 2 and mask.shape[1] == kv_len:
        return T.reshape(T.alu(Ops.CMPNE, mask, T.scalar_like(mask, 0)), (mask.shape[0], 1, 1, kv_len))
    if mask.ndim == 3 and mask.shape[1:] == (q_len, kv_len):
        return T.reshape(T.alu(Ops.CMPNE, mask, T.scalar_like(mask, 0)), (mask.shape[0], 1, q_len, kv_len))
    raise Unsupported(f"mask of shape {mask.shape} is not a supported mask_index form")


def _attend(ctx: NodeContext, q: UOp, k: UOp, v: UOp, past_len: int, mask: UOp | None, bias: UOp | None,
            fill: float) -> UOp:
    """softmax(Q K^T * scale + bias + masks) V for [B, N, S, D] heads (K/V heads grouped when fewer)."""
    dt = q.dtype
    scale = ctx.attr("scale") or 1 / math.sqrt(q.shape[3])
    if q.shape[1] != k.shape[1]:
        if q.shape[1] % k.shape[1]:
            raise Unsupported(f"{q.shape[1]} query heads do not group over {k.shape[1]} key/value heads")
        k, v = repeat_heads(k, q.shape[1] // k.shape[1]), repeat_heads(v, q.shape[1] // k.shape[1])
    scores = T.alu(Ops.MUL, matmul(q, T.permute(k, (0, 1, 3, 2))), T.const(float(scale), dt))
    softcap = ctx.attr("softcap")
    if softcap:
        scores = T.alu(Ops.MUL, UOp(Ops.TANH, dt, (T.alu(Ops.DIV, scores, T.scalar_like(scores, softcap)),)),
                       T.scalar_like(scores, softcap))
    if bias is not None:
        scores = T.alu(Ops.ADD, scores, bias.cast(dt))
    batch, q_len, kv_len = q.shape[0], q.shape[2], k.shape[2]
    allowed = None if mask is None else _key_mask(mask, batch, q_len, kv_len)
    if ctx.attr("unidirectional", 0) or ctx.attr("do_causal", 0):
        causal = T.alu(Ops.CMPLT, T.const(-1, I64, ()), frontier_diff(q_len, kv_len, past_len))
        allowed = causal if allowed is None else T.alu(Ops.AND, allowed, causal)
    if allowed is not None:
        scores = T.alu(Ops.ADD, scores, additive(allowed, dt) if fill == -math.inf else _filled(allowed, dt, fill))
    return matmul(softmax_guarded(scores), v)


def _no_attrs(ctx: NodeContext, *names: str) -> None:
    for n in names:
        if ctx.attr(n, 0):
            raise Unsupported(f"{n}={ctx.attr(n)} is not supported")


@onnx_op("Attention", 1, domain=MS)
def attention(ctx: NodeContext) -> list[UOp | None]:
    """The fused self-attention of BERT/GPT-2: QKV = input W + bias, heads, past/present as one
    [2, B, N, T, D] tensor."""
    _no_attrs(ctx, "do_rotary", "past_present_share_buffer")
    x, w, bias = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    heads = int(ctx.attr("num_heads"))
    qkv = matmul(x, w.cast(x.dtype))
    if bias is not None:
        qkv = T.alu(Ops.ADD, qkv, bias.cast(x.dtype))
    sizes = ctx.ints("qkv_hidden_sizes") or [qkv.shape[-1] // 3] * 3
    q, k, v = (to_heads(t, heads) for t in _split_last(qkv, sizes))
    past = ctx.optional_input(4)
    past_len = 0
    if past is not None:
        past_len = past.shape[3]
        pk, pv = (T.reshape(T.shrink(past, [(i, i + 1)] + [(0, d) for d in past.shape[1:]]), past.shape[1:])
                  for i in (0, 1))
        k, v = T.concat([pk, k], 2), T.concat([pv, v], 2)
    y = _attend(ctx, q, k, v, past_len, ctx.optional_input(3), ctx.optional_input(5),
                float(ctx.attr("mask_filter_value", -10000.0)))
    present = T.concat([T.reshape(k, (1, *k.shape)), T.reshape(v, (1, *v.shape))], 0) if ctx.output_used(1) else None
    return [_merge_heads(y), present]


def _projected(t: UOp, b: UOp | None, heads: int) -> UOp:
    """A [B, L, H] input plus its bias slice, as [B, N, L, D] heads; a [B, N, L, D] one as it is."""
    if t.ndim == 4:
        return t
    if t.ndim != 3:
        raise Unsupported(f"packed or rank-{t.ndim} query/key/value inputs are not supported")
    return to_heads(t if b is None else T.alu(Ops.ADD, t, b.cast(t.dtype)), heads)


@onnx_op("MultiHeadAttention", 1, domain=MS)
def multi_head_attention(ctx: NodeContext) -> list[UOp | None]:
    q_in, k_in, v_in, bias = ctx.input(0), ctx.input(1), ctx.input(2), ctx.optional_input(3)
    if ctx.optional_input(8) is not None or ctx.optional_input(9) is not None:
        raise Unsupported("past_sequence_length / cache_indirection (shared buffers, beam search) are not supported")
    heads = int(ctx.attr("num_heads"))
    bq = bk = bv = None
    if bias is not None:
        hv = v_in.shape[-1] if v_in.ndim == 3 else bias.shape[0] - 2 * q_in.shape[-1]
        bq, bk, bv = _split_last(bias, [q_in.shape[-1], q_in.shape[-1], hv])
    q, k, v = _projected(q_in, bq, heads), _projected(k_in, bk, heads), _projected(v_in, bv, heads)
    past_k, past_v = ctx.optional_input(6), ctx.optional_input(7)
    past_len = 0
    if past_k is not None and past_v is not None:
        past_len = past_k.shape[2]
        k, v = T.concat([past_k, k], 2), T.concat([past_v, v], 2)
    y = _attend(ctx, q, k, v, past_len, ctx.optional_input(4), ctx.optional_input(5),
                float(ctx.attr("mask_filter_value", -10000.0)))
    return [_merge_heads(y), k if ctx.output_used(1) else None, v if ctx.output_used(2) else None]


def _rotate(ctx: NodeContext, x: UOp, positions: UOp, cos: UOp, sin: UOp, interleaved: bool, heads: int,
            rot_dim: int) -> UOp:
    """ONNX RotaryEmbedding-23 of x ([B, S, H] or [B, N, S, D]) at positions [B, S]."""
    inner = derived(ctx, [x, cos, sin, positions], 23, interleaved=int(interleaved), num_heads=heads,
                    rotary_embedding_dim=rot_dim or None, is_packed_batching=None, scale=None)
    return rotary_embedding(inner)


@onnx_op("RotaryEmbedding", 1, domain=MS)
def contrib_rotary_embedding(ctx: NodeContext) -> UOp:
    """position_ids [B, S], or [1]: an offset, positions offset + 0..S-1."""
    _no_attrs(ctx, "is_packed_batching")
    if ctx.attr("scale", 1.0) != 1.0:
        raise Unsupported(f"scale={ctx.attr('scale')} is not supported")
    x, pos, cos, sin = ctx.input(0), ctx.input(1), ctx.input(2), ctx.input(3)
    b, s = x.shape[0], x.shape[-2]
    if T.numel(pos) == 1:
        pos = T.alu(Ops.ADD, T.reshape(pos.cast(I64), (1, 1)), arange(s, (1, s)))
    pos = T.expand(pos.cast(I64), (b, s))
    rot_dim = int(ctx.attr("rotary_embedding_dim", 0))
    heads = int(ctx.attr("num_heads", 0))
    if x.ndim == 3 and not heads:
        heads = x.shape[2] // (rot_dim or 2 * cos.shape[1])
    return _rotate(ctx, x, pos, cos, sin, bool(ctx.attr("interleaved", 0)), heads, rot_dim)


@onnx_op("GroupQueryAttention", 1, domain=MS)
def group_query_attention(ctx: NodeContext) -> list[UOp | None]:
    _no_attrs(ctx, "smooth_softmax", "qk_output", "sliding_window_cache", "kv_cache_bit_width")
    for i, what in ((11, "head_sink"), (12, "k_scale"), (13, "v_scale"), (14, "q_norm_weight"), (16, "query_seqlens")):
        if ctx.optional_input(i) is not None:
            raise Unsupported(f"input {what} is not supported")
    q_in, k_in, v_in = ctx.input(0), ctx.optional_input(1), ctx.optional_input(2)
    heads, kv_heads = int(ctx.attr("num_heads")), int(ctx.attr("kv_num_heads"))
    if k_in is None:  # packed QKV
        d = q_in.shape[-1] // (heads + 2 * kv_heads)
        q_in, k_in, v_in = _split_last(q_in, [heads * d, kv_heads * d, kv_heads * d])
    q, k, v = to_heads(q_in, heads), to_heads(k_in, kv_heads), to_heads(v_in, kv_heads)
    past_k, past_v = ctx.optional_input(3), ctx.optional_input(4)
    past_len = past_k.shape[2] if past_k is not None else 0
    b, s = q.shape[0], q.shape[2]
    if ctx.attr("do_rotary", 0):
        pos = ctx.optional_input(10)
        pos = T.alu(Ops.ADD, arange(s, (1, s)), T.const(past_len, I64)) if pos is None else pos.cast(I64)
        pos = T.expand(pos, (b, s))
        cos, sin, inter = ctx.input(7), ctx.input(8), bool(ctx.attr("rotary_interleaved", 0))
        q = _rotate(ctx, q, pos, cos, sin, inter, heads, 0)
        k = _rotate(ctx, k, pos, cos, sin, inter, kv_heads, 0)
    if past_k is not None and past_v is not None:
        k, v = T.concat([past_k, k], 2), T.concat([past_v, v], 2)
    total = k.shape[2]
    # keys at or past each row's total length (seqlens_k + 1) are excluded, as are future ones
    lens = T.alu(Ops.ADD, ctx.input(5).cast(I64), T.const(1, I64))
    allowed = T.reshape(T.alu(Ops.CMPLT, arange(total, (1, total)), T.reshape(lens, (b, 1))), (b, 1, 1, total))
    diff = frontier_diff(s, total, past_len)
    allowed = T.alu(Ops.AND, allowed, T.alu(Ops.CMPLT, T.const(-1, I64, ()), diff))
    window = int(ctx.attr("local_window_size", -1))  # a query sees itself and the window - 1 keys before it
    if window >= 0:
        allowed = T.alu(Ops.AND, allowed, T.alu(Ops.CMPLT, diff, T.scalar_like(diff, window)))
    bias = additive(allowed, q.dtype)
    extra = ctx.optional_input(15)
    if extra is not None:
        bias = T.alu(Ops.ADD, bias, extra.cast(q.dtype))
    y = _attend(ctx, q, k, v, past_len, None, bias, -math.inf)
    return [_merge_heads(y), k if ctx.output_used(1) else None, v if ctx.output_used(2) else None]
