"""Tensor-level graph construction: numpy-like helpers over UOps.

Frontend handlers and decomposition passes build graphs with these, so broadcasting, axis
normalization and the no-op cases (reshape to the same shape, identity permutation) are decided in
one place. Every helper returns a UOp; none computes anything.
"""

from __future__ import annotations

from collections.abc import Sequence

from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import (
    COMPARE,
    ConvArg,
    Ops,
    PadArg,
    PermuteArg,
    ReduceArg,
    ShapeArg,
    SliceArg,
    WindowArg,
)
from svodc.ir.shapes import ShapeError, prod
from svodc.ir.uop import UOp


def norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ShapeError(f"axis {axis} is out of range for rank {ndim}")
    return axis % ndim if ndim else 0


def const(value: int | float | bool, dtype: DType, shape: Sequence[int] = ()) -> UOp:
    c = UOp.const(dtype, value)
    return expand(reshape(c, (1,) * len(shape)), tuple(shape)) if shape else c


def reshape(x: UOp, shape: Sequence[int]) -> UOp:
    shape = tuple(shape)
    return x if x.shape == shape else UOp(Ops.RESHAPE, x.dtype, (x,), ShapeArg(shape))


def permute(x: UOp, order: Sequence[int]) -> UOp:
    order = tuple(order)
    return x if order == tuple(range(len(order))) else UOp(Ops.PERMUTE, x.dtype, (x,), PermuteArg(order))


def expand(x: UOp, shape: Sequence[int]) -> UOp:
    shape = tuple(shape)
    return x if x.shape == shape else UOp(Ops.EXPAND, x.dtype, (x,), ShapeArg(shape))


def broadcast_shape(*shapes: Sequence[int]) -> tuple[int, ...]:
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(f"shapes {[tuple(s) for s in shapes]} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(x: UOp, shape: Sequence[int]) -> UOp:
    shape = tuple(shape)
    if len(x.shape) > len(shape):
        raise ShapeError(f"cannot broadcast {x.shape} to {shape}")
    x = reshape(x, (1,) * (len(shape) - len(x.shape)) + x.shape)
    return expand(x, shape)


def broadcast(*xs: UOp) -> list[UOp]:
    shape = broadcast_shape(*(x.shape for x in xs))
    return [broadcast_to(x, shape) for x in xs]


def cast(x: UOp, dtype: DType) -> UOp:
    return x.cast(dtype)


def alu(op: Ops, *xs: UOp) -> UOp:
    """An elementwise op with numpy broadcasting. Comparisons produce bool; WHERE takes (c, a, b)."""
    xs = tuple(broadcast(*xs))
    if op in COMPARE:
        dt = dtypes.bool
    elif op is Ops.WHERE:
        dt = xs[1].dtype
    else:
        dt = xs[0].dtype
    return UOp(op, dt, xs)


def scalar_like(x: UOp, value: int | float | bool) -> UOp:
    return const(value, x.dtype, x.shape)


def reduce(x: UOp, op: Ops, axes: Sequence[int], keepdims: bool = True) -> UOp:
    axes = tuple(sorted({norm_axis(a, x.ndim) for a in axes}))
    out = UOp(Ops.REDUCE, x.dtype, (x,), ReduceArg(op, axes)) if axes else x
    if keepdims:
        return out
    return reshape(out, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def pad(x: UOp, pads: Sequence[tuple[int, int]], value: int | float | bool = 0) -> UOp:
    pads = tuple((int(b), int(a)) for b, a in pads)
    if all(b == 0 and a == 0 for b, a in pads):
        return x
    return UOp(Ops.PAD, x.dtype, (x,), PadArg(pads, value))


def slice_axes(x: UOp, starts: Sequence[int], steps: Sequence[int], shape: Sequence[int],
               from_front: bool = False) -> UOp:
    if tuple(shape) == x.shape and all(s == 0 for s in starts) and all(s == 1 for s in steps):
        return x
    return UOp(Ops.SLICE, x.dtype, (x,), SliceArg(tuple(starts), tuple(steps), tuple(shape), from_front))


def shrink(x: UOp, bounds: Sequence[tuple[int, int]]) -> UOp:
    """x[b0:e0, b1:e1, ...]"""
    return slice_axes(x, [b for b, _ in bounds], [1] * len(bounds), [e - b for b, e in bounds])


def window(x: UOp, axes: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
           dilations: Sequence[int]) -> UOp:
    return UOp(Ops.WINDOW, x.dtype, (x,), WindowArg(tuple(axes), tuple(kernel), tuple(strides), tuple(dilations)))


def concat(xs: Sequence[UOp], axis: int) -> UOp:
    """Concatenation as a select over padded views: exact for every value (no arithmetic), and each
    output element reads exactly one source."""
    xs = list(xs)
    if len(xs) == 1:
        return xs[0]
    axis = norm_axis(axis, xs[0].ndim)
    total = sum(x.shape[axis] for x in xs)
    out: UOp | None = None
    offset = total
    for x in reversed(xs):
        size = x.shape[axis]
        offset -= size
        if size == 0:
            continue
        pads = [(0, 0)] * x.ndim
        pads[axis] = (offset, total - offset - size)
        placed = pad(x, pads)
        if out is None:
            out = placed
        else:
            inside = pad(const(True, dtypes.bool, x.shape), pads, False)
            out = UOp(Ops.WHERE, x.dtype, (inside, placed, out))
    if out is None:
        raise ShapeError("concat of empty tensors only")
    return out


def matmul(a: UOp, b: UOp) -> UOp:
    """numpy.matmul semantics: 1-D operands are promoted and the added axis removed again."""
    a1, b1 = a.ndim == 1, b.ndim == 1
    if a1:
        a = reshape(a, (1, a.shape[0]))
    if b1:
        b = reshape(b, (b.shape[0], 1))
    batch = broadcast_shape(a.shape[:-2], b.shape[:-2])
    a = broadcast_to(a, batch + a.shape[-2:])
    b = broadcast_to(b, batch + b.shape[-2:])
    out = UOp(Ops.MATMUL, a.dtype, (a, b))
    shape = list(out.shape)
    if b1:
        shape.pop(-1)
    if a1:
        shape.pop(-2 if not b1 else -1)
    return reshape(out, tuple(shape))


def conv(x: UOp, w: UOp, strides: Sequence[int], dilations: Sequence[int], pads: Sequence[tuple[int, int]],
         groups: int) -> UOp:
    return UOp(Ops.CONV, x.dtype, (x, w), ConvArg(tuple(strides), tuple(dilations),
                                                   tuple((int(b), int(e)) for b, e in pads), groups))


def numel(x: UOp) -> int:
    return prod(x.shape)
