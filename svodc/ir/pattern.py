"""Patterns over UOps and the PatternMatcher: rules as data.

A rule is (UPat, function). A UPat matches op (one or a set), dtype (one or a set), the argument
(a value, or a predicate), and the children (a tuple of UPats, matched positionally; for binary
commutative ops both orders are tried). `name=` binds the matched node. The function receives the
bindings as keyword arguments (plus `ctx` when it asks for it) and returns a replacement UOp or None.

`PatternMatcher` indexes its rules by root op, so a node is only tried against the rules that can
match it, and rejects a rule early when a child's op cannot match.
"""

from __future__ import annotations

import contextlib
import inspect
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from svodc.ir.dtypes import DType
from svodc.ir.ops import COMMUTATIVE, Ops
from svodc.ir.uop import UOp

_ANY: Any = object()


class UPat:
    __slots__ = ("arg", "dtypes", "name", "ops", "src", "src_all")

    def __init__(self, op: Ops | Iterable[Ops] | None = None, dtype: DType | Iterable[DType] | None = None,
                 src: tuple[UPat, ...] | None = None, arg: Any = _ANY, name: str | None = None,
                 src_all: UPat | None = None):
        """src: children matched positionally (exact count). src_all: every child matches this."""
        self.ops = None if op is None else (frozenset({op}) if isinstance(op, Ops) else frozenset(op))
        self.dtypes = None if dtype is None else (
            frozenset({dtype}) if isinstance(dtype, DType) else frozenset(dtype))
        self.src = src
        self.src_all = src_all
        self.arg = arg
        self.name = name

    # ---- constructors for the common cases
    @staticmethod
    def var(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(dtype=dtype, name=name)

    @staticmethod
    def cvar(name: str | None = None, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, name=name)

    @staticmethod
    def const(value: Any, dtype: DType | Iterable[DType] | None = None) -> UPat:
        return UPat(Ops.CONST, dtype=dtype, arg=value)

    def __repr__(self) -> str:
        ops = "any" if self.ops is None else "|".join(sorted(o.name for o in self.ops))
        return f"UPat({ops}{'' if self.name is None else ' as ' + self.name})"

    # ---- matching
    def match(self, node: UOp, bound: dict[str, UOp]) -> list[dict[str, UOp]]:
        """All ways this pattern matches node, extending `bound` (empty list: no match)."""
        if self.ops is not None and node.op not in self.ops:
            return []
        if self.dtypes is not None and node.dtype not in self.dtypes:
            return []
        if self.arg is not _ANY:
            if callable(self.arg) and not isinstance(self.arg, (int, float)):
                if not self.arg(node.arg):
                    return []
            elif not _arg_equal(node.arg, self.arg):
                return []
        if self.name is not None:
            prev = bound.get(self.name)
            if prev is not None and prev is not node:
                return []
            bound = {**bound, self.name: node}
        if self.src_all is not None:
            results = [bound]
            for child in node.src:
                results = [r2 for r in results for r2 in self.src_all.match(child, r)]
                if not results:
                    return []
            return results
        if self.src is None:
            return [bound]
        if len(self.src) != len(node.src):
            return []
        orders = [node.src]
        if len(node.src) == 2 and node.op in COMMUTATIVE and node.src[0] is not node.src[1]:
            orders.append((node.src[1], node.src[0]))
        results: list[dict[str, UOp]] = []
        for children in orders:
            partial = [bound]
            for pat, child in zip(self.src, children, strict=True):
                partial = [r2 for r in partial for r2 in pat.match(child, r)]
                if not partial:
                    break
            results.extend(partial)
        return results

    def could_match_children(self, node: UOp) -> bool:
        """Cheap pre-check on the children's ops only (used to reject rules early)."""
        if self.src is None or len(self.src) != len(node.src):
            return self.src is None
        if node.op in COMMUTATIVE and len(node.src) == 2:
            a, b = self.src
            return ((_op_ok(a, node.src[0]) and _op_ok(b, node.src[1]))
                    or (_op_ok(a, node.src[1]) and _op_ok(b, node.src[0])))
        return all(_op_ok(p, c) for p, c in zip(self.src, node.src, strict=True))


def _op_ok(pat: UPat, node: UOp) -> bool:
    return pat.ops is None or node.op in pat.ops


def _arg_equal(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return type(a) is type(b) and (a == b or (a != a and b != b))
    return type(a) is type(b) and a == b


@dataclass(frozen=True)
class Rule:
    pattern: UPat
    fn: Callable[..., UOp | None]
    wants_ctx: bool
    name: str


class RewriteMemo:
    """What graph_rewrite made of each node under one rule set, across calls: for rule sets whose rules
    depend on nothing but the node (no ctx), the rewrite of a hash-consed node is a function of the
    node, so a node seen by an earlier call (the same index expression in another kernel) is not walked
    again. Weak both ways, like the UOp intern table: an entry lasts as long as both nodes are alive,
    so it never keeps a compilation's graph alive after it."""

    def __init__(self) -> None:
        self._done: weakref.WeakKeyDictionary[UOp, weakref.ref[UOp]] = weakref.WeakKeyDictionary()
        self._holds = 0
        self._kept: list[dict[UOp, UOp]] = []
        self._lock = threading.Lock()

    def get(self, n: UOp) -> UOp | None:
        ref = self._done.get(n)
        return ref() if ref is not None else None

    def update(self, done: dict[UOp, UOp]) -> None:
        for n, result in done.items():
            self._done[n] = weakref.ref(result)
        if self._holds:
            self._kept.append(done)

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        """While held (one compilation's lowering), the entries also keep their nodes alive. Lowering builds
        an index expression, simplifies it and drops it; the next kernel (or the next lowering try of the
        same kernel) builds it again, and with weak entries only it is walked again (resnet50: 24k
        simplifier rewrites of 10k distinct nodes). Released when the last holder leaves, so nothing is
        kept past it; what was found is what a fresh rewrite gives, held or not."""
        with self._lock:
            self._holds += 1
        try:
            yield
        finally:
            with self._lock:
                self._holds -= 1
                if not self._holds:
                    self._kept = []


class PatternMatcher:
    """An ordered set of rules, indexed by the root op. memoize: the rules are pure functions of the
    node (no ctx), so graph_rewrite keeps a RewriteMemo for this rule set (not kept by `+`)."""

    def __init__(self, rules: list[tuple[UPat, Callable[..., UOp | None]]], name: str = "rules",
                 memoize: bool = False):
        self.name = name
        self.memo = RewriteMemo() if memoize else None
        self.rules = [Rule(p, f, "ctx" in inspect.signature(f).parameters, getattr(f, "__name__", "rule"))
                      for p, f in rules]
        self._by_op: dict[Ops, list[Rule]] = {}
        generic = [r for r in self.rules if r.pattern.ops is None]
        for op in Ops:
            self._by_op[op] = [r for r in self.rules if r.pattern.ops is None or op in r.pattern.ops]
        self._generic = generic

    def __add__(self, other: PatternMatcher) -> PatternMatcher:
        pm = PatternMatcher([], name=f"{self.name}+{other.name}")  # a new rule set: no memo
        pm.rules = self.rules + other.rules
        pm._by_op = {op: self._by_op[op] + other._by_op[op] for op in Ops}
        return pm

    def rewrite(self, node: UOp, ctx: Any = None) -> tuple[UOp, Rule] | None:
        """The first rule's replacement for node, or None when no rule fires."""
        for rule in self._by_op[node.op]:
            if not rule.pattern.could_match_children(node):
                continue
            for bound in rule.pattern.match(node, {}):
                out = rule.fn(ctx=ctx, **bound) if rule.wants_ctx else rule.fn(**bound)
                if out is not None and out is not node:
                    return out, rule
        return None
