"""Loop reductions over several axes (passes/lower.py): one merged REDUCE range where the reduced elements
are contiguous (no div/mod), nested ranges where they are not; outputs against onnxruntime either way."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops, RangeKind
from svodc.ir.uop import toposort
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY
from tests.onnx_util import compile_and_run, make_model, reference


def _reduce_ranges(model, policy=DEFAULT_POLICY) -> list[int]:
    """Per LOOP_REDUCE of the program, how many REDUCE ranges it loops over."""
    program = build_program(import_model(model), CompileOptions(), policy)
    nodes = [n for k in program.kernels for n in toposort([k.ast])]
    return [sum(1 for r in n.src[1:] if r.op is Ops.RANGE and r.arg.kind is RangeKind.REDUCE)
            for n in nodes if n.op is Ops.LOOP_REDUCE]


def _axes(axes: list[int]) -> dict[str, np.ndarray]:
    return {"axes": np.array(axes, np.int64)}


@pytest.mark.parametrize("nodes, shape, inits, ranges", [
    # GlobalAveragePool over 13 x 13 (squeezenet's last layer): one loop of 169
    ([helper.make_node("GlobalAveragePool", ["x"], ["y"])], [1, 8, 13, 13], {}, [1]),
    # axes 1, 2 of [2, 6, 7, 3]: 42 elements 3 apart, one loop
    ([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], [2, 6, 7, 3], _axes([1, 2]), [1]),
    # a max over axes 2, 3 of a transposed tensor: its elements are not one strided run, two loops
    ([helper.make_node("Transpose", ["x"], ["t"], perm=[0, 1, 3, 2]),
      helper.make_node("ReduceMax", ["t", "axes"], ["y"], keepdims=1)], [1, 4, 9, 7], _axes([2, 3]), [2]),
])
def test_multi_axis_reduce(nodes, shape, inits, ranges):
    model = make_model(nodes, {"x": (np.float32, shape)}, ["y"], inits, opset=18)
    assert _reduce_ranges(model) == ranges
    assert _reduce_ranges(model, DEFAULT_POLICY.without("merge_inner_loops")) == [2]
    feeds = {"x": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}
    got = compile_and_run(model, feeds)["y"]
    np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceSum", "ReduceProd", "ReduceSumSquare"])
def test_a_reduce_over_an_empty_axis_is_its_identity(op):
    """An axis of size 0 among several reduced ones: the identity, not a merged range split by a size of 0."""
    model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=0)], {"x": (np.float32, [2, 0, 5])},
                       ["y"], _axes([1, 2]), opset=18)
    feeds = {"x": np.zeros((2, 0, 5), np.float32)}
    np.testing.assert_array_equal(compile_and_run(model, feeds)["y"], reference(model, feeds)[0])
