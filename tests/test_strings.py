"""String tensors in the compiler: interning, Equal, LabelEncoder (every key and value kind of versions
1, 2 and 4), ops that move strings, and clear refusals of everything else (svodc/frontend/strings.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from svodrt_tools.verify import verify
from tests.onnx_util import reference
from tests.string_models import BOOL, F32, I64, ML, S, category_codes, string_model, strings_tensor


def _ort(model, feeds):
    """onnxruntime's outputs; it wants object arrays for strings."""
    return reference(model, {k: v.astype(object) if v.dtype.kind == "U" else v for k, v in feeds.items()})


def _run(model, feeds, **kw):
    with svodrt.load(svodc.compile(model, **kw), threads=1) as m:
        return m.run(feeds)


def _check_against_ort(model, feeds):
    got = _run(model, feeds)
    for (name, g), w in zip(got.items(), _ort(model, feeds), strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, name
        np.testing.assert_array_equal(g, w, err_msg=name)
    return got


def test_category_codes_match_onnxruntime_and_the_bundle_verifies():
    model, feeds = category_codes()
    data = svodc.compile(model, test_vectors=True)
    with svodrt.load(data, threads=1) as m:
        assert [(t.name, t.dtype) for t in m.inputs] == [("color", "string"), ("other", "string")]
        got = m.run(feeds)
        # interned in import order: the keys of the first encoder, then the new ones of the second
        assert m.bundle.vocabulary == ("red", "green", "blue", "grün", "", "東京")
    for (name, g), w in zip(got.items(), _ort(model, feeds), strict=True):
        np.testing.assert_array_equal(g, w, err_msg=name)
    assert got["code"].tolist() == [[0, 3, -1], [4, -1, -1]]
    assert got["same"].tolist() == [[True, False, True], [False, False, True]]  # "mauve" is in both inputs
    report = verify(data)  # the test vector's string inputs are ids; verify feeds strings for them
    assert report.ok, report.text()
    assert sum("test vector 0" in what for _, what in report.lines) == 3


def test_equal_broadcasts_and_compares_with_string_constants():
    nodes = [helper.make_node("Equal", ["x", "y"], ["xy"]), helper.make_node("Equal", ["x", "c"], ["xc"]),
             helper.make_node("Constant", [], ["k"], value_strings=["b", "zz", "new"]),
             helper.make_node("Equal", ["k", "y"], ["ky"])]
    model = string_model(nodes, {"x": (S, [2, 1, 3]), "y": (S, [3])},
                         {"xy": (BOOL, [2, 1, 3]), "xc": (BOOL, [2, 4, 3]), "ky": (BOOL, [3])},
                         [strings_tensor("c", ["a", "b", "", "é"] * 3, [4, 3])])
    x = np.array([[["a", "b", ""]], [["é", "new", "b"]]])
    _check_against_ort(model, {"x": x, "y": np.array(["new", "zz", "b"])})


def test_ops_that_move_strings_then_compare_them():
    """Reshape, Transpose, Slice, Gather, Concat (with a string initializer), Where, Expand, Tile, Split,
    Unsqueeze, Squeeze, Flatten, Identity, Shape and Size keep ids as they are."""
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"]),  # [3, 2]
        helper.make_node("Transpose", ["r"], ["t"], perm=[1, 0]),  # [2, 3]
        helper.make_node("Slice", ["t", "starts", "ends", "axes"], ["s"]),  # [2, 2]
        helper.make_node("Gather", ["s", "idx"], ["g"], axis=1),  # [2, 3]
        helper.make_node("Concat", ["g", "extra"], ["c"], axis=0),  # [3, 3]
        helper.make_node("Where", ["mask", "c", "extra"], ["w"]),  # [3, 3]
        helper.make_node("Unsqueeze", ["w", "ax0"], ["u"]),
        helper.make_node("Expand", ["u", "eshape"], ["e"]),  # [2, 3, 3]
        helper.make_node("Tile", ["e", "reps"], ["ti"]),  # [2, 3, 6]
        helper.make_node("Split", ["ti"], ["p0", "p1"], axis=2, num_outputs=2),
        helper.make_node("Flatten", ["p1"], ["f"], axis=1),  # [2, 9]
        helper.make_node("Identity", ["f"], ["i"]),
        helper.make_node("Squeeze", ["u", "ax0"], ["sq"]),
        helper.make_node("Equal", ["i", "word"], ["eq"]),
        helper.make_node("LabelEncoder", ["p0"], ["codes"], domain=ML, keys_strings=["b", "keep"],
                         values_int64s=[10, 20]),
        helper.make_node("Equal", ["sq", "w"], ["same"]),
        helper.make_node("Shape", ["ti"], ["shp"]), helper.make_node("Size", ["ti"], ["n"]),
    ]
    i64 = numpy_helper.from_array
    inits = [i64(np.array([3, 2], np.int64), "shape"), i64(np.array([1], np.int64), "starts"),
             i64(np.array([3], np.int64), "ends"), i64(np.array([1], np.int64), "axes"), i64(np.array([1, 0, 1], np.int64), "idx"),
             strings_tensor("extra", ["keep", "b", "zz"], [1, 3]), strings_tensor("word", ["b"], []),
             i64(np.array([0], np.int64), "ax0"), i64(np.array([2, 3, 3], np.int64), "eshape"),
             i64(np.array([1, 1, 2], np.int64), "reps"),
             numpy_helper.from_array(np.array([[True, False, True]]), "mask")]
    model = string_model(nodes, {"x": (S, [6])},
                         {"eq": (BOOL, [2, 9]), "codes": (I64, [2, 3, 3]), "same": (BOOL, [3, 3]),
                          "shp": (I64, [3]), "n": (I64, [])}, inits)
    got = _check_against_ort(model, {"x": np.array(["a", "b", "c", "b", "new", "keep"])})
    assert got["eq"].any() and not got["eq"].all() and got["codes"].max() == 20


def _encoder(x_type, y_type, shape, ml_opset=4, **attrs):
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, **attrs)
    return string_model([node], {"x": (x_type, shape)}, {"y": (y_type, shape)}, ml_opset=ml_opset)


@pytest.mark.parametrize("case", [
    # (ONNX input and output types, LabelEncoder version, attributes, input): checked against onnxruntime
    (S, F32, 2, dict(keys_strings=["a", "bb", "ü"], values_floats=[0.5, -2.0, 7.0], default_float=3.25),
     np.array(["bb", "?", "ü", "a"])),
    (S, I64, 1, dict(classes_strings=["cat", "dog"], default_int64=9), np.array([["dog", "eel"], ["cat", ""]])),
    (I64, F32, 2, dict(keys_int64s=[3, 4, 9, -2], values_floats=[1.0, 2.0, 3.0, 4.0]),  # a table
     np.array([3, 4, 5, -2, 9, 10, -3, 2**40], np.int64)),
    (I64, I64, 2, dict(keys_int64s=[-5, 10**12, 7], values_int64s=[1, 2, 3], default_int64=0),  # compares
     np.array([-5, 10**12, 7, 8, 0], np.int64)),
    (I64, I64, 2, dict(keys_int64s=[-2**63, 2**63 - 1, 0], values_int64s=[1, 2, 3]),  # extremes: a compare chain
     np.array([-2**63, 2**63 - 1, 0, 1, -1], np.int64)),
    (I64, I64, 2, dict(keys_int64s=[-2**63, -2**63 + 1], values_int64s=[1, 2]),  # a table starting at INT64_MIN
     np.array([-2**63, -2**63 + 1, -2**63 + 2, 2**63 - 1], np.int64)),
    (F32, I64, 4, dict(keys_floats=[1.5, float("nan"), -0.0], values_int64s=[1, 2, 3]),  # NaN matches NaN
     np.array([1.5, np.nan, 0.0, -0.0, 7.0, -np.nan], np.float32)),
], ids=["str-float", "v1-classes", "int-table", "int-sparse", "int-extremes", "int-table-min", "float-nan"])
def test_label_encoder_matches_onnxruntime(case):
    x_type, y_type, version, attrs, x = case
    _check_against_ort(_encoder(x_type, y_type, list(x.shape), version, **attrs), {"x": x})


def test_label_encoder_tensor_attributes_of_types_onnxruntime_lacks():
    """keys_tensor / values_tensor / default_tensor of int32, int16 and double (onnxruntime implements
    none of these): expected values by the schema's rule, written out."""
    t = numpy_helper.from_array
    model = _encoder(TensorProto.INT32, TensorProto.DOUBLE, [4], keys_tensor=t(np.array([7, -1, 3], np.int32)),
                     values_tensor=t(np.array([0.5, 1.5, 2.5])))
    y = _run(model, {"x": np.array([3, 7, 8, -1], np.int32)})["y"]
    assert y.dtype == np.float64 and y.tolist() == [2.5, 0.5, -0.0, 1.5] and np.signbit(y[2])  # default -0.0
    model = _encoder(TensorProto.DOUBLE, TensorProto.INT16, [3], keys_tensor=t(np.array([0.25, np.nan])),
                     values_tensor=t(np.array([4, 5], np.int16)), default_tensor=t(np.array([-9], np.int16)))
    assert _run(model, {"x": np.array([np.nan, 0.25, 1.0])})["y"].tolist() == [5, 4, -9]
    model = _encoder(S, TensorProto.INT32, [3], keys_tensor=strings_tensor("k", ["x", "y"]),
                     values_tensor=t(np.array([10, 20], np.int32)))
    y = _run(model, {"x": np.array(["y", "x", "z"])})["y"]
    assert y.dtype == np.int32 and y.tolist() == [20, 10, -1]


def test_label_encoder_repeated_key_takes_the_last_value():
    """The schema (LabelEncoder-4): "If a key is repeated, the last key takes precedence" (onnxruntime
    keeps the first one instead, so this is checked against the schema, not onnxruntime)."""
    model = _encoder(S, I64, [3], keys_strings=["a", "b", "a"], values_int64s=[1, 2, 3])
    assert _run(model, {"x": np.array(["a", "b", "c"])})["y"].tolist() == [3, 2, -1]
    model = _encoder(F32, I64, [2], keys_floats=[1.0, 1.0], values_int64s=[1, 2])
    assert _run(model, {"x": np.array([1.0, 0.0], np.float32)})["y"].tolist() == [2, -1]


def test_string_value_fixed_at_compile_time_is_interned():
    model, feeds = category_codes()
    got = _run(model, {"color": feeds["color"]}, input_values={"other": np.array(["red", "teal", "mauve"])})
    assert got["same"].tolist() == [[True, False, True], [False, False, True]]


def _refusal(model) -> str:
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile(model)
    return str(e.value)


def test_unsupported_uses_of_strings_are_refused_with_the_node_and_reason():
    cast = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT, name="parse")
    msg = _refusal(string_model([cast], {"x": (S, [2])}, {"y": (F32, [2])}))
    assert "parse (ai.onnx::Cast" in msg and "Cast on string tensors is not supported" in msg
    to_str = helper.make_node("Cast", ["x"], ["y"], to=TensorProto.STRING, name="fmt")
    msg = _refusal(string_model([to_str], {"x": (F32, [2])}, {"y": (S, [2])}))
    assert "fmt (ai.onnx::Cast" in msg and "producing a string tensor is not supported" in msg
    mixed = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, keys_int64s=[1], values_int64s=[2],
                             name="mixed")
    msg = _refusal(string_model([mixed], {"x": (S, [2])}, {"y": (I64, [2])}))
    assert "the keys are int64, the input is string" in msg
    less = helper.make_node("Less", ["x", "x"], ["y"], name="order")  # ONNX has no string order either
    assert "Less on string tensors is not supported" in _refusal(string_model([less], {"x": (S, [2])},
                                                                                {"y": (BOOL, [2])}))


def test_bundles_with_strings_are_reproducible_across_processes(tmp_path):
    """The vocabulary is in import order, never in hash order: two processes with different hash seeds
    write the same bytes."""
    import os
    import subprocess
    import sys

    model, _ = category_codes()
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    script = "import sys, svodc; svodc.compile_to_file(sys.argv[1], sys.argv[2], target='x86_64')"
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        subprocess.run([sys.executable, "-c", script, str(tmp_path / "m.onnx"), str(tmp_path / f"{seed}.svod")],
                       check=True, env=env, timeout=300)
    assert (tmp_path / "1.svod").read_bytes() == (tmp_path / "2.svod").read_bytes()
