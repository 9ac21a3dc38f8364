"""Values that decide output sizes given at run time (no --input-value): the size is bounded by the
input's shape, the output is computed at the bound and returned at its real shape (computed dims),
against onnxruntime for several values through one compiled model; an invalid value fails the run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.errors import SvodcError, UnsupportedModelError
from tests.onnx_util import make_model, reference

R = np.random.default_rng(7)
X = R.standard_normal((3, 4, 2)).astype(np.float32)


def _i64(*v: int) -> np.ndarray:
    return np.array(v, np.int64)


def _agree(model, feed_sets: list[dict[str, np.ndarray]]) -> None:
    with svodrt.load(svodc.compile(model)) as m:
        for feeds in feed_sets:
            got = m.run(feeds)
            for name, want in zip([o.name for o in model.graph.output], reference(model, feeds), strict=True):
                assert got[name].shape == want.shape, (feeds, name)
                np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6, err_msg=str(feeds))


@pytest.mark.parametrize("op,keepdims", [("ReduceSum", 1), ("ReduceMean", 0), ("ReduceLogSumExp", 1), ("ReduceMax", 0)])
def test_reduce_with_axes_at_run_time(op, keepdims):
    model = make_model([helper.make_node(op, ["x", "axes"], ["y"], keepdims=keepdims)],
                       {"x": (np.float32, [3, 4, 2]), "axes": (np.int64, [2])}, ["y"], opset=18)
    _agree(model, [{"x": X, "axes": _i64(*a)} for a in ([0, 2], [-1, 1], [1, 0])])


def test_invalid_run_time_axes_fail_the_run():
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"])],
                       {"x": (np.float32, [3, 4, 2]), "axes": (np.int64, [2])}, ["y"], opset=18)
    with svodrt.load(svodc.compile(model)) as m:
        for bad in ([1, 1], [0, 3], [1, -2]):
            with pytest.raises(svodrt.InputError):
                m.run({"x": X, "axes": _i64(*bad)})


def test_views_with_geometry_at_run_time():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["r"]),
                        helper.make_node("Unsqueeze", ["x", "axes"], ["u"]),
                        helper.make_node("Slice", ["x", "starts", "ends", "sl_axes", "steps"], ["s"]),
                        helper.make_node("Split", ["x", "split"], ["p0", "p1"], axis=1)],
                       {"x": (np.float32, [3, 4, 2]), "shape": (np.int64, [2]), "axes": (np.int64, [1]),
                        "starts": (np.int64, [2]), "ends": (np.int64, [2]), "sl_axes": (np.int64, [2]),
                        "steps": (np.int64, [2]), "split": (np.int64, [2])}, ["r", "u", "s", "p0", "p1"], opset=18)
    _agree(model, [
        {"x": X, "shape": _i64(-1, 4), "axes": _i64(0), "starts": _i64(0, 1), "ends": _i64(10, 4),
         "sl_axes": _i64(0, 1), "steps": _i64(2, 1), "split": _i64(1, 3)},
        {"x": X, "shape": _i64(6, 0), "axes": _i64(-1), "starts": _i64(-1, 0), "ends": _i64(-100, 2),
         "sl_axes": _i64(-1, 0), "steps": _i64(-1, 1), "split": _i64(4, 0)},
    ])


def test_top_k_with_k_at_run_time():
    model = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)],
                       {"x": (np.float32, [3, 4, 2]), "k": (np.int64, [1])}, ["v", "i"], opset=11)
    _agree(model, [{"x": X, "k": _i64(k)} for k in (0, 1, 4)])


def test_data_dependent_outputs():
    """NonZero, Compress and Unique: outputs sized at their bound, returned at the real count."""
    model = make_model([helper.make_node("NonZero", ["m"], ["nz"]),
                        helper.make_node("Compress", ["x", "c"], ["cx"], axis=1),
                        helper.make_node("Unique", ["u"], ["uy", "ui", "uinv", "uc"], sorted=1)],
                       {"m": (np.float32, [2, 3]), "x": (np.float32, [3, 4, 2]), "c": (np.bool_, [4]),
                        "u": (np.float32, [6])}, ["nz", "cx", "uy", "ui", "uinv", "uc"], opset=11)
    _agree(model, [
        {"m": np.array([[0, 1, 0], [2, 0, 3]], np.float32), "x": X, "c": np.array([1, 0, 1, 1], bool),
         "u": np.array([2, 1, 1, 3, 4, 3], np.float32)},
        {"m": np.zeros((2, 3), np.float32), "x": X, "c": np.zeros(4, bool), "u": np.full(6, 7, np.float32)},
    ])


def test_sizes_a_user_bounds():
    """Range's length, OneHot's depth, a Pad: nothing bounds them but the user (--dim TENSOR:AXIS)."""
    model = make_model([helper.make_node("Range", ["start", "limit", "delta"], ["r"]),
                        helper.make_node("OneHot", ["idx", "depth", "values"], ["oh"]),
                        helper.make_node("Pad", ["x", "pads"], ["p"], mode="reflect")],
                       {"start": (np.int64, []), "limit": (np.int64, []), "delta": (np.int64, []),
                        "idx": (np.int64, [3]), "depth": (np.int64, []), "values": (np.float32, [2]),
                        "x": (np.float32, [3, 4, 2]), "pads": (np.int64, [6])}, ["r", "oh", "p"], opset=18)
    bounds = {"r:0": (0, 20), "oh:1": (0, 8), "p:0": (0, 8), "p:1": (0, 8), "p:2": (0, 8)}
    feed_sets = [{"start": np.array(s, np.int64), "limit": np.array(lim, np.int64), "delta": np.array(d, np.int64),
                  "idx": _i64(0, -1, 2), "depth": np.array(dep, np.int64), "values": np.array([0, 3], np.float32),
                  "x": X, "pads": _i64(*pads)}
                 for s, lim, d, dep, pads in ((0, 10, 3, 4, (1, 0, 1, 1, 2, 0)), (5, -9, -2, 8, (0, 0, 0, 0, 0, 1)))]
    with svodrt.load(svodc.compile(model, dims=bounds)) as m:
        for feeds in feed_sets:
            got = m.run(feeds)
            for name, want in zip(["r", "oh", "p"], reference(model, feeds), strict=True):
                np.testing.assert_array_equal(got[name], want)
        with pytest.raises(svodrt.InputError, match="r:0"):  # 0..99 step 1 is 100 long, over the bound 20
            m.run({**feed_sets[0], "start": np.array(0, np.int64), "limit": np.array(100, np.int64),
                   "delta": np.array(1, np.int64)})


def test_an_unbounded_size_names_the_flag_to_paste():
    model = make_model([helper.make_node("Range", ["start", "limit", "delta"], ["r"])],
                       {"start": (np.float32, []), "limit": (np.float32, []), "delta": (np.float32, [])}, ["r"])
    with pytest.raises(UnsupportedModelError, match=r"--dim r:0=0\.\.") as e:
        svodc.compile(model)
    assert e.value.nodes[0].needs_dims == ("r:0",)


def test_value_sized_tensors_feed_later_ops():
    """A value-sized tensor feeds later work, which loops to its real size (a mean divides by the real
    count); an index into the value-sized axis is refused, not answered from the bound."""
    model = make_model([helper.make_node("Compress", ["x", "c"], ["cx"], axis=1),
                        helper.make_node("Relu", ["cx"], ["r"]), helper.make_node("Transpose", ["r"], ["t"]),
                        helper.make_node("ReduceMean", ["cx"], ["m"], axes=[1])],
                       {"x": (np.float32, [3, 4, 2]), "c": (np.bool_, [4])}, ["t", "m"], opset=13)
    _agree(model, [{"x": X, "c": np.array(c, bool)} for c in ([1, 0, 1, 1], [0, 0, 0, 1])])
    picked = make_model([helper.make_node("Compress", ["x", "c"], ["cx"], axis=1),
                         helper.make_node("Gather", ["cx", "i"], ["g"], axis=1)],
                        {"x": (np.float32, [3, 4, 2]), "c": (np.bool_, [4])}, ["g"], {"i": np.array([0], np.int64)},
                        opset=13)
    with pytest.raises(SvodcError, match="bounded dim"):
        svodc.compile(picked)


def test_a_run_time_value_on_a_bounded_input_dim_needs_fixing():
    model = make_model([helper.make_node("Reshape", ["x", "shape"], ["y"])],
                       {"x": (np.float32, ["N", 4]), "shape": (np.int64, [2])}, ["y"], opset=14)
    with pytest.raises(UnsupportedModelError, match="shape.*--input-value"):
        svodc.compile(model, dims={"N": (1, 4)})


def test_cli_bound_flag(tmp_path):
    import onnx

    from tests.test_cli import run

    model = make_model([helper.make_node("Range", ["start", "limit", "delta"], ["r"])],
                       {"start": (np.int64, []), "limit": (np.int64, []), "delta": (np.int64, [])}, ["r"])
    path = tmp_path / "range.onnx"
    onnx.save(model, path)
    cli = ["compile", str(path), "-o", str(tmp_path / "r.svod"), "-q"]
    r = run("svodc", *cli)
    assert r.returncode == 1 and "--dim r:0=0..64" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = run("svodc", *cli, "--dim", "r:0=0..16")
    assert r.returncode == 0, r.stderr
    with svodrt.load(tmp_path / "r.svod") as m:
        got = m.run({"start": np.array(2), "limit": np.array(9), "delta": np.array(3)})["r"]
    np.testing.assert_array_equal(got, np.arange(2, 9, 3))
