"""graph_rewrite: apply a PatternMatcher bottom-up to a fixed point.

Invariants:
- Iterative (an explicit stack): graph depth is not limited by Python's recursion limit.
- Memoized: each distinct node is rewritten once; shared subgraphs stay shared. A rule set made with
  memoize=True (pure rules) also remembers across calls (pattern.RewriteMemo) when no ctx or
  provenance is given.
- Bottom-up to a fixed point: a node is tried against the rules only after its children are final,
  and a replacement is itself rewritten completely (children first) before it is accepted.
- A loop guard: a rule set that keeps producing new nodes forever, or rewrites a node into a graph
  that contains the node itself, raises RewriteError naming the rule.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from svodc.ir.ops import MOVEMENT, Ops
from svodc.ir.pattern import PatternMatcher
from svodc.ir.provenance import Provenance
from svodc.ir.uop import UOp


class RewriteError(RuntimeError):
    pass


def debug_level() -> int:
    try:
        return int(os.environ.get("SVOD_DEBUG", "0"))
    except ValueError:
        return 0


_VISIT, _REBUILD, _ALIAS = 0, 1, 2


def graph_rewrite(root: UOp, pm: PatternMatcher, ctx: Any = None, prov: Provenance | None = None,
                  max_rewrites: int | None = None) -> UOp:
    dbg = debug_level() >= 3
    done: dict[UOp, UOp] = {}
    memo = pm.memo if ctx is None and prov is None else None
    in_progress: set[UOp] = set()
    # Default budget: 200,000 + 100 per node of the graph, counted only once 200,000 is passed (counting
    # the nodes is a whole walk, which most calls, on small index expressions, need not pay for).
    budget = max_rewrites if max_rewrites is not None else 200_000
    counted = max_rewrites is not None
    fired = 0
    stack: list[tuple[int, UOp, UOp | None]] = [(_VISIT, root, None)]
    while stack:
        state, n, target = stack.pop()
        if state == _VISIT:
            if n in done:
                continue
            if memo is not None and (known := memo.get(n)) is not None:
                done[n] = known
                continue
            if n in in_progress:
                raise RewriteError(f"{pm.name}: a rewrite produced a graph containing the node it replaced "
                                   f"({n.op.name}); the rule set does not terminate")
            in_progress.add(n)
            stack.append((_REBUILD, n, None))
            stack.extend((_VISIT, s, None) for s in reversed(n.src) if s not in done)
        elif state == _REBUILD:
            new_src = tuple(done[s] for s in n.src)
            nn = n if all(a is b for a, b in zip(new_src, n.src, strict=True)) else n.replace(src=new_src)
            if nn is not n and nn in done:
                _finish(done, in_progress, n, done[nn], prov)
                continue
            hit = pm.rewrite(nn, ctx)
            if hit is None:
                _finish(done, in_progress, n, nn, prov)
                if nn is not n:
                    done[nn] = nn
                continue
            fired += 1
            if fired > budget and not counted:
                budget, counted = budget + 100 * len(root.toposort()), True
            if fired > budget:
                raise RewriteError(f"{pm.name}: more than {budget} rewrites; rule '{hit[1].name}' keeps firing "
                                   f"on {nn.op.name}")
            replacement, rule = hit
            if dbg:
                print(f"[{pm.name}] {rule.name}: {nn.op.name} -> {replacement.op.name}", file=sys.stderr)
            if prov is not None:
                _pass_on_provenance(prov, n, nn, replacement, done)
            stack.append((_ALIAS, n, replacement))
            stack.append((_VISIT, replacement, None))
        else:  # _ALIAS: n becomes whatever its replacement rewrote to
            assert target is not None
            _finish(done, in_progress, n, done[target], prov)
    if memo is not None:
        memo.update(done)
    return done[root]


MATCH_DEPTH = 3  # how deep below the rewritten node a rule's pattern reaches (MUL(ADD(CONV, b), a))


def _pass_on_provenance(prov: Provenance, n: UOp, nn: UOp, replacement: UOp, done: dict[UOp, UOp]) -> None:
    """The replacement, and every node the rule built for it, comes from the rewritten node and from
    the nodes of the match it consumed (CONV * a -> CONV' names both the BatchNormalization and the
    Conv): kernels rooted at any of them are named after those ONNX nodes. A node the rule built that
    already existed (hash-consing: two Convs of one input share an im2col view or a product) is named
    after both."""
    match: set[UOp] = set()  # the nodes a pattern can have matched: nn and its sources, MATCH_DEPTH deep
    level = [nn]
    for _ in range(MATCH_DEPTH + 1):
        level = [x for x in dict.fromkeys(level) if x not in match]
        match.update(level)
        level = [s for x in level for s in x.src]
    used: set[UOp] = set()  # nodes of the match the replacement still uses
    built: list[UOp] = []
    stack, seen = [replacement], set()
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x in match and x is not nn:
            used.add(x)
        elif x in done:
            built.append(x)  # existed already; its own sources are not this rule's
        else:
            built.append(x)
            stack.extend(x.src)
    still = set()  # ... and what they reach inside the match: not consumed either
    while used:
        x = used.pop()
        if x not in still:
            still.add(x)
            used.update(s for s in x.src if s in match)
    names = set(prov.get(n)) | prov.get(nn)
    for x in match - still - {nn}:
        if not _is_constant(x):  # constants are shared by every node of equal value: no one's in particular
            names |= prov.get(x)
    for x in built:
        if not _is_constant(x):
            prov.tag(x, names)


def _is_constant(x: UOp) -> bool:
    while x.op in MOVEMENT:
        x = x.src[0]
    return x.op in (Ops.WEIGHT, Ops.CONST)


def _finish(done: dict[UOp, UOp], in_progress: set[UOp], n: UOp, result: UOp, prov: Provenance | None) -> None:
    done[n] = result
    in_progress.discard(n)
    if prov is not None and result is not n:
        prov.inherit(result, n)
