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

import math
from collections.abc import Callable

import numpy as np

from svodc.frontend.context import NodeContext, is_constant
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.runtime_dims import bounded_output
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GatherArg, Ops
from svodc.ir.uop import UOp

_I64 = dtypes.int64


def runtime_axes(ctx: NodeContext) -> UOp | None:
    """The `axes` input when it is present and known only at run time."""
    a = ctx.optional_input(1)
    return None if a is None or is_constant(a) else a


def _i64(v: np.ndarray | list[int]) -> UOp:
    return weight(np.asarray(v, dtype=np.int64))


def _masks(axes: UOp, rank: int) -> tuple[UOp, UOp]:
    """(m, valid): m [rank] bool, axis a named; valid () bool, every axis in range and none repeated."""
    k = T.numel(axes)
    named = T.reshape(axes.cast(_I64), (1, k))
    av = T.reshape(_i64(np.arange(rank)), (rank, 1))
    hit = T.alu(Ops.OR, T.alu(Ops.CMPEQ, named, av), T.alu(Ops.CMPEQ, named, T.alu(Ops.SUB, av, T.const(rank, _I64))))
    m = T.alu(Ops.CMPLT, T.const(0, _I64), T.reduce(hit.cast(_I64), Ops.ADD, [1], keepdims=False))
    valid = T.alu(Ops.CMPEQ, T.reduce(m.cast(_I64), Ops.ADD, [0], keepdims=False), T.const(k, _I64))
    return m, valid


def reduce_at_run_time(ctx: NodeContext, x: UOp, kind: str,
                       reduce_kind: Callable[[str, UOp, Callable, Callable], UOp]) -> UOp:
    axes = runtime_axes(ctx)
    assert axes is not None
    r, k, keep = x.ndim, T.numel(axes), bool(ctx.attr("keepdims", 1))
    m, valid = _masks(axes, r)

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
    # rank_of[a]: how many unnamed axes come before axis a; sel[j, a]: axis a is the j-th unnamed one
    u = T.alu(Ops.CMPEQ, m, T.const(False, dtypes.bool)).cast(_I64)
    before = _i64(np.tril(np.ones((r, r), np.int64), -1))  # before[a, b] = b < a
    rank_of = T.reduce(T.alu(Ops.MUL, T.reshape(u, (1, r)), before), Ops.ADD, [1], keepdims=False)
    js = T.reshape(_i64(np.arange(n_out)), (n_out, 1))
    sel = T.alu(Ops.MUL, T.alu(Ops.CMPEQ, T.reshape(rank_of, (1, r)), js).cast(_I64), T.reshape(u, (1, r)))

    def pick(per_axis: list[int]) -> UOp:  # [n_out]: per_axis[a] of the j-th unnamed axis a
        return T.reduce(T.alu(Ops.MUL, sel, T.reshape(_i64(per_axis), (1, r))), Ops.ADD, [1], keepdims=False)

    stride_j, dim_j = pick([math.prod(fs[a + 1:]) for a in range(r)]), pick(list(x.shape))
    bound = tuple(max(fs[j:j + k + 1]) for j in range(n_out))
    lin: UOp = T.const(0, _I64, bound)
    for j in range(n_out):  # lin[o] = sum_j o[j] * stride of the j-th unnamed axis
        pos = T.reshape(_i64(np.arange(bound[j])), tuple(bound[j] if i == j else 1 for i in range(n_out)))
        lin = T.alu(Ops.ADD, lin, T.alu(Ops.MUL, T.expand(pos, bound),
                                        T.reshape(T.shrink(stride_j, [(j, j + 1)]), (1,) * n_out)))
    flat = T.reshape(full, (math.prod(fs),))
    out = UOp(Ops.GATHER, x.dtype, (flat, T.reshape(lin, (math.prod(bound),))), GatherArg(0))
    dims = [(T.reshape(T.shrink(dim_j, [(j, j + 1)]), ()), min(x.shape[j:j + k + 1]), bound[j]) for j in range(n_out)]
    return bounded_output(ctx, T.reshape(out, bound), dims, valid, 1)
