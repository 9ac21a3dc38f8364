"""Inputs that decide an op's semantics but not its output's size, given at run time (not fixed with
--input-value): one compiled model answers for every value, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from tests.onnx_util import make_model, reference

R = np.random.default_rng(5)


@pytest.mark.parametrize("op,attrs", [("CumSum", {}), ("CumSum", {"exclusive": 1, "reverse": 1})])
def test_cumsum_axis_at_run_time(op, attrs):
    model = make_model([helper.make_node(op, ["x", "axis"], ["y"], **attrs)],
                       {"x": (np.float32, [3, 4, 2]), "axis": (np.int64, [])}, ["y"])
    x = R.standard_normal((3, 4, 2)).astype(np.float32)
    with svodrt.load(svodc.compile(model)) as m:
        for axis in (0, 1, 2, -1, -3):
            feeds = {"x": x, "axis": np.array(axis, np.int64)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_dft_axis_at_run_time():
    model = make_model([helper.make_node("DFT", ["x", "", "axis"], ["y"])],
                       {"x": (np.float32, [2, 5, 5, 1]), "axis": (np.int64, [])}, ["y"], opset=20)
    x = R.standard_normal((2, 5, 5, 1)).astype(np.float32)
    with svodrt.load(svodc.compile(model)) as m:
        for axis in (1, 2, -2):
            feeds = {"x": x, "axis": np.array(axis, np.int64)}
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_an_axis_that_decides_a_size_still_needs_its_value():
    """The DFT axes of x [2, 5, 3, 1] differ in length: the axis decides the output's shape."""
    model = make_model([helper.make_node("DFT", ["x", "", "axis"], ["y"], onesided=1)],
                       {"x": (np.float32, [2, 5, 3, 1]), "axis": (np.int64, [])}, ["y"], opset=20)
    with pytest.raises(UnsupportedModelError, match="axis.*--input-value") as e:
        svodc.compile(model)
    assert e.value.nodes[0].needs_values == ("axis",)
