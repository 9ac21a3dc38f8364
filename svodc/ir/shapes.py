"""Shape inference: the output shape of each tensor-level op from its sources and argument.

Loop-level nodes (PARAM, RANGE, LOAD, STORE, LOOP_REDUCE and scalar ALU on them) have shape ().
Errors here are compiler bugs or invalid graphs built by a frontend handler: they raise ShapeError
with the op and the shapes involved. Each op's argument type is the spec's to check (ir/spec.py).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from svodc.ir.ops import ALU, ConstData, Ops

if TYPE_CHECKING:
    from svodc.ir.uop import UOp


class ShapeError(ValueError):
    pass


def prod(xs) -> int:
    return math.prod(xs)


def reshape_groups(out_shape: tuple, src_shape: tuple) -> list[tuple[list[int], list[int]]]:
    """A reshape's axes grouped where the running products of both shapes agree: (output axes, source
    axes) per group, in order. Only a group of more than one axis on either side merges or splits."""
    groups = []
    i = j = 0
    while i < len(out_shape) or j < len(src_shape):
        gi, gj = [i], [j]
        po = out_shape[i] if i < len(out_shape) else 1
        ps = src_shape[j] if j < len(src_shape) else 1
        i, j = i + 1, j + 1
        while po != ps:
            if po < ps:
                po *= out_shape[i]
                gi.append(i)
                i += 1
            else:
                ps *= src_shape[j]
                gj.append(j)
                j += 1
        groups.append(([a for a in gi if a < len(out_shape)], [a for a in gj if a < len(src_shape)]))
    return groups


def window_out(size: int, kernel: int, stride: int, dilation: int) -> int:
    span = (kernel - 1) * dilation + 1
    if size < span:
        raise ShapeError(f"window of span {span} does not fit in axis of size {size}")
    return (size - span) // stride + 1


def infer_shape(n: UOp) -> tuple:
    op, arg = n.op, n.arg
    if op in (Ops.SINK, Ops.PARAM, Ops.RANGE, Ops.LOAD, Ops.STORE, Ops.LOOP_REDUCE, Ops.DEFINE_VAR, Ops.CONST,
              Ops.GEMM):
        return ()
    if op is Ops.INPUT:
        return arg.shape
    if op is Ops.WEIGHT:
        assert isinstance(arg, ConstData)
        return arg.shape
    if op in ALU:
        shapes = {s.shape for s in n.src}
        if len(shapes) != 1:
            raise ShapeError(f"{op.name}: sources have different shapes {[s.shape for s in n.src]}")
        return n.src[0].shape
    src = n.src[0].shape if n.src else ()
    if op is Ops.RESHAPE:
        if prod(arg.shape) != prod(src):
            raise ShapeError(f"RESHAPE {src} -> {arg.shape}: element counts differ")
        return arg.shape
    if op is Ops.PERMUTE:
        if sorted(arg.order) != list(range(len(src))):
            raise ShapeError(f"PERMUTE {arg.order} is not a permutation of {len(src)} axes")
        return tuple(src[i] for i in arg.order)
    if op is Ops.EXPAND:
        if len(arg.shape) != len(src) or any(s != d and s != 1 for s, d in zip(src, arg.shape, strict=True)):
            raise ShapeError(f"EXPAND {src} -> {arg.shape}: only size-1 axes can grow")
        return arg.shape
    if op is Ops.PAD:
        if len(arg.pads) != len(src) or any(b < 0 or a < 0 for b, a in arg.pads):
            raise ShapeError(f"PAD {arg.pads} does not fit shape {src}")
        return tuple(s + b + a for s, (b, a) in zip(src, arg.pads, strict=True))
    if op is Ops.SLICE:
        for s, st, step, out in zip(src, arg.starts, arg.steps, arg.shape, strict=True):
            last = st + (out - 1) * step
            if (out and not (0 <= st < s and 0 <= last < s)) or step == 0:
                raise ShapeError(f"SLICE start {st} step {step} size {out} outside axis of size {s}")
        return arg.shape
    if op is Ops.WINDOW:
        out = list(src)
        for a, k, st, d in zip(arg.axes, arg.kernel, arg.strides, arg.dilations, strict=True):
            out[a] = window_out(src[a], k, st, d)
        return tuple(out) + tuple(arg.kernel)
    if op is Ops.REDUCE:
        return tuple(1 if i in arg.axes else s for i, s in enumerate(src))
    if op is Ops.CONV:
        x, w = n.src[0].shape, n.src[1].shape
        if len(x) != len(w) or x[1] != w[1] * arg.groups or w[0] % arg.groups:
            raise ShapeError(f"CONV x{x} w{w} groups={arg.groups}: shapes do not fit")
        spatial = tuple(window_out(x[2 + i] + b + a, w[2 + i], arg.strides[i], arg.dilations[i])
                        for i, (b, a) in enumerate(arg.pads))
        return (x[0], w[0], *spatial)
    if op is Ops.MATMUL:
        a, b = n.src[0].shape, n.src[1].shape
        if len(a) != len(b) or len(a) < 2 or a[:-2] != b[:-2] or a[-1] != b[-2]:
            raise ShapeError(f"MATMUL {a} x {b}: shapes do not fit")
        return (*a[:-1], b[-1])
    if op is Ops.GATHER:
        idx = n.src[1].shape
        _check_indexed(op, src, idx, arg.axis, broadcast=True)
        return idx
    if op is Ops.SIZED:
        return src
    if op is Ops.STEP_IN:
        return arg.shape
    if op is Ops.STEP_LOOP:
        init = n.src[0].shape
        roots = n.src[1 + arg.steps:]
        if len(roots) != init[0] or any(r.shape != init[1:] for r in roots):
            raise ShapeError(f"STEP_LOOP: {len(roots)} state roots {[r.shape for r in roots]} for init {init}")
        if any(x.shape[:1] != (arg.trips,) for x in n.src[1:1 + arg.steps]):
            raise ShapeError(f"STEP_LOOP: step sources {[x.shape for x in n.src[1:1 + arg.steps]]} "
                             f"do not lead with the trip count {arg.trips}")
        return (arg.trips + 1, *init)
    if op is Ops.SCATTER:
        idx, upd = n.src[1].shape, n.src[2].shape
        if idx != upd:
            raise ShapeError(f"SCATTER indices {idx} and updates {upd} differ in shape")
        _check_indexed(op, src, idx, arg.axis, broadcast=False)
        return src
    raise ShapeError(f"no shape rule for {op.name}")


def _check_indexed(op: Ops, src: tuple, idx: tuple, axis: int, broadcast: bool) -> None:
    """idx indexes src along axis; on the other axes it is no larger than src (or src is 1: broadcast)."""
    if len(src) != len(idx) or not 0 <= axis < len(src):
        raise ShapeError(f"{op.name} axis {axis}: source {src} and indices {idx} need one rank")
    for a, (s, i) in enumerate(zip(src, idx, strict=True)):
        if a != axis and i > s and not (broadcast and s == 1):
            raise ShapeError(f"{op.name}: indices {idx} exceed source {src} on axis {a}")
    if src[axis] == 0 and math.prod(idx):
        raise ShapeError(f"{op.name}: cannot index an empty axis {axis} of {src}")
