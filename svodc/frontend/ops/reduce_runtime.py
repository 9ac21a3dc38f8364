"""Reduce* with its axes a run-time input (the `axes` input of ReduceSum-13 and the others' opset 18).

Which axes are reduced is known only at run time, but every output dim is bounded by construction:
with keepdims it is 1 or the input's dim, without it output axis j is one of input axes j..j+k (k
named axes). The output is computed at that bound and its dims are computed dims (written by the
kernel, checked against their bounds by the runtime):

- masks: m[a] says whether axis a is named (as a or a - rank); the axes are valid when every one is
  in range and none repeats (sum(m) == k), otherwise the dims are set out of their bounds, so the
  run fails with an InputError instead of answering;
- the reduction is one masked step per axis: t = m[a] ? broadcast(reduce(t, a)) : t, so after the
  last step every element holds the reduction over the named axes of its position (associative
  ops; Reduce{kind}'s prologue and epilogue wrap it, reduction.reduce_kind);
- keepdims: that tensor is the output at its bound (the real output is its prefix box, size 1 on the
  named axes); otherwise a GATHER reads, at output position o, the element whose j-th unnamed axis
  is o[j] (strides chosen by the masks, index arithmetic on rank-sized vectors).
"""

from __future__ import annotations

from collections.abc import Callable

from svodc.frontend.context import NodeContext, is_constant
from svodc.frontend.runtime_dims import bounded_output, drop_named_axes, named_axes
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

_I64 = dtypes.int64


def runtime_axes(ctx: NodeContext) -> UOp | None:
    """The `axes` input when it is present and known only at run time."""
    a = ctx.optional_input(1)
    return None if a is None or is_constant(a) else a


def reduce_at_run_time(ctx: NodeContext, x: UOp, kind: str,
                       reduce_kind: Callable[[str, UOp, Callable, Callable], UOp]) -> UOp:
    axes = runtime_axes(ctx)
    assert axes is not None
    r, k, keep = x.ndim, T.numel(axes), bool(ctx.attr("keepdims", 1))
    m, valid = named_axes(axes, r)

    def named(a: int, shape: tuple[int, ...]) -> UOp:
        return T.reshape(T.shrink(m, [(a, a + 1)]), shape)

    def red(t: UOp, op: Ops) -> UOp:
        for a in range(r):  # an empty axis reduces to the identity whether named or not (if not, it stays empty)
            t = T.reduce(t, op, [a]) if t.shape[a] == 0 else \
                T.alu(Ops.WHERE, named(a, (1,) * r), T.expand(T.reduce(t, op, [a]), t.shape), t)
        return t

    full = reduce_kind(kind, x, red, lambda: red(T.const(1, x.dtype, x.shape), Ops.ADD))
    fs = full.shape  # x.shape with empty axes at 1
    if keep:  # dim a: 1 where named, else the input's
        dims = [(T.alu(Ops.WHERE, named(a, ()), T.const(1, _I64), T.const(d, _I64)), min(1, d), fs[a])
                for a, d in enumerate(x.shape)]
        return bounded_output(ctx, full, dims, valid, 1)
    n_out = r - k
    if n_out <= 0:  # every axis reduced (when valid): a scalar
        return bounded_output(ctx, T.reshape(T.shrink(full, [(0, 1)] * r), ()), [], valid, 1)
    out, dims = drop_named_axes(full, m, k, x.shape)
    return bounded_output(ctx, out, dims, valid, 1)
