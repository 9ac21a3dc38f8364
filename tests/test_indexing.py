"""Indexing with run-time indices: the IR's GATHER/SCATTER (reference semantics, lowering, the serial
scatter kernel under several threads) and the ONNX ops built on them, against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ConstData, GatherArg, Ops, ScatterArg
from svodc.ir.shapes import ShapeError
from svodc.ir.spec import SpecError, verify
from svodc.ir.uop import UOp
from tests.onnx_util import compile_and_run, make_model, reference

R = np.random.default_rng(3)


def w(a: np.ndarray) -> UOp:
    return UOp(Ops.WEIGHT, dtypes.from_numpy(a.dtype), (), ConstData(a))


def test_gather_and_scatter_reference_semantics():
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[2, -1, 0, 7]], dtype=np.int64)  # -1 counts from the end; 7 is clamped to 2
    g = UOp(Ops.GATHER, dtypes.float32, (w(x), w(idx)), GatherArg(0))
    verify(g)
    np.testing.assert_array_equal(evaluate([g])[0], [[8, 9, 2, 11]])
    upd = np.ones((1, 4), np.float32)
    s = UOp(Ops.SCATTER, dtypes.float32, (w(x), w(idx), w(upd)), ScatterArg(0, Ops.ADD))
    want = x.copy()
    want[2, 0] += 1
    want[2, 1] += 1
    want[0, 2] += 1
    want[2, 3] += 1
    np.testing.assert_array_equal(evaluate([s])[0], want)


def test_gather_scatter_spec_and_shape_errors():
    x, idx = w(np.zeros((3, 4), np.float32)), w(np.zeros((1, 4), np.int64))
    with pytest.raises(SpecError):
        verify(UOp(Ops.GATHER, dtypes.float32, (x, w(np.zeros((1, 4), np.float32))), GatherArg(0)))
    with pytest.raises(ShapeError):
        _ = UOp(Ops.GATHER, dtypes.float32, (x, w(np.zeros((1, 5), np.int64))), GatherArg(0)).shape
    with pytest.raises(ShapeError):
        _ = UOp(Ops.SCATTER, dtypes.float32, (x, idx, w(np.zeros((2, 4), np.float32))), ScatterArg(0)).shape


CASES = {
    "gather_2d_negative": ([helper.make_node("Gather", ["x", "i"], ["y"], axis=1)],
                           {"x": R.standard_normal((3, 5)).astype(np.float32),
                            "i": np.array([[0, -1], [4, 2]], np.int64)}),
    "gather_scalar_index_int32": ([helper.make_node("Gather", ["x", "i"], ["y"], axis=0)],
                                  {"x": R.standard_normal((4, 3)).astype(np.float32), "i": np.array(-2, np.int32)}),
    "gather_elements": ([helper.make_node("GatherElements", ["x", "i"], ["y"], axis=0)],
                        {"x": R.standard_normal((3, 3)).astype(np.float32),
                         "i": np.array([[1, 2, 0], [-1, 0, 0]], np.int64)}),
    "gather_nd_batch": ([helper.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)],
                        {"x": R.standard_normal((2, 3, 4)).astype(np.float32),
                         "i": np.array([[[1, 3], [0, -1]], [[2, 2], [1, 0]]], np.int64)}),
    "scatter_nd_add_repeats": ([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
                               {"x": R.standard_normal((4, 3)).astype(np.float32),
                                "i": np.array([[1], [3], [1], [1]], np.int64),
                                "u": R.standard_normal((4, 3)).astype(np.float32)}),
    "scatter_elements_max": ([helper.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction="max")],
                             {"x": R.standard_normal((2, 5)).astype(np.float32),
                              "i": np.array([[0, 4, 4], [-1, 2, 2]], np.int64),
                              "u": R.standard_normal((2, 3)).astype(np.float32)}),
    "topk_axis0_smallest": ([helper.make_node("TopK", ["x", "k"], ["y", "yi"], axis=0, largest=0)],
                            {"x": R.standard_normal((6, 3)).astype(np.float32), "k": np.array([3], np.int64)}),
    "argmax_last_index": ([helper.make_node("ArgMax", ["x"], ["y"], axis=1, select_last_index=1)],
                          {"x": np.array([[1, 3, 3], [2, 2, 0]], np.float32)}),
    "cumsum_reverse_exclusive": ([helper.make_node("CumSum", ["x", "a"], ["y"], reverse=1, exclusive=1)],
                                 {"x": R.standard_normal((3, 5)).astype(np.float32), "a": np.array(1, np.int64)}),
    "onehot_axis0": ([helper.make_node("OneHot", ["i", "d", "v"], ["y"], axis=0)],
                     {"i": np.array([[1, -1], [5, 0]], np.int64), "d": np.array(4, np.int64),
                      "v": np.array([0.5, 2.0], np.float32)}),
    "reverse_sequence": ([helper.make_node("ReverseSequence", ["x", "l"], ["y"], batch_axis=0, time_axis=1)],
                         {"x": R.standard_normal((3, 4, 2)).astype(np.float32), "l": np.array([4, 1, 2], np.int64)}),
}


def case_model(name: str):
    """(model, feeds, output names) of CASES[name]: every input a graph input (run-time indices), except
    the ones that decide shapes (k, depth), which are initializers."""
    nodes, feeds = CASES[name]
    consts = {k: v for k, v in feeds.items() if k in ("k", "d", "a")}
    inputs = {k: v for k, v in feeds.items() if k not in consts}
    outputs = list(nodes[0].output)
    return make_model(nodes, {k: (v.dtype, list(v.shape)) for k, v in inputs.items()}, outputs, consts), inputs, outputs


@pytest.mark.parametrize("name", sorted(CASES))
def test_indexing_op_against_onnxruntime(name):
    model, inputs, outputs = case_model(name)
    want = reference(model, inputs)
    got = compile_and_run(model, inputs)
    for out, ref in zip(outputs, want, strict=True):
        np.testing.assert_allclose(got[out], ref, rtol=1e-5, atol=1e-6, err_msg=out)


def test_scatter_kernel_is_serial_under_threads():
    """Repeated indices with reduction=add: every update lands once, whatever the thread count."""
    n, m = 64, 4096
    x = np.zeros((n,), np.float32)
    idx = R.integers(-n, n, size=(m, 1)).astype(np.int64)
    upd = np.ones((m,), np.float32)
    model = make_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
                       {"x": (np.float32, [n]), "i": (np.int64, [m, 1]), "u": (np.float32, [m])}, ["y"])
    want = np.bincount(np.where(idx[:, 0] < 0, idx[:, 0] + n, idx[:, 0]), minlength=n).astype(np.float32)
    bundle = svodc.compile(model)
    for threads in (1, 4):
        with svodrt.load(bundle, threads=threads) as rt:
            np.testing.assert_array_equal(rt.run({"x": x, "i": idx, "u": upd})["y"], want)


def test_out_of_range_indices_are_clamped_not_read_outside():
    x = np.arange(5, dtype=np.float32)
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"])], {"x": (np.float32, [5]),
                                                                        "i": (np.int64, [4])}, ["y"])
    got = compile_and_run(model, {"x": x, "i": np.array([1 << 40, -(1 << 40), 7, -6], np.int64)})["y"]
    np.testing.assert_array_equal(got, [4, 0, 4, 0])
