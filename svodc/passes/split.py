"""Index-set splitting: one loop nest per interval of an output index where comparisons decide.

A concatenation is a chain of selects on the concat-axis index; a padded copy tests both borders of
each padded axis. Evaluated as written, every output element computes every branch (and clamps
every load). When such a comparison is `r + c < t` (or `t < r + c`) for an output loop index r, the
kernel's STORE is split into one STORE per interval of r between the thresholds: inside each
interval the simplifier decides the comparisons, the selects collapse to one branch and the loads
lose their clamps. The pieces write disjoint parts of the output, so they need no barrier between
them.
"""

from __future__ import annotations

import itertools

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ALU, Ops
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp, output_ranges, toposort

MAX_PIECES = 24  # statements one kernel may be split into
MAX_INTERVALS = 32  # intervals of one index


def _affine_in(x: UOp, r: UOp) -> tuple[int, int] | None:
    """(s, c) when x is r * s + c (s > 0 and c constants; a strided window's tap), else None."""
    c = 0
    if x.op is Ops.ADD and x.src[1].op is Ops.CONST:
        x, c = x.src[0], x.src[1].arg
    if x is r:
        return 1, c
    if x.op is Ops.MUL and x.src[0] is r and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
        return x.src[1].arg, c
    return None


def thresholds(value: UOp, r: UOp) -> set[int]:
    """Values t in (0, size) such that some comparison in value changes between r = t-1 and r = t."""
    if r.src[0].op is not Ops.CONST:  # a run-time extent (a bounded dim): its intervals are not known here
        return set()
    size = r.src[0].arg
    out: set[int] = set()
    for n in toposort([value]):
        if n.op is not Ops.CMPLT:
            continue
        lhs, rhs = n.src
        sc = _affine_in(lhs, r)
        if sc is not None and rhs.op is Ops.CONST:
            out.add(-(-(rhs.arg - sc[1]) // sc[0]))  # r*s + c < t  <=>  r < ceil((t - c) / s)
        sc = _affine_in(rhs, r)
        if sc is not None and lhs.op is Ops.CONST:
            out.add((lhs.arg - sc[1]) // sc[0] + 1)  # t < r*s + c  <=>  r >= floor((t - c) / s) + 1
    return {t for t in out if 0 < t < size}


def _loads(x: UOp) -> int:
    return sum(1 for n in toposort([x]) if n.op is Ops.LOAD)


def _clamps(x: UOp) -> int:
    """Index clamps (MIN/MAX on indices) in x: what bounds analysis could not prove in range."""
    return sum(1 for n in toposort([x]) if n.op in (Ops.MIN, Ops.MAX) and n.dtype is dtypes.index)


def _clamped_loads(x: UOp) -> int:
    return sum(1 for n in toposort([x]) if n.op is Ops.LOAD and _clamps(n.src[1]))


# A padded copy (one clamped load) is split into an interior without clamps and its borders only where its rows
# are at least this long, or where it converts what it copies. Shorter rows of a plain copy LLVM unrolls whole and
# decides the clamps itself (14-28 wide: as fast or up to 1.4x faster than the split's more, shorter loops); longer
# ones it vectorizes with the clamped index per lane, a scalar load and insert each: 144 channels padded to 58 x 58
# took 0.196 ms, split 0.056 (Zen 4, one core; 42-wide rows 0.089 -> 0.033, 114-wide 0.172 -> 0.045). A copy that
# converts (an int8 depthwise convolution's u8 - zero as float32) it did not vectorize unrolled either: 384 channels
# of 16-wide rows 0.053 -> 0.014 ms split, and no width measured slower split (9 to 114 wide).
LONG_ROW = 32


def _long_rows(store: UOp) -> bool:
    """The store's innermost loop runs at least LONG_ROW iterations (a constant extent), or it stores a value
    computed from what it loads (a conversion: see LONG_ROW)."""
    ranges = output_ranges(store)
    if bool(ranges) and ranges[-1].src[0].op is Ops.CONST and ranges[-1].src[0].arg >= LONG_ROW:
        return True
    return any(n.op in ALU and n.op is not Ops.WHERE and n.dtype not in (dtypes.index, dtypes.bool)
               for n in toposort([store.src[2]]))


_VISIT, _DECIDE, _BUILD, _ALIAS = range(4)


def _restrict(root: UOp, old: UOp, new: UOp) -> UOp:
    """root with old replaced by new, and every select whose condition the replacement decides cut to
    the branch it takes: the branch not taken is never walked. A concatenation of k inputs split into
    k pieces so costs O(k) per piece, not O(k) nodes rebuilt and simplified in each of them (densenet121:
    quadratic in a dense block's width).

    Invariant: pm_symbolic is pure and folds WHERE(True, a, b) to a (and False to b), so simplifying the
    result equals simplifying the plain substitution. Deciding a condition is simplifying it (memoized:
    the final simplification reuses it)."""
    done: dict[UOp, UOp] = {old: new}
    stack: list[tuple[int, UOp, UOp | None]] = [(_VISIT, root, None)]
    while stack:
        state, n, taken = stack.pop()
        if state == _VISIT:
            if n in done:
                continue
            if n.op is Ops.WHERE:
                stack.append((_DECIDE, n, None))
                stack.append((_VISIT, n.src[0], None))
            else:
                stack.append((_BUILD, n, None))
                stack.extend((_VISIT, s, None) for s in reversed(n.src) if s not in done)
        elif state == _DECIDE:
            cond = graph_rewrite(done[n.src[0]], pm_symbolic)
            if cond.op is Ops.CONST:
                branch = n.src[1] if cond.arg else n.src[2]
                stack.append((_ALIAS, n, branch))
                stack.append((_VISIT, branch, None))
            else:
                stack.append((_BUILD, n, None))
                stack.extend((_VISIT, s, None) for s in reversed(n.src[1:]) if s not in done)
        elif state == _BUILD:
            src = tuple(done[s] for s in n.src)
            done[n] = n if all(a is b for a, b in zip(src, n.src, strict=True)) else n.replace(src=src)
        else:  # _ALIAS: a decided select is the branch it takes
            assert taken is not None
            done[n] = done[taken]
    return done[root]


def split_store(store: UOp) -> list[UOp]:
    """The store as one or more stores over disjoint intervals."""
    pieces = [store]
    changed = True
    while changed and len(pieces) < MAX_PIECES:
        changed = False
        out: list[UOp] = []
        for st in pieces:
            best = None
            for r in output_ranges(st):
                ts = thresholds(st.src[2], r)
                if ts and len(ts) < MAX_INTERVALS and (best is None or len(ts) > len(best[1])):
                    best = (r, ts)
            if best is None or len(out) + len(pieces) + len(best[1]) > MAX_PIECES * 2:
                out.append(st)
                continue
            r, ts = best
            bounds = [0, *sorted(ts), r.src[0].arg]
            new_pieces = []
            for lo, hi in itertools.pairwise(bounds):
                # Same id as the range it replaces: the emitter orders loops by id, so the split range
                # keeps its place in the loop nest (a new, larger id would make it the innermost loop).
                sub = UOp(Ops.RANGE, dtypes.index, (UOp.const(dtypes.index, hi - lo),), r.arg)
                new = sub if lo == 0 else UOp(Ops.ADD, dtypes.index, (sub, UOp.const(dtypes.index, lo)))
                new_pieces.append(graph_rewrite(_restrict(st, r, new), pm_symbolic))
            # Worth it when every piece reads fewer buffers than the whole (a concatenation), or when
            # the longest piece loses index clamps and either one threshold splits off an end (a pad
            # at the end only, as ceil-mode pooling makes: the clamped load was a gather to the
            # vectorizer) or several loads were clamped (a window's taps over padding read in place:
            # the interior then runs without clamps or selects), or the rows are long (below).
            longest = new_pieces[max(range(len(new_pieces)), key=lambda i: bounds[i + 1] - bounds[i])]
            unclamps = _clamps(longest) < _clamps(st) and (len(ts) == 1 or _clamped_loads(st) > 1
                                                          or _long_rows(st))
            if max(_loads(p) for p in new_pieces) >= _loads(st) and not unclamps:
                out.append(st)
                continue
            out.extend(new_pieces)
            changed = True
        pieces = out
    return pieces


def split_kernel(sink: UOp) -> UOp:
    """Split every STORE of a kernel AST (SINK) by the comparisons on its output indices."""
    stores: list[UOp] = []
    for st in sink.src:
        stores.extend(split_store(st) if st.op is Ops.STORE else [st])
    return sink.replace(src=tuple(stores))



