"""Run-time branches: the kernels only one side of a run-time If needs run only when that side is taken.

The frontend imports an If whose condition is known only at run time as both branches and, per
output, a select `WHERE(broadcast(cond), then, else)` (frontend/ops/control_flow.py); a Loop with a
run-time trip count selects each iteration's carried values between the body's and the previous
ones. Such a select (a WHERE made by an If or Loop node, whose condition is a non-constant scalar) is
a *branch select*. For it,
scheduling realizes the condition (a one-byte bool in the arena: the flag) and both sides, and every
kernel gets a guard: the condition, in disjunctive normal form over flags, under which some graph
output needs its result. Need flows from the outputs to the sources: an output is always needed; a
node is needed when a consumer is, and through a branch select's `then` input only where its flag is
true (`else`: false). So a kernel both sides share, or that anything else reads, is unguarded, and a
kernel of one branch runs only when that branch is taken (codegen/module.py skips it).

Invariant that makes skipping safe: a kernel's guard implies the guard of every kernel whose buffer
it needs, and a skipped kernel's buffer is read only by selects of the side not taken, which
discard it (a load from the arena is always in bounds, whatever the buffer holds). Running a guarded
kernel anyway is therefore always correct: executors that cannot branch (the GPU launch list) ignore
guards. The flag's kernel runs before every kernel it guards (`order_for_guards`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict

from svodc.ir.ops import ALU, MOVEMENT, Ops
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp

# A guard: the conjunctions (each a frozenset of (flag node, polarity)) of which one must hold.
Guard = frozenset[frozenset[tuple[UOp, bool]]]
ALWAYS: Guard = frozenset({frozenset()})
MAX_TERMS = 8  # a guard with more conjunctions is treated as ALWAYS (bounded work, still correct)
_COMPUTE = ALU | {Ops.REDUCE, Ops.MATMUL, Ops.CONV, Ops.GATHER, Ops.SCATTER}


def _base(n: UOp) -> UOp:
    while n.op in MOVEMENT:
        n = n.src[0]
    return n


def find_branch_selects(nodes: list[UOp], prov: Provenance, op_types: dict[str, str] | None) -> dict[UOp, UOp]:
    """Branch selects among nodes -> their flag (the scalar condition they broadcast)."""
    if not op_types:
        return {}
    out: dict[UOp, UOp] = {}
    for n in nodes:
        if n.op is not Ops.WHERE or not any(op_types.get(name) in ("If", "Loop") for name in prov.get(n)):
            continue
        flag = _base(n.src[0])
        if flag.op in _COMPUTE and flag.op is not Ops.SCATTER and all(d == 1 for d in flag.shape):
            out[n] = flag
    return out


def branch_roots(selects: dict[UOp, UOp]) -> set[UOp]:
    """What must be realized for the selects to guard anything: each flag and each side's compute base."""
    roots: set[UOp] = set()
    for sel, flag in selects.items():
        roots.add(flag)
        roots |= {b for b in (_base(sel.src[1]), _base(sel.src[2])) if b.op in _COMPUTE}
    return roots


def _and(g: Guard, lit: tuple[UOp, bool]) -> Guard:
    flip = (lit[0], not lit[1])
    return frozenset(c | {lit} for c in g if flip not in c)


def _simplify(terms: set[frozenset[tuple[UOp, bool]]]) -> Guard:
    changed = True
    while changed:  # x&c | x&!c = x, then absorption: x | x&y = x
        changed = False
        for t in list(terms):
            for lit in t:
                other = (t - {lit}) | {(lit[0], not lit[1])}
                if other in terms:
                    terms -= {t, other}
                    terms.add(t - {lit})
                    changed = True
                    break
            if changed:
                break
        minimal = {t for t in terms if not any(o < t for o in terms)}
        changed = changed or minimal != terms
        terms = minimal
    return ALWAYS if frozenset() in terms or len(terms) > MAX_TERMS else frozenset(terms)


def guards(nodes: list[UOp], roots: list[UOp], selects: dict[UOp, UOp]) -> dict[UOp, Guard]:
    """Each node's need (nodes in topological order, roots the graph outputs)."""
    need: dict[UOp, set[frozenset[tuple[UOp, bool]]]] = defaultdict(set)
    for r in roots:
        need[r] |= ALWAYS
    out: dict[UOp, Guard] = {}
    for n in reversed(nodes):
        g = out[n] = _simplify(need.pop(n, set()))
        for i, s in enumerate(n.src):
            if n in selects and i:
                need[s] |= _and(g, (selects[n], i == 1))
            else:
                need[s] |= g
    return out


def order_for_guards(realized: list[UOp], guard_of: dict[UOp, Guard]) -> list[UOp] | None:
    """The realized nodes in an order where each flag comes before the kernels it guards and every
    source before its consumers; among the ready nodes, the earliest in the original order first.
    None when no such order exists (a flag only a branch it guards needs: the caller drops the guards)."""
    index = {n: i for i, n in enumerate(realized)}
    deps: dict[UOp, set[UOp]] = {}
    for n in realized:
        found, stack, seen = set(), list(n.src), set()
        while stack:
            s = stack.pop()
            if s in seen:
                continue
            seen.add(s)
            if s in index:
                found.add(s)
            else:
                stack.extend(s.src)
        found |= {flag for term in guard_of[n] for flag, _ in term if flag in index}
        deps[n] = found
    users: dict[UOp, list[UOp]] = defaultdict(list)
    for n, ds in deps.items():
        for d in ds:
            users[d].append(n)
    waiting = {n: len(ds) for n, ds in deps.items()}
    ready = [index[n] for n in realized if not waiting[n]]
    heapq.heapify(ready)
    order: list[UOp] = []
    while ready:
        n = realized[heapq.heappop(ready)]
        order.append(n)
        for u in users[n]:
            waiting[u] -= 1
            if not waiting[u]:
                heapq.heappush(ready, index[u])
    return order if len(order) == len(realized) else None
