"""The symbolic simplifier: bounds and index rewrites, checked by evaluating before and after."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops, RangeArg, RangeKind
from svodc.ir.symbolic import simplify
from svodc.ir.uop import UOp, toposort

I = dtypes.index


def rng(i: int, n: int) -> UOp:
    return UOp(Ops.RANGE, I, (UOp.const(I, n),), RangeArg(i, RangeKind.LOOP))


def evaluate(e: UOp, env: dict[UOp, int]) -> int:
    from svodc.ir.alu import fold_scalar

    vals: dict[UOp, object] = {}
    for n in toposort([e]):
        if n.op is Ops.RANGE:
            vals[n] = env[n]
        elif n.op is Ops.CONST:
            vals[n] = n.arg
        else:
            vals[n] = fold_scalar(n.op, n.dtype, [vals[s] for s in n.src], [s.dtype for s in n.src])
    return vals[e]


def check_equivalent(e: UOp, ranges: list[UOp]) -> UOp:
    s = simplify(e)
    for values in itertools.product(*[range(r.src[0].arg) for r in ranges]):
        env = dict(zip(ranges, values, strict=True))
        assert evaluate(s, env) == evaluate(e, env), (values, e, s)
    return s


def test_linearize_of_delinearize_folds_back():
    k = rng(0, 25088)
    e = (k // 49 % 512) * 49 + (k // 7 % 7) * 7 + k % 7
    assert simplify(e) is k


def test_div_mod_of_affine_sums():
    a, b = rng(1, 7), rng(2, 7)
    assert check_equivalent((a * 7 + b) // 7, [a, b]) is a
    assert check_equivalent((a * 7 + b) % 7, [a, b]) is b
    s = check_equivalent(((a * 7 + b) * 3 + 5) // 3, [a, b])
    assert len(toposort([s])) < len(toposort([((a * 7 + b) * 3 + 5) // 3]))


def test_bounds_decide_comparisons():
    a, c = rng(1, 7), rng(3, 3)
    assert simplify((a * 2 + c - 1).lt(14)).arg is True
    assert simplify((a * 2 + c).ge(0)).arg is True
    cond = check_equivalent((a * 2 + c - 1).ge(0), [a, c])
    assert cond.op is not Ops.CONST  # a=0, c=0 gives -1: not decidable


def test_bounds():
    a, b = rng(1, 7), rng(2, 5)
    assert (a * 3 + b).bounds == (0, 22)
    assert ((a - b) // 2).bounds == (-2, 3)
    assert (a % 4).bounds == (0, 3)
    assert UOp.const(I, 5).bounds == (5, 5)


@pytest.mark.parametrize("seed", range(5))
def test_random_index_expressions_keep_their_value(seed):
    r = np.random.default_rng(seed)
    ranges = [rng(10 + i, int(r.integers(2, 6))) for i in range(3)]
    e = UOp.const(I, int(r.integers(-3, 4)))
    for _ in range(6):
        op = r.integers(0, 5)
        x = ranges[int(r.integers(0, 3))]
        k = int(r.integers(1, 5))
        if op == 0:
            e = e + x * k
        elif op == 1:
            e = e // k
        elif op == 2:
            e = e % k
        elif op == 3:
            e = e * k - x
        else:
            e = (e + x) // k * k
    check_equivalent(e, ranges)
