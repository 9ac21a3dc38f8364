"""Affine views: when is a chain of movement ops over a buffer a plain strided view?

A view is affine when element idx of the view lives at `offset + sum(idx[i] * strides[i])` elements
into its base buffer (a realized tensor, an INPUT or a WEIGHT). PERMUTE, EXPAND (stride 0), SLICE
and WINDOW keep a view affine; RESHAPE keeps it affine when the axes it merges are laid out one
inside the other (numpy's no-copy reshape rule); PAD never does (the padding has no address).
Contraction kernels read their operands through affine views; a non-affine operand is realized
first (e.g. the im2col copy of a padded convolution input).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from svodc.ir.ops import MOVEMENT, Ops, PadArg, PermuteArg, ShapeArg, SliceArg, WindowArg
from svodc.ir.uop import UOp


@dataclass(frozen=True)
class AffineView:
    base: UOp  # the node whose contiguous buffer the view reads
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    offset: int  # in elements


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, s = [], 1
    for d in reversed(shape):
        out.append(s)
        s *= d
    return tuple(reversed(out))


def _reshape_strides(old_shape: tuple[int, ...], old_strides: tuple[int, ...],
                     new_shape: tuple[int, ...]) -> tuple[int, ...] | None:
    """numpy's attempt_nocopy_reshape: strides for new_shape, or None if a copy would be needed."""
    old = [(d, s) for d, s in zip(old_shape, old_strides, strict=True) if d != 1]
    new_strides: list[int] = []
    i = 0
    ni = 0
    new = list(new_shape)
    while ni < len(new):
        if new[ni] == 1:
            new_strides.append(0)
            ni += 1
            continue
        # take new dims until their product matches a run of old dims
        group_new = [ni]
        pn = new[ni]
        if i >= len(old):
            return None
        group_old = [i]
        po = old[i][0]
        while pn != po:
            if pn < po:
                ni += 1
                if ni >= len(new):
                    return None
                if new[ni] != 1:
                    group_new.append(ni)
                pn *= new[ni]
            else:
                i += 1
                if i >= len(old):
                    return None
                group_old.append(i)
                po *= old[i][0]
        for a, b in itertools.pairwise(group_old):
            if old[a][1] != old[b][1] * old[b][0]:
                return None  # the merged old axes are not nested in memory
        stride = old[group_old[-1]][1]
        group_strides = []
        for j in reversed(group_new):
            group_strides.append(stride)
            stride *= new[j]
        # fill strides for this group's dims, including size-1 dims inside the group
        first = group_new[0]
        k = len(group_strides) - 1
        for j in range(first, ni + 1):
            if new[j] == 1:
                new_strides.append(0)
            else:
                new_strides.append(group_strides[k])
                k -= 1
        ni += 1
        i += 1
    if i != len(old):
        return None
    return tuple(new_strides)


def affine_view(x: UOp, is_base) -> AffineView | None:
    """The affine view x is of the first node below its movement chain for which is_base(node) holds,
    or None when x is not such a view."""
    chain = []
    n = x
    while not is_base(n):
        if n.op not in MOVEMENT:
            return None
        chain.append(n)
        n = n.src[0]
    shape, strides, offset = n.shape, contiguous_strides(n.shape), 0
    for m in reversed(chain):
        arg = m.arg
        if m.op is Ops.RESHAPE:
            assert isinstance(arg, ShapeArg)
            new = _reshape_strides(shape, strides, arg.shape)
            if new is None:
                return None
            shape, strides = arg.shape, new
        elif m.op is Ops.PERMUTE:
            assert isinstance(arg, PermuteArg)
            shape = tuple(shape[i] for i in arg.order)
            strides = tuple(strides[i] for i in arg.order)
        elif m.op is Ops.EXPAND:
            assert isinstance(arg, ShapeArg)
            strides = tuple(0 if s == 1 and d != 1 else st for s, d, st in zip(shape, arg.shape, strides, strict=True))
            shape = arg.shape
        elif m.op is Ops.SLICE:
            assert isinstance(arg, SliceArg)
            offset += sum(st * s for st, s in zip(arg.starts, strides, strict=True))
            strides = tuple(s * step for s, step in zip(strides, arg.steps, strict=True))
            shape = arg.shape
        elif m.op is Ops.WINDOW:
            assert isinstance(arg, WindowArg)
            new_strides = list(strides)
            extra = []
            for a, s, d in zip(arg.axes, arg.strides, arg.dilations, strict=True):
                new_strides[a] = strides[a] * s
                extra.append(strides[a] * d)
            strides = tuple(new_strides + extra)
            shape = m.shape
        elif m.op is Ops.PAD:
            assert isinstance(arg, PadArg)
            if any(b or a for b, a in arg.pads):
                return None
        else:
            return None
    strides = tuple(0 if d == 1 else s for d, s in zip(shape, strides, strict=True))
    return AffineView(n, tuple(shape), strides, offset)
