"""UOp: hash-consing, immutability, stable structural hashes, deep graphs, shapes."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, InputArg, Ops, ShapeArg
from svodc.ir.shapes import ShapeError
from svodc.ir.uop import UOp, toposort


def x_input(shape=(2, 3)) -> UOp:
    return UOp(Ops.INPUT, dtypes.float32, (), InputArg("x", shape))


def test_hash_consing_returns_the_same_object():
    a = x_input()
    b = x_input()
    assert a is b
    assert T.alu(Ops.ADD, a, a) is T.alu(Ops.ADD, b, b)
    assert UOp.const(dtypes.float32, 1.0) is UOp.const(dtypes.float32, 1.0)


def test_consts_distinguish_what_python_equality_conflates():
    assert UOp.const(dtypes.float32, 0.0) is not UOp.const(dtypes.float32, -0.0)
    assert UOp.const(dtypes.float32, float("nan")) is UOp.const(dtypes.float32, float("nan"))
    assert UOp.const(dtypes.int32, 1) is not UOp.const(dtypes.float32, 1.0)


def test_uops_are_immutable_and_have_no_truth_value():
    a = x_input()
    with pytest.raises(AttributeError):
        a.op = Ops.CONST  # type: ignore[misc]
    with pytest.raises(TypeError):
        bool(a)


def test_weights_are_shared_by_content():
    w1 = UOp(Ops.WEIGHT, dtypes.float32, (), ConstData(np.arange(6, dtype=np.float32)))
    w2 = UOp(Ops.WEIGHT, dtypes.float32, (), ConstData(np.arange(6, dtype=np.float32)))
    w3 = UOp(Ops.WEIGHT, dtypes.float32, (), ConstData(np.arange(6, dtype=np.float32) + 1))
    assert w1 is w2 and w1 is not w3
    assert not w1.arg.array.flags.writeable


def test_structural_hash_is_stable_across_processes():
    code = ("from svodc.ir.uop import UOp; from svodc.ir.ops import *; from svodc.ir.dtypes import dtypes;"
            "from svodc.ir import tensor as T;"
            "x = UOp(Ops.INPUT, dtypes.float32, (), InputArg('x', (2, 3)));"
            "print(T.reduce(T.alu(Ops.MUL, x, T.const(0.5, dtypes.float32, (2, 3))), Ops.ADD, [1]).structural_hash.hex())")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
            for _ in range(2)}
    x = x_input()
    here = T.reduce(T.alu(Ops.MUL, x, T.const(0.5, dtypes.float32, (2, 3))), Ops.ADD, [1]).structural_hash.hex()
    assert outs == {here + "\n"}


def test_structural_hash_differs_when_structure_differs():
    x = x_input()
    assert T.reduce(x, Ops.ADD, [0]).structural_hash != T.reduce(x, Ops.ADD, [1]).structural_hash
    assert T.reduce(x, Ops.ADD, [0]).structural_hash != T.reduce(x, Ops.MAX, [0]).structural_hash


def test_deep_graphs_need_no_recursion():
    x = x_input((4,))
    y = x
    for i in range(20000):
        y = T.alu(Ops.ADD, y, T.const(float(i % 7), dtypes.float32, (4,)))
    assert y.shape == (4,)
    assert len(y.structural_hash) == 32
    assert len(toposort([y])) > 20000


def test_shape_inference_and_errors():
    x = x_input((2, 3))
    assert T.permute(x, (1, 0)).shape == (3, 2)
    assert T.reshape(x, (3, 2)).shape == (3, 2)
    assert T.window(T.reshape(x, (1, 2, 3)), [2], [2], [1], [1]).shape == (1, 2, 2, 2)
    assert T.reduce(x, Ops.ADD, [1]).shape == (2, 1)
    with pytest.raises(ShapeError):
        _ = UOp(Ops.RESHAPE, dtypes.float32, (x,), ShapeArg((4, 2))).shape
    y = UOp(Ops.INPUT, dtypes.float32, (), InputArg("y", (3, 2)))
    with pytest.raises(ShapeError):
        _ = T.alu(Ops.ADD, x, y).shape
