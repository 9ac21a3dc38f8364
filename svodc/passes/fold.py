"""Constant folding at tensor level.

- A splat (one scalar broadcast by movement ops) stays a splat: ALU ops on splats fold to a new
  scalar, never to a materialized tensor.
- Any other op whose sources are all constants is computed now with the reference interpreter and
  becomes a WEIGHT, when the result is at most `fold_limit` elements.
- Pure movement of a WEIGHT is left as a view (it costs nothing at run time); REDUCE over a splat is
  left alone (folding it would change the summation order).
"""

from __future__ import annotations

import numpy as np

from svodc.ir import tensor as T
from svodc.ir.alu import fold_scalar
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ALU, MOVEMENT, ConstData, Ops, PadArg, ShapeArg
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.shapes import prod
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp

_SPLAT_VIEWS = frozenset({Ops.RESHAPE, Ops.EXPAND, Ops.PERMUTE, Ops.SLICE, Ops.WINDOW})


def splat_value(x: UOp) -> UOp | None:
    """The CONST that x broadcasts, if x is a pure view of one scalar."""
    while x.op in _SPLAT_VIEWS:
        x = x.src[0]
    return x if x.op is Ops.CONST else None


def is_folded_constant(x: UOp) -> bool:
    """x is a folded constant: a WEIGHT or CONST seen through movement ops. (Folding runs bottom-up,
    so a constant subgraph has already become one of these by the time its parent is visited.)"""
    while x.op in MOVEMENT:
        x = x.src[0]
    return x.op in (Ops.WEIGHT, Ops.CONST)


def fold_splat_alu(n: UOp) -> UOp | None:
    if n.shape == ():
        return None  # scalar level: pm_symbolic folds CONSTs
    scalars = [splat_value(s) for s in n.src]
    if any(s is None for s in scalars):
        return None
    try:
        v = fold_scalar(n.op, n.dtype, [s.arg for s in scalars], [s.dtype for s in scalars])
    except (NotImplementedError, OverflowError):
        return None
    return T.const(v, n.dtype, n.shape)


def fold_pad_of_splat(n: UOp) -> UOp | None:
    """PAD of a splat with the same value is the splat at the padded shape."""
    assert isinstance(n.arg, PadArg)
    s = splat_value(n.src[0])
    if s is None or UOp.const(s.dtype, n.arg.value) is not s:  # interning compares -0.0 and NaN exactly
        return None
    return T.const(s.arg, n.dtype, n.shape)


# Leaves, and a step loop (its step graph reads STEP_IN leaves: never all constants, but STEP_IN has no sources).
_NOT_COMPUTED = frozenset({Ops.WEIGHT, Ops.CONST, Ops.INPUT, Ops.SINK, Ops.STEP_IN, Ops.STEP_LOOP})


def make_fold_computed(limit: int):
    def fold_computed(n: UOp) -> UOp | None:
        """Compute a node of constants now (not views of weights, not reductions of splats)."""
        if n.op in _NOT_COMPUTED or n.shape == () or n.op in MOVEMENT:
            return None
        if not all(is_folded_constant(s) for s in n.src) or prod(n.shape) > limit:
            return None
        if n.op is Ops.REDUCE and splat_value(n.src[0]) is not None:
            return None
        return broadcast_weight(n.dtype, evaluate([n])[0])
    return fold_computed


def broadcast_weight(dtype: DType, value: np.ndarray) -> UOp:
    """A WEIGHT of value, stored without the axes along which it is constant (an ALU of
    per-channel constants broadcast to an activation's shape stays per-channel: the bundle does not
    carry the broadcast copy) and EXPANDed back to value's shape. A uniform value becomes a
    one-element WEIGHT, which `weight_scalar_to_splat` turns into a splat."""
    small = value
    for axis in range(value.ndim):
        if small.shape[axis] > 1:
            first = small.take([0], axis=axis)
            # the second slice alone first: a dense weight differs there, and is not compared whole (0.1 s of
            # ResNet-50's passes)
            if not np.array_equal(small.take([1], axis=axis), first):
                continue
            if np.array_equal(small, np.broadcast_to(first, small.shape)):  # NaNs: kept full, never merged
                small = first
    w = UOp(Ops.WEIGHT, dtype, (), ConstData(np.ascontiguousarray(small)))
    return w if small.shape == value.shape else T.expand(w, value.shape)


# dtypes whose one-element weights become splats (a CONST's value is a Python number; the emulated
# and string dtypes keep their stored form)
_SPLATTABLE = frozenset({dtypes.float32, dtypes.float64, dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64,
                         dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64, dtypes.bool})


def weight_scalar_to_splat(n: UOp) -> UOp | None:
    """A one-element WEIGHT is a splat: kernels then see the constant (x ** 2.0 becomes x * x, a
    scale folds into its neighbours) instead of loading it."""
    if n.dtype not in _SPLATTABLE or prod(n.shape) != 1:
        return None
    return T.const(n.arg.array.reshape(()).item(), n.dtype, n.shape)


def collapse_movement(n: UOp) -> UOp | None:
    """RESHAPE of RESHAPE, and EXPAND to the same shape."""
    src = n.src[0]
    if n.op is Ops.RESHAPE and src.op is Ops.RESHAPE:
        return T.reshape(src.src[0], n.arg.shape)
    if n.op is Ops.RESHAPE and n.arg.shape == src.shape:
        return src
    if n.op is Ops.EXPAND and isinstance(n.arg, ShapeArg) and n.arg.shape == src.shape:
        return src
    return None


def pm_fold(limit: int) -> PatternMatcher:
    return PatternMatcher([
        (UPat((Ops.RESHAPE, Ops.EXPAND), name="n"), collapse_movement),
        (UPat(ALU, name="n"), fold_splat_alu),
        (UPat(Ops.PAD, name="n"), fold_pad_of_splat),
        (UPat(Ops.WEIGHT, name="n"), weight_scalar_to_splat),
        (UPat(name="n"), make_fold_computed(limit)),
    ], name="fold") + pm_symbolic
