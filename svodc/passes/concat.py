"""Reductions over a concatenation, reduced piece by piece.

`torch.stack([a, b, c], -1).max(-1)` (a Concat along a new axis, then ReduceMax over it) exports as
REDUCE(MAX) over the concatenation `ir/tensor.py` `concat` builds: WHERE(inside_k, PAD(x_k), rest) per
piece, so every element of the reduced loop is a chain of selects over all pieces' loads. A MAX or MIN
over the concatenation axis is the same MAX/MIN of each piece's own reduction (the same value for every
input, NaN included: both propagate it, `ir/alu.py`; only which of two equal zeros wins may differ, which
ONNX leaves open), and a piece one element wide along the reduced axes is itself: the kernel then loads
each piece once per output, with no select and no reduction loop.
ADD and MUL are left alone: splitting them would change the summation order.
"""

from __future__ import annotations

from itertools import pairwise

from svodc.ir import tensor as T
from svodc.ir.ops import Ops, PadArg, ReduceArg
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp
from svodc.passes.fold import splat_value

_EXACT = frozenset({Ops.MAX, Ops.MIN})  # reductions whose order does not change the result


def concat_pieces(x: UOp) -> tuple[int, list[UOp]] | None:
    """(axis, pieces in order) if x is a concatenation as `T.concat` builds it, else None."""
    whole, placed, pieces = x, list[PadArg](), list[UOp]()
    while x.op is Ops.WHERE:
        mask, piece, rest = x.src
        if (mask.op is not Ops.PAD or piece.op is not Ops.PAD or mask.arg.pads != piece.arg.pads
                or mask.arg.value is not False or (s := splat_value(mask.src[0])) is None or s.arg is not True):
            return None
        placed.append(piece.arg)
        pieces.append(piece.src[0])
        x = rest
    if x.op is not Ops.PAD or not pieces:
        return None
    placed.append(x.arg)
    pieces.append(x.src[0])
    axes = {a for p in placed for a, (b, e) in enumerate(p.pads) if b or e}
    if len(axes) != 1:
        return None
    axis = axes.pop()
    spans = sorted((p.pads[axis][0], p.pads[axis][0] + x.shape[axis], i)
                   for i, (p, x) in enumerate(zip(placed, pieces, strict=True)))
    if spans[0][0] != 0 or spans[-1][1] != whole.shape[axis] or any(a[1] != b[0] for a, b in pairwise(spans)):
        return None  # the pieces must tile the axis, each element from exactly one piece
    return axis, [pieces[i] for _, _, i in spans]


def split_reduce(n: UOp) -> UOp | None:
    arg: ReduceArg = n.arg
    if arg.op not in _EXACT or (found := concat_pieces(n.src[0])) is None or found[0] not in arg.axes:
        return None
    parts = [T.reduce(x, arg.op, [a for a in arg.axes if x.shape[a] > 1]) for x in found[1]]
    out = parts[0]
    for p in parts[1:]:
        out = T.alu(arg.op, out, p)
    return out


pm_reduce_concat = PatternMatcher([(UPat(Ops.REDUCE, name="n"), split_reduce)], name="reduce-concat")
