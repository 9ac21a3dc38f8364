"""Patterns and graph_rewrite: matching, commutativity, fixed point, deep graphs, the loop guard."""

from __future__ import annotations

import pytest

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import InputArg, Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.provenance import Provenance
from svodc.ir.rewrite import RewriteError, graph_rewrite
from svodc.ir.uop import UOp

F = dtypes.float32


def scalar(name: str) -> UOp:
    return UOp(Ops.INPUT, F, (), InputArg(name, ()))


def c(v: float) -> UOp:
    return UOp.const(F, v)


def test_commutative_patterns_match_both_orders():
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1.0))), lambda x: x)])
    x = scalar("x")
    assert graph_rewrite(x * c(1.0), pm) is x
    assert graph_rewrite(c(1.0) * x, pm) is x
    sub = PatternMatcher([(UPat(Ops.SUB, src=(UPat.var("x"), UPat.const(0.0))), lambda x: x)])
    assert graph_rewrite(c(0.0) - x, sub) is (c(0.0) - x)  # SUB is not commutative


def test_named_bindings_must_agree():
    pm = PatternMatcher([(UPat(Ops.SUB, src=(UPat.var("x"), UPat.var("x"))), lambda x: x.const_like(0.0))])
    x, y = scalar("x"), scalar("y")
    assert graph_rewrite(x - x, pm) is c(0.0)
    assert graph_rewrite(x - y, pm) is (x - y)


def test_rewrite_reaches_a_fixed_point_bottom_up():
    # x*1*1*1 collapses fully; the replacement of an inner node is visible to the outer match
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1.0))), lambda x: x)])
    x = scalar("x")
    assert graph_rewrite(((x * c(1.0)) * c(1.0)) * c(1.0), pm) is x
    # a rule whose output enables another rule on the same node
    pm2 = PatternMatcher([
        (UPat(Ops.ADD, src=(UPat.var("x"), UPat.var("x"))), lambda x: x * c(2.0)),
        (UPat(Ops.MUL, src=(UPat(Ops.MUL, src=(UPat.var("x"), UPat.cvar("a"))), UPat.cvar("b"))),
         lambda x, a, b: x * c(a.arg * b.arg)),
    ])
    assert graph_rewrite((x + x) * c(3.0), pm2) is x * c(6.0)


def test_deep_graph_rewrites_without_recursion():
    pm = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.const(0.0))), lambda x: x)])
    x = scalar("x")
    y = x
    for _ in range(50000):
        y = y + c(0.0)
    assert graph_rewrite(y, pm) is x


def test_shared_subgraphs_are_rewritten_once():
    calls = []

    def count(x):
        calls.append(x)
        return None

    pm = PatternMatcher([(UPat(Ops.NEG, src=(UPat.var("x"),)), count)])
    x = scalar("x")
    n = -x
    graph_rewrite(UOp(Ops.SINK, dtypes.void, (n + n, n * n, n)), pm)
    assert len(calls) == 1


def test_non_terminating_rules_are_caught():
    pm = PatternMatcher([(UPat(Ops.NEG, name="n"), lambda n: n.alu(Ops.NEG).alu(Ops.NEG))])
    with pytest.raises(RewriteError):
        graph_rewrite(-scalar("x"), pm)
    grow = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("x"), UPat.cvar("k"))), lambda x, k: x + c(k.arg + 1.0))])
    with pytest.raises(RewriteError):
        graph_rewrite(scalar("x") + c(0.0), grow, max_rewrites=1000)


def test_provenance_follows_replacements():
    prov = Provenance()
    x = scalar("x")
    n = x * c(1.0)
    prov.tag(n, ["node_a"])
    pm = PatternMatcher([(UPat(Ops.MUL, src=(UPat.var("x"), UPat.const(1.0))), lambda x: -x)])
    out = graph_rewrite(n, pm, prov=prov)
    assert prov.get(out) == {"node_a"}
