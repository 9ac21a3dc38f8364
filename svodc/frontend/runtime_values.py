"""Inputs whose value decides an op's semantics but not its output's shape (CumSum's axis, DFT's axis)
given at run time: the op is compiled once per value the input may take, and a run-time select picks
the alternative the value names.

The set of values is finite and small by construction (an axis of a tensor of known rank), so every
alternative is an ordinary static subgraph; the kernel computes them all and keeps one (the cost is
the number of alternatives, paid only when the value is not known at compile time).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, is_constant
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def axis_choice(ctx: NodeContext, i: int, ndim: int, build: Callable[[int], UOp], what: str = "axis",
                valid: int | None = None) -> UOp:
    """build(axis) for the axis that input i (a scalar or one-element tensor, in [-ndim, ndim)) names:
    folded when the input is known at compile time, otherwise a run-time select over the axes
    0..valid-1 (default every axis; an axis out of range at run time matches no alternative and gives
    zeros). When the alternatives' shapes differ, the value decides a size: NeedsConstant, as before."""
    x = ctx.input(i)
    if T.numel(x) != 1:
        raise Unsupported(f"{what} (input {i}) must hold one value, got shape {list(x.shape)}")
    if is_constant(x) or ndim == 0:
        return build(T.norm_axis(int(np.asarray(ctx.const_input(i, what)).reshape(-1)[0]), ndim))
    alts = [build(axis) for axis in range(ndim if valid is None else valid)]
    if len({a.shape for a in alts}) > 1:
        ctx.const_input(i, what)  # raises NeedsConstant naming the graph inputs to fix
    v = T.reshape(x, ()).cast(dtypes.int64)
    out = T.scalar_like(alts[0], 0)
    for axis, alt in enumerate(alts):
        hit = T.alu(Ops.OR, T.alu(Ops.CMPEQ, v, T.const(axis, dtypes.int64)),
                    T.alu(Ops.CMPEQ, v, T.const(axis - ndim, dtypes.int64)))
        out = T.alu(Ops.WHERE, hit, alt, out)
    return out
