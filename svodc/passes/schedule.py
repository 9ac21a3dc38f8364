"""Scheduling: decide which tensors are realized in memory, and cut the graph into kernels.

Everything not realized is fused into the kernels that consume it (movement ops become index
arithmetic, elementwise chains are recomputed in place). A compute node is realized when:
- it is a graph output;
- it contains an unrealized REDUCE and is reused element by element by a consumer (EXPAND, PAD,
  WINDOW: a broadcast or overlapping windows would recompute the reduction per use), or feeds
  another REDUCE, or has several consumers;
- it is an expensive elementwise chain that a consumer reuses (more than a few ops per element);
- its fused subgraph would grow past MAX_FUSED_OPS (keeps kernels and compile time bounded);
- it is a SCATTER (always a kernel of its own: copy, then serial updates; see lower.py).
GATHER reads its source at run-time positions, so for the rules above it reuses elements like EXPAND.
Realizing a movement op realizes its source instead: views of a buffer cost nothing.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from svodc.ir.ops import ALU, MOVEMENT, Ops
from svodc.ir.uop import UOp, toposort

MAX_FUSED_OPS = 400
CHEAP_TO_REPEAT = 16  # ops per element a reusing consumer may recompute instead of loading
_REUSE = frozenset({Ops.EXPAND, Ops.PAD, Ops.WINDOW})
_VIEW_THROUGH = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.SLICE})


@dataclass
class KernelPlan:
    root: UOp  # the tensor this kernel computes
    output: str | None  # graph output name written by this kernel, or None for a scratch buffer
    copy: bool = False  # the root is already realized elsewhere: this kernel only copies it


def _reuse_consumers(n: UOp, consumers: dict[UOp, list[UOp]]) -> tuple[bool, bool]:
    """(some consumer reuses elements, some consumer is a REDUCE), looking through pure views."""
    reuse = reduce_ = False
    stack = [n]
    while stack:
        x = stack.pop()
        for c in consumers[x]:
            if c.op in _REUSE or (c.op is Ops.GATHER and c.src[0] is x):
                reuse = True
            elif c.op is Ops.REDUCE:
                reduce_ = True
            elif c.op in _VIEW_THROUGH:
                stack.append(c)
    return reuse, reduce_


def _base(n: UOp) -> UOp:
    while n.op in MOVEMENT:
        n = n.src[0]
    return n


def plan_kernels(outputs: list[tuple[str, UOp]]) -> tuple[list[KernelPlan], set[UOp]]:
    """The kernels in execution order, and the set of realized nodes (kernel roots)."""
    roots = [o for _, o in outputs]
    nodes = toposort(roots)
    consumers: dict[UOp, list[UOp]] = defaultdict(list)
    for n in nodes:
        for s in dict.fromkeys(n.src):
            consumers[s].append(n)
    output_roots = set(roots)
    realized: set[UOp] = set()
    has_reduce: dict[UOp, bool] = {}
    fused_ops: dict[UOp, int] = {}

    def state(s: UOp) -> tuple[bool, int]:
        if s in realized or s.op in (Ops.INPUT, Ops.WEIGHT, Ops.CONST):
            return False, 0
        return has_reduce[s], fused_ops[s]

    for n in nodes:
        if n.op in (Ops.INPUT, Ops.WEIGHT, Ops.CONST):
            continue
        srcs = [state(s) for s in n.src]
        hr = n.op is Ops.REDUCE or any(h for h, _ in srcs)
        ops = (1 if n.op in ALU or n.op is Ops.REDUCE else 0) + sum(k for _, k in srcs)
        has_reduce[n], fused_ops[n] = hr, ops
        if n.op is Ops.SCATTER:
            realized.add(n)
            continue
        if n.op not in ALU and n.op is not Ops.REDUCE:
            continue
        reuse, into_reduce = _reuse_consumers(n, consumers)
        many = len(consumers[n]) > 1
        if (n in output_roots or (hr and (reuse or into_reduce or many))
                or (reuse and ops > CHEAP_TO_REPEAT) or ops > MAX_FUSED_OPS):
            realized.add(n)
    plans: list[KernelPlan] = []
    names_by_root: dict[UOp, str] = {}
    for name, root in outputs:
        if root in names_by_root:
            continue
        names_by_root[root] = name
    done_outputs: set[str] = set()
    for n in nodes:
        if n in realized:
            out = names_by_root.get(n)
            plans.append(KernelPlan(n, out))
            if out is not None:
                done_outputs.add(out)
    # Outputs that are views, inputs or constants, or that repeat another output, get a kernel of
    # their own that computes (or copies) them into the output buffer.
    for name, root in outputs:
        if name in done_outputs:
            continue
        first = names_by_root[root]
        plans.append(KernelPlan(root, name, copy=first != name))
        done_outputs.add(name)
    return plans, realized
