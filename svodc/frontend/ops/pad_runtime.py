"""Pad's pads and CenterCropPad's shape given at run time. A pad can grow a dim without limit, so the
output is computed at the bound the user gives per axis (runtime_dims.user_bound): each axis reads
through a run-time index vector (the position minus the leading pad; folded back in for edge, reflect
and wrap), positions outside the input take the pad value. Invalid values fail the run.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.ops.view_runtime import _all, _c, _lt, _per_axis, _where
from svodc.frontend.runtime_dims import DimValue, bounded_output, element, named_axes, user_bound, weight
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

_I64 = dtypes.int64


def _rem(a: UOp, n: UOp) -> UOp:
    """a mod n in [0, n) for any sign of a (n > 0; n <= 0 gives 0, for a run that fails its checks)."""
    n = T.alu(Ops.MAX, n, _c(1))
    r = T.alu(Ops.SUB, a, T.alu(Ops.MUL, T.alu(Ops.DIV, a, n), n))
    return _where(_lt(r, _c(0)), T.alu(Ops.ADD, r, n), r)


def pad_at_run_time(ctx: NodeContext, x: UOp, mode: str, value: UOp | int | float | bool) -> UOp:
    """Axis a: out[o] reads x at o - begin (constant: the pad value outside; edge: clamped; reflect
    and wrap: folded back in), out dim d + begin + end within the bound the user gives per axis."""
    pads = ctx.input(1)
    axes = ctx.optional_input(3) if ctx.version >= 18 else None
    k = T.numel(axes) if axes is not None else x.ndim
    if T.numel(pads) != 2 * k:
        raise Unsupported(f"pads needs {2 * k} values")
    begins, ends = _per_axis(x, pads, axes, 0, k), _per_axis(x, pads, axes, 0, k, first=k)
    checks = [named_axes(axes, x.ndim)[1]] if axes is not None else []
    inside = T.const(True, dtypes.bool)
    dims: list[DimValue] = []
    out = x
    for a, d in enumerate(x.shape):
        hi = user_bound(ctx, 0, a, 1)
        b, size = begins[a], T.alu(Ops.ADD, T.alu(Ops.ADD, _c(d), begins[a]), ends[a])
        checks.append(_lt(_c(-1), size))
        dims.append((size, 0, hi))
        # negative pads crop first: the folding modes fold within the cropped [lo, lo + n)
        lo, n = T.alu(Ops.MAX, T.alu(Ops.NEG, b), _c(0)), T.alu(Ops.SUB, _c(d), T.alu(
            Ops.ADD, T.alu(Ops.MAX, T.alu(Ops.NEG, b), _c(0)), T.alu(Ops.MAX, T.alu(Ops.NEG, ends[a]), _c(0))))
        rel = T.alu(Ops.SUB, weight(np.arange(hi, dtype=np.int64)), T.reshape(T.alu(Ops.MAX, b, _c(0)), (1,)))
        ok = T.alu(Ops.AND, _lt(_c(-1), rel), _lt(rel, n))  # [hi]: inside the (cropped) input
        if mode == "constant" or d == 0:
            fold = rel
            shape = [1] * x.ndim
            shape[a] = hi
            inside = T.alu(Ops.AND, inside, T.reshape(ok, shape))
        elif mode == "edge":
            fold = T.alu(Ops.MIN, T.alu(Ops.MAX, rel, _c(0)), T.alu(Ops.SUB, n, _c(1)))
        elif mode == "wrap":
            fold = _rem(rel, n)
        else:  # reflect, period 2(n - 1); one element can only be left unpadded
            checks.append(T.alu(Ops.OR, _lt(_c(1), n), T.alu(Ops.CMPEQ, size, n)))
            period = T.alu(Ops.MUL, _c(2), T.alu(Ops.SUB, n, _c(1)))
            t = _rem(rel, period)
            fold = _where(_lt(t, n), t, T.alu(Ops.SUB, period, t))
        idx = T.alu(Ops.MIN, T.alu(Ops.MAX, T.alu(Ops.ADD, fold, T.reshape(lo, (1,))), _c(0)), _c(max(d - 1, 0)))
        out = gather_axis(out, idx, a) if d else T.const(0, x.dtype, out.shape[:a] + (hi,) + out.shape[a + 1:])
    if mode == "constant":
        fill = value.cast(x.dtype) if isinstance(value, UOp) else T.const(value, x.dtype)
        out = T.alu(Ops.WHERE, inside, out, fill)
    return bounded_output(ctx, out, dims, _all(checks), 1)


def center_crop_pad_at_run_time(ctx: NodeContext, x: UOp, axes: list[int]) -> UOp:
    """Axis a in axes: out dim s = shape[a]; a crop (s < d) starts at (d - s) // 2, a pad (s > d) puts
    (s - d) // 2 zeros first; a pad needs the bound the user gives, a crop is bounded by d."""
    shape = ctx.input(1)
    if T.numel(shape) != len(axes):
        raise Unsupported(f"shape has {T.numel(shape)} values for {len(axes)} axes")
    out, inside, dims, checks = x, T.const(True, dtypes.bool), list(x.shape), []
    for j, a in enumerate(axes):
        d, s = x.shape[a], element(shape, j)
        hi = user_bound(ctx, 0, a, 1)
        checks.append(_lt(_c(-1), s))
        half = T.alu(Ops.DIV, T.alu(Ops.SUB, _c(d), s), _c(2))  # crop: the start; pad: minus the zeros first
        shift = _where(_lt(s, _c(d)), half, T.alu(Ops.NEG, T.alu(Ops.DIV, T.alu(Ops.SUB, s, _c(d)), _c(2))))
        src = T.alu(Ops.ADD, weight(np.arange(hi, dtype=np.int64)), T.reshape(shift, (1,)))
        ok = T.alu(Ops.AND, _lt(_c(-1), src), _lt(src, _c(d)))
        view = [1] * x.ndim
        view[a] = hi
        inside = T.alu(Ops.AND, inside, T.reshape(ok, view))
        idx = T.alu(Ops.MIN, T.alu(Ops.MAX, src, _c(0)), _c(max(d - 1, 0)))
        out = gather_axis(out, idx, a) if d else T.const(0, x.dtype, out.shape[:a] + (hi,) + out.shape[a + 1:])
        dims[a] = (s, 0, hi)
    out = T.alu(Ops.WHERE, inside, out, T.const(0, x.dtype))
    return bounded_output(ctx, out, dims, _all(checks), 1)
