"""LinearAttention (opset 27): the recurrent state update of linear / gated / delta / gated-delta
attention, unrolled over the (compile-time) sequence length and computed in float32.

S_t = exp(g_t) * S_{t-1} + k_t (x) v'_t with v'_t = beta_t * (v_t - S^T k_t) for the delta rules;
o_t = scale * q_t^T S_t, each KV head's state shared by its group of query heads.
"""

from __future__ import annotations

import math

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.attention import repeat_heads, to_heads
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

F32 = dtypes.float32


def at_step(x: UOp, i: int) -> UOp:
    """x[:, :, i, :] of a [B, H, T, D] tensor -> [B, H, D]."""
    b, h, _, d = x.shape
    return T.reshape(T.shrink(x, [(0, b), (0, h), (i, i + 1), (0, d)]), (b, h, d))


def mul(a: UOp, b: UOp) -> UOp:
    return T.alu(Ops.MUL, a, b)


@onnx_op("LinearAttention", 27)
def linear_attention(ctx: NodeContext) -> list[UOp | None]:
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    past, decay, beta = ctx.optional_input(3), ctx.optional_input(4), ctx.optional_input(5)
    rule = ctx.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise Unsupported(f"update_rule={rule!r} is not linear, gated, delta or gated_delta")
    qh, kvh = ctx.attr("q_num_heads"), ctx.attr("kv_num_heads")
    if not qh or not kvh or qh % kvh:
        raise Unsupported(f"q_num_heads={qh} must be a positive multiple of kv_num_heads={kvh}")
    gating, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gating != (decay is not None) or delta != (beta is not None):
        raise Unsupported(f"update_rule {rule!r} needs decay: {gating}, beta: {delta}")
    if q.ndim != 3 or k.ndim != 3 or v.ndim != 3:
        raise Unsupported("query, key and value must be rank 3 [B, T, H*D]")
    out_dtype = q.dtype
    b, t, _ = q.shape
    q4, k4, v4 = (to_heads(x.cast(F32), n) for x, n in ((q, qh), (k, kvh), (v, kvh)))
    dk, dv = q4.shape[3], v4.shape[3]
    if decay is not None:
        per_head = decay.shape[-1] == kvh
        decay4 = to_heads(decay.cast(F32), kvh)  # [B, Hkv, T, 1 or dk]
        if not per_head and decay4.shape[3] != dk:
            raise Unsupported(f"decay's last dim {decay.shape[-1]} is neither {kvh} nor {kvh * dk}")
    if beta is not None:
        if beta.shape[-1] not in (kvh, 1):
            raise Unsupported(f"beta's last dim {beta.shape[-1]} is neither {kvh} nor 1")
        beta4 = to_heads(beta.cast(F32), beta.shape[-1])  # [B, Hkv or 1, T, 1]
    state = past.cast(F32) if past is not None else T.const(0.0, F32, (b, kvh, dk, dv))
    if state.shape != (b, kvh, dk, dv):
        raise Unsupported(f"past_state has shape {state.shape}, expected {(b, kvh, dk, dv)}")
    scale = ctx.attr("scale") or 1 / math.sqrt(dk)
    outs = []
    for i in range(t):
        q_t, k_t, v_t = at_step(q4, i), at_step(k4, i), at_step(v4, i)
        if gating:
            g = UOp(Ops.EXP, F32, (at_step(decay4, i),))  # [B, Hkv, 1 or dk]
            state = mul(state, T.reshape(g, (b, kvh, decay4.shape[3], 1)))
        if delta:
            retrieved = T.reduce(mul(state, T.reshape(k_t, (b, kvh, dk, 1))), Ops.ADD, [2], keepdims=False)
            v_t = mul(at_step(beta4, i), T.alu(Ops.SUB, v_t, retrieved))
        state = T.alu(Ops.ADD, state, mul(T.reshape(k_t, (b, kvh, dk, 1)), T.reshape(v_t, (b, kvh, 1, dv))))
        read = repeat_heads(state, qh // kvh)
        o_t = T.reduce(mul(T.reshape(q_t, (b, qh, dk, 1)), read), Ops.ADD, [2], keepdims=False)
        outs.append(T.reshape(mul(o_t, T.const(scale, F32, ())), (b, qh, 1, dv)))
    out = T.concat(outs, 2)
    out = T.reshape(T.permute(out, (0, 2, 1, 3)), (b, t, qh * dv)).cast(out_dtype)
    present = state.cast(past.dtype if past is not None else out_dtype)
    return [out, present if ctx.output_used(1) else None]
