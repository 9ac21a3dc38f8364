"""Traversal facts of step loops (ops.STEP_LOOP): which nodes belong to a step graph, and which of a
loop's sources the enclosing graph computes.

A STEP_LOOP's state roots are its step graph: nodes that depend on a STEP_IN, evaluated once per step
(ir/interpret.py) or scheduled into the loop's kernels (passes/steploop.py). Its init and step sources
are ordinary values of the enclosing graph, computed once before the loop. Nested loops are not made
(frontend/ops/rnn.py builds one level).
"""

from __future__ import annotations

from collections.abc import Iterable

from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort


def outer_src(n: UOp) -> tuple[UOp, ...]:
    """n's sources as the enclosing graph sees them: a STEP_LOOP's init and step sources, not its roots."""
    return n.src[:1 + n.arg.steps] if n.op is Ops.STEP_LOOP else n.src


def step_roots(n: UOp) -> tuple[UOp, ...]:
    assert n.op is Ops.STEP_LOOP
    return n.src[1 + n.arg.steps:]


def step_dependent(order: Iterable[UOp]) -> set[UOp]:
    """Of `order` (children first), the nodes inside a step graph: a STEP_IN and what is computed from one
    (a STEP_LOOP is outside: its roots are its step graph, not its inputs)."""
    inside: set[UOp] = set()
    for n in order:
        if n.op is Ops.STEP_IN or (n.op is not Ops.STEP_LOOP and any(s in inside for s in n.src)):
            inside.add(n)
    return inside


def outer_toposort(roots: list[UOp], leaves: Iterable[UOp] = ()) -> list[UOp]:
    """Nodes reachable from roots through outer_src, children first, nothing below `leaves`."""
    stop = leaves if isinstance(leaves, (set, frozenset)) else set(leaves)
    return toposort(roots, lambda n: () if n in stop else outer_src(n))
