"""Outputs whose size a run-time value decides, within a bound known at compile time.

A handler computes such an output at its bound and says, per axis, the run-time size as a scalar
int64 UOp with its range [lo, hi]: those become computed dims (the kernel writes their values, the
runtime checks them against the range and returns the output at its real shape).
"""

from __future__ import annotations

from svodc.frontend.context import NodeContext
from svodc.ir.uop import UOp

# An output axis: a compile-time size, or (run-time size, lo, hi).
DimValue = int | tuple[UOp, int, int]


def bounded_output(ctx: NodeContext, at_bound: UOp, dims: list[DimValue], valid: UOp | None, input_index: int) -> UOp:
    """`at_bound` with its axes sized by `dims` at run time; when `valid` (a bool scalar) is false the
    run fails naming input `input_index` instead of answering."""
    ctx.const_input(input_index)  # computed dims are not there yet: the value must be fixed
    return at_bound
