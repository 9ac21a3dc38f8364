"""Outputs whose size a run-time value decides, within a bound known at compile time.

A handler computes such an output at its bound and says, per axis, the run-time size as a scalar
int64 UOp with its range [lo, hi]: `bounded_output` wraps it in Ops.SIZED, whose axes become value
dims named TENSOR:AXIS (computed dims of format 1.7: the kernel writes their values, the runtime
checks the status words and returns the output at its real shape; passes/value_dims.py). A bound
comes from the input's shape where the op gives one (a Slice is at most the input), else from the
user (`--dim TENSOR:AXIS=LO..HI`, `user_bound`): without it the node is refused with the flag to
paste (NeedsBound), and fixing the deciding inputs' values still works. Handlers also compute the
values' validity (axes in range, sizes that fit): an invalid run fails with an InputError.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from svodc.frontend.context import NeedsBound, NodeContext, is_constant
from svodc.frontend.dims import SUGGESTED_HI
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, GatherArg, Ops, SizedArg
from svodc.ir.uop import UOp, toposort


def weight(a: np.ndarray) -> UOp:
    return UOp(Ops.WEIGHT, dtypes.from_numpy(a.dtype), (), ConstData(a))


# An output axis: a compile-time size, or (run-time size, lo, hi).
DimValue = int | tuple[UOp, int, int]


def dim_name(ctx: NodeContext, output: int, axis: int) -> str:
    return f"{ctx.node.output[output]}:{axis}"


def bounded_output(ctx: NodeContext, at_bound: UOp, dims: list[DimValue], valid: UOp | None, input_index: int,
                   output: int = 0) -> UOp:
    """`at_bound` with its axes sized by `dims` at run time (output `output` of the node); when `valid`
    (a bool scalar) is false the run fails instead of answering. The computation assumes static input
    shapes: an input sized by a bounded dim is refused (its values must then be fixed)."""
    if any(any(ctx.bounded(v)) for v in ctx.inputs if isinstance(v, UOp)):
        _needs_values(ctx, input_index)  # raises: the handlers compute at the bound's sizes
    arg, values = [], []
    for axis, d in enumerate(dims):
        if isinstance(d, int):
            arg.append(None)
            continue
        v, lo, hi = d
        name = dim_name(ctx, output, axis)
        given = ctx.dim_bounds.get(name)
        if isinstance(given, tuple | list):
            lo = max(lo, int(given[0]))
        v = T.reshape(v, ()).cast(dtypes.int64)
        if valid is not None:
            v = T.alu(Ops.WHERE, valid, v, T.const(-1, dtypes.int64))
        arg.append((name, lo, hi))
        values.append(v)
    if not values:  # every size known (a scalar): only the validity to check, on a dim of size 1
        if valid is None:
            return at_bound
        return T.reshape(bounded_output(ctx, T.reshape(at_bound, (1,)), [(T.const(1, dtypes.int64), 1, 1)], valid,
                                        input_index, output), at_bound.shape)
    return UOp(Ops.SIZED, at_bound.dtype, (at_bound, *values), SizedArg(tuple(arg)))


def element(v: UOp, i: int) -> UOp:
    """Element i of a run-time vector, as an int64 scalar."""
    return T.reshape(T.shrink(T.reshape(v, (T.numel(v),)), [(i, i + 1)]), ()).cast(dtypes.int64)


def dense_strides(shape: Sequence[int]) -> list[int]:
    return [math.prod(shape[a + 1:]) for a in range(len(shape))]


def strided_read(x: UOp, bound: tuple[int, ...], strides: Sequence[UOp | int], offset: UOp | int = 0) -> UOp:
    """out[o] = x.flat[offset + sum_j o[j] * strides[j]] for o in the box `bound` (strides and offset
    run-time scalars or ints): a view of x whose geometry a run-time value decides, as one GATHER.
    Positions past the real size of an axis read some element of x (GATHER clamps), never past it."""
    flat = T.reshape(x, (T.numel(x),)) if T.numel(x) else T.const(0, x.dtype, (1,))
    lin: UOp = T.const(offset, dtypes.int64, bound) if isinstance(offset, int) else \
        T.expand(T.reshape(offset, (1,) * len(bound)), bound)
    for j, st in enumerate(strides):
        pos = T.reshape(weight(np.arange(bound[j], dtype=np.int64)), tuple(bound[j] if i == j else 1
                                                                          for i in range(len(bound))))
        step = T.const(st, dtypes.int64) if isinstance(st, int) else st
        lin = T.alu(Ops.ADD, lin, T.alu(Ops.MUL, T.expand(pos, bound), T.reshape(step, (1,) * len(bound))))
    return T.reshape(UOp(Ops.GATHER, x.dtype, (flat, T.reshape(lin, (math.prod(bound),))), GatherArg(0)), bound)


def named_axes(axes: UOp, rank: int) -> tuple[UOp, UOp]:
    """(m, valid) for a run-time vector of axes of a rank-`rank` tensor: m [rank] bool, axis a is named
    (as a or a - rank); valid () bool, every axis is in range and none repeats."""
    k = T.numel(axes)
    v = T.reshape(axes.cast(dtypes.int64), (1, k))
    av = T.reshape(weight(np.arange(rank, dtype=np.int64)), (rank, 1))
    hit = T.alu(Ops.OR, T.alu(Ops.CMPEQ, v, av), T.alu(Ops.CMPEQ, v, T.alu(Ops.SUB, av, T.const(rank, dtypes.int64))))
    m = T.alu(Ops.CMPLT, T.const(0, dtypes.int64), T.reduce(hit.cast(dtypes.int64), Ops.ADD, [1], keepdims=False))
    valid = T.alu(Ops.CMPEQ, T.reduce(m.cast(dtypes.int64), Ops.ADD, [0], keepdims=False), T.const(k, dtypes.int64))
    return m, valid


def _pick(sel: UOp, per_axis: Sequence[int]) -> UOp:
    """[rows]: sum over a of sel[row, a] * per_axis[a] (sel an int64 0/1 matrix choosing one axis a row)."""
    vec = T.reshape(weight(np.asarray(per_axis, dtype=np.int64)), (1, len(per_axis)))
    return T.reduce(T.alu(Ops.MUL, sel, vec), Ops.ADD, [1], keepdims=False)


def earlier(n: int) -> UOp:
    """[n, n] bool: [i, j] = j < i, from two index vectors (no n*n constant)."""
    i = weight(np.arange(n, dtype=np.int64))
    return T.alu(Ops.CMPLT, T.reshape(i, (1, n)), T.reshape(i, (n, 1)))


def count_before(u: UOp) -> UOp:
    """[n]: how many of u[j] (an int64 0/1 vector) are set for j < i (an exclusive prefix count)."""
    n = T.numel(u)
    return T.reduce(T.alu(Ops.WHERE, earlier(n), T.reshape(u, (1, n)), T.const(0, dtypes.int64)), Ops.ADD, [1],
                    keepdims=False)


def drop_named_axes(t: UOp, m: UOp, k: int, sizes: Sequence[int]) -> tuple[UOp, list[DimValue]]:
    """t without the k axes m names (read at index 0 there): output axis j is the j-th unnamed axis,
    of real size sizes[a] (t's shape bounds `sizes`: an empty axis may be 1 in t)."""
    r, fs = t.ndim, t.shape
    n_out = r - k
    sel = _sel_unnamed(m, r, n_out)
    stride, size = _pick(sel, dense_strides(fs)), _pick(sel, sizes)
    bound = tuple(max(fs[j:j + k + 1]) for j in range(n_out))
    out = strided_read(t, bound, [element(stride, j) for j in range(n_out)])
    return out, [(element(size, j), min(sizes[j:j + k + 1]), bound[j]) for j in range(n_out)]


def _sel_unnamed(m: UOp, r: int, n_out: int) -> UOp:
    """[n_out, r] int64: sel[j, a] = 1 when axis a is the j-th axis m does not name."""
    u = T.alu(Ops.CMPEQ, m, T.const(False, dtypes.bool)).cast(dtypes.int64)
    js = T.reshape(weight(np.arange(n_out, dtype=np.int64)), (n_out, 1))
    return T.alu(Ops.MUL, T.alu(Ops.CMPEQ, T.reshape(count_before(u), (1, r)), js).cast(dtypes.int64),
                 T.reshape(u, (1, r)))


def user_bound(ctx: NodeContext, output: int, axis: int, input_index: int) -> int:
    """The upper bound the user gave (`--dim TENSOR:AXIS=LO..HI`) for axis `axis` of output `output`, a
    size that input `input_index`'s value decides and nothing bounds by construction; NeedsBound without."""
    name = dim_name(ctx, output, axis)
    given = ctx.dim_bounds.get(name)
    if isinstance(given, tuple | list):
        return int(given[1])
    if isinstance(given, int):
        return given
    inputs = _graph_inputs(ctx)
    raise NeedsBound(f"output {ctx.node.output[output]!r} axis {axis}: its size depends on the run-time value of "
                     f"input {ctx.node.input[input_index]!r} and nothing bounds it; give a bound with --dim "
                     f"{name}=0..{SUGGESTED_HI} (dims={{{name!r}: (0, {SUGGESTED_HI})}}), or fix "
                     f"{', '.join(map(repr, inputs))} with --input-value", inputs, (name,))


def _graph_inputs(ctx: NodeContext) -> tuple[str, ...]:
    names = [n.arg.name for v in ctx.inputs if isinstance(v, UOp) and not is_constant(v)
             for n in toposort([v]) if n.op is Ops.INPUT]
    return tuple(dict.fromkeys(names))


def _needs_values(ctx: NodeContext, input_index: int) -> None:
    """Raise NeedsConstant naming every run-time input of the node (input `input_index` first)."""
    for i in [input_index, *range(len(ctx.inputs))]:
        if isinstance(ctx.value(i), UOp) and not is_constant(ctx.value(i)):
            ctx.const_input(i)
