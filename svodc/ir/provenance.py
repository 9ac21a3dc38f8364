"""Provenance: which ONNX nodes a UOp came from, kept beside the graph (never inside a node, so it
never blocks hash-consing). A rewrite that replaces a node passes its provenance on to the
replacement; a kernel's provenance is the union over the tensor-level nodes it computes.

Beside the names it keeps the nodes a frontend handler asks to realize (a recurrent layer's state
after each step, frontend/ops/rnn.py), passed on to replacements the same way: scheduling realizes
them (passes/schedule.py) however the rewrites between import and scheduling rebuilt them."""

from __future__ import annotations

import weakref
from collections.abc import Iterable

from svodc.ir.uop import UOp


class Provenance:
    def __init__(self) -> None:
        self._table: weakref.WeakKeyDictionary[UOp, frozenset[str]] = weakref.WeakKeyDictionary()
        self._realize: weakref.WeakSet[UOp] = weakref.WeakSet()

    def tag(self, node: UOp, names: Iterable[str]) -> None:
        names = frozenset(names)
        if names:
            self._table[node] = self._table.get(node, frozenset()) | names

    def tag_new(self, outputs: Iterable[UOp], stop: Iterable[UOp], names: Iterable[str]) -> None:
        """Tag every node reachable from outputs without crossing `stop` (a handler's inputs) and
        not tagged yet: the nodes one ONNX node's handler created. An output that is already tagged
        was made by an equal ONNX node before (hash-consing merges them): it and what lies below it,
        down to the inputs, computes this node too and gets its names as well."""
        stop_set = set(stop)
        names = frozenset(names)
        stack = [(o, True) for o in outputs]  # (node, reached only through already-tagged nodes)
        seen: set[UOp] = set()
        while stack:
            n, duplicate = stack.pop()
            if n in seen or n in stop_set:
                continue
            if n in self._table:
                if duplicate:
                    seen.add(n)
                    self._table[n] |= names
                    stack.extend((s, True) for s in n.src)
                continue
            seen.add(n)
            self._table[n] = names
            stack.extend((s, False) for s in n.src)

    def inherit(self, new: UOp, old: UOp) -> None:
        names = self._table.get(old)
        if names:
            self.tag(new, names)
        if old in self._realize:
            self._realize.add(new)

    def ask_realize(self, node: UOp) -> None:
        """Ask scheduling to give node a buffer of its own (a kernel boundary)."""
        self._realize.add(node)

    def realize_asked(self, nodes: Iterable[UOp]) -> set[UOp]:
        """Those of nodes some handler asked to realize (ask_realize), or a rewrite of one of them."""
        return {n for n in nodes if n in self._realize}

    def get(self, node: UOp) -> frozenset[str]:
        return self._table.get(node, frozenset())

    def union(self, nodes: Iterable[UOp]) -> list[str]:
        out: set[str] = set()
        for n in nodes:
            out |= self._table.get(n, frozenset())
        return sorted(out)
