"""Row-local normalizations as one kernel: softmax and log-softmax along trailing axes.

Softmax along the last axis is max, exp and sum reductions per row, each broadcast back over the row.
By the scheduler's general rules each reduction that a broadcast reuses is realized, so a softmax is four
kernels and four passes over memory (a [6, 1500, 1500] attention softmax: 16 ms on one Zen 4 core, where
onnxruntime's single pass takes 6). When the reduced axes are the trailing ones, a kernel over the output
whose loops keep those axes innermost computes each row's reductions once per row (codegen emits a value in
the outermost loop where its indices are defined, codegen/llvm_ir.py), while the row stays in L1/L2: one
read of the input from memory and one write of the output. A softmax is then lowered in two passes per row
(two_pass_softmax): exp once per element, no division per element (9.5 -> 6.6 ms on the shape above).

Invariant the lowering keeps (`row_axes`): a row-fused softmax's kernel loops over the reduced trailing axes
innermost and outside its parallel range, never merged with other axes; otherwise its reductions would be
recomputed per element.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import KernelArg, Ops, RangeKind, ReduceArg
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers
from svodc.policy import OptimizationPolicy

if TYPE_CHECKING:
    from svodc.passes.lower import KernelLowerer


def _trailing(axes: tuple[int, ...], ndim: int) -> bool:
    return bool(axes) and tuple(sorted(axes)) == tuple(range(ndim - len(axes), ndim))


def _reduce_over(n: UOp, op: Ops, axes: tuple[int, ...] | None = None) -> bool:
    return (n.op is Ops.REDUCE and isinstance(n.arg, ReduceArg) and n.arg.op is op
            and (axes is None or tuple(sorted(n.arg.axes)) == axes))


def _broadcast_of(n: UOp, shape: tuple[int, ...]) -> UOp | None:
    """n's source when n is an EXPAND to `shape` of a keepdims reduction's shape, else None."""
    return n.src[0] if n.op is Ops.EXPAND and n.shape == shape else None


def softmax_members(y: UOp) -> list[UOp] | None:
    """The nodes inside a softmax (y = e / sum(e), e = exp(x - max(x))) or log-softmax
    (y = (x - max(x)) - log(sum(e))) along trailing axes rooted at y, x excluded; None when y is neither."""
    shape = y.shape
    if y.op is Ops.DIV:
        e, total_b = y.src
        total = _broadcast_of(total_b, shape)
        if total is None or e.op is not Ops.EXP:
            return None
        shifted, tail = e.src[0], [total_b]
    elif y.op is Ops.SUB:
        shifted, log_b = y.src
        log = _broadcast_of(log_b, shape)
        if log is None or log.op is not Ops.LOG:
            return None
        total, tail = log.src[0], [log_b, log]
        e = total.src[0] if total.src else None
        if e is None or e.op is not Ops.EXP or e.src[0] is not shifted:
            return None
    else:
        return None
    if not _reduce_over(total, Ops.ADD) or total.src[0] is not e:
        return None
    axes = tuple(sorted(total.arg.axes))
    if not _trailing(axes, len(shape)) or shifted.op is not Ops.SUB or shifted.shape != shape:
        return None
    x, max_b = shifted.src
    peak = _broadcast_of(max_b, shape)
    if peak is None or not _reduce_over(peak, Ops.MAX, axes) or peak.src[0] is not x:
        return None
    return [peak, max_b, shifted, e, total, *tail]


def row_fused(nodes: list[UOp], consumers: dict[UOp, list[UOp]], policy: OptimizationPolicy,
              pinned: set[UOp]) -> tuple[set[UOp], set[UOp]]:
    """(nodes fused into their softmax's kernel, the softmax outputs: kernel roots). A softmax qualifies when
    its rows are at most policy.row_fusion_max elements (they stay in cache between the passes), and none of
    its inner nodes is used outside it or pinned (a graph output, asked for, forced by a GEMM)."""
    members: set[UOp] = set()
    roots: set[UOp] = set()
    if not policy.row_fusion:
        return members, roots
    for y in nodes:
        inner = softmax_members(y)
        if inner is None:
            continue
        axes = inner[0].arg.axes
        if math.prod(y.shape[a] for a in axes) > policy.row_fusion_max:
            continue
        group = set(inner) | {y}
        if any(n in pinned or n in members or any(c not in group for c in consumers[n]) for n in inner):
            continue
        members.update(inner)
        roots.add(y)
    return members, roots


def row_axes(root: UOp, buffers: Buffers) -> int:
    """How many trailing axes of the kernel's output its row-fused softmax reduces (row_fused left its
    reductions unrealized), else 0: those axes must be the innermost loops, outside the parallel range, so that
    each row's reductions are computed once per row, not once per element. (The scheduler realizes every other
    reduction that a broadcast reuses.)"""
    inner = softmax_members(root)
    if inner is None or any(buffers.get(n) is not None for n in inner):
        return 0
    return root.ndim - min(inner[0].arg.axes)


def two_pass_softmax(lowerer: KernelLowerer, root: UOp) -> UOp | None:
    """A row-fused softmax kernel as two statements per row (None for any other kernel): the row's
    exp(x - max) stored into the output, then the output row scaled by one over its sum, read back while
    the row is in L1/L2. exp runs once per element, not twice (in the sum and in the output), and the
    division is a multiply by one reciprocal per row. Both statements loop inside the same parallel range
    (codegen/llvm_ir.py opens a range the statements share once), so one row's passes follow each other.
    A log-softmax ((x - max) - log(sum)) keeps its one statement: it already evaluates exp once per element."""
    rows = row_axes(root, lowerer.buffers)
    if not rows or root.op is not Ops.DIV or root.dtype not in (dtypes.float32, dtypes.float64):
        return None  # (a float16/bfloat16 output would round the stored exp before the sum: one pass)
    e = root.src[0]
    first_row_axis = root.ndim - rows
    shape, extents = root.shape, lowerer.extents(root)
    idx = lowerer.output_index(shape, False, extents, rows)
    out_buf = lowerer.params[0]
    out = lowerer.param(out_buf)
    write = UOp(Ops.STORE, dtypes.void, (out, lowerer.linear(idx, shape), lowerer.lower(e, idx)))

    def row_ranges(kind: RangeKind) -> tuple[UOp, ...]:
        return tuple(i if a < first_row_axis else lowerer.new_range(extents[a], kind) if shape[a] != 1 else i
                     for a, i in enumerate(idx))

    at, over = row_ranges(RangeKind.LOOP), row_ranges(RangeKind.REDUCE)
    ranges = [i for a, i in enumerate(over) if a >= first_row_axis and i.op is Ops.RANGE]
    row_sum = lowerer.load(out_buf, over)
    if ranges:
        row_sum = UOp(Ops.LOOP_REDUCE, root.dtype, (row_sum, *ranges), Ops.ADD)
    scaled = UOp(Ops.MUL, root.dtype, (lowerer.load(out_buf, at), UOp(Ops.RECIP, root.dtype, (row_sum,))))
    scale = UOp(Ops.STORE, dtypes.void, (out, lowerer.linear(at, shape), scaled))
    return UOp(Ops.SINK, dtypes.void, (write, scale), KernelArg(lowerer.name))
