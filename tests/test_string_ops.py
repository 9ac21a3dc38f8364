"""String ops and string outputs: StringNormalizer of a graph input computed by svodrt at the edge (the
onnx package's `simple` strnorm models), the four string ops folded at compile time, string outputs
decoded from ids (including input strings the vocabulary lacks), and the refusals."""

from __future__ import annotations

import glob
import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from tests.ml_util import assert_same, ml_model, reference_run, svod_run

S, I64, BOOL = TensorProto.STRING, TensorProto.INT64, TensorProto.BOOL
SIMPLE = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "simple")


def _pb(path: str) -> np.ndarray:
    t = onnx.TensorProto()
    with open(path, "rb") as f:
        t.ParseFromString(f.read())
    return numpy_helper.to_array(t)


@pytest.mark.parametrize("case", sorted(os.path.basename(p) for p in glob.glob(os.path.join(SIMPLE, "test_strnorm_*"))))
def test_onnx_simple_string_normalizer_models(case):
    """Run-time string input -> StringNormalizer -> graph output (its shape depends on the strings)."""
    folder = os.path.join(SIMPLE, case)
    model = onnx.load(os.path.join(folder, "model.onnx"))
    x, want = _pb(os.path.join(folder, "test_data_set_0", "input_0.pb")), _pb(
        os.path.join(folder, "test_data_set_0", "output_0.pb"))
    with svodrt.load(svodc.compile(model), threads=1) as m:
        got = m.run({model.graph.input[0].name: x})
        assert m.bundle.edge_outputs and not m.bundle.outputs  # nothing for native code to do
    assert_same(got[model.graph.output[0].name], want, case)


def test_simple_normalizer_models_are_there():
    assert len(glob.glob(os.path.join(SIMPLE, "test_strnorm_*"))) == 6


def _folded(nodes, inputs, outputs, values, opset=20):
    model = ml_model(nodes, inputs, outputs, opset=opset)
    got = svod_run(model, {}, input_values=values)
    for o, w in zip(model.graph.output, reference_run(model, values), strict=True):
        assert_same(got[o.name], w, o.name)
    return got


def test_string_ops_on_constants_fold_at_compile_time():
    words = np.array([["a,b", "東京,,x"], ["", "no comma"]], dtype=object)
    nodes = [helper.make_node("StringConcat", ["w", "tail"], ["cat"]),
             helper.make_node("RegexFullMatch", ["cat"], ["match"], pattern=r"[a-z, ]*!"),
             helper.make_node("StringSplit", ["w"], ["parts", "counts"], delimiter=","),
             helper.make_node("StringSplit", ["w"], ["words", "nwords"])]
    got = _folded(nodes, {"w": (S, [2, 2]), "tail": (S, [2])},
                  {"cat": (S, [2, 2]), "match": (BOOL, [2, 2]), "parts": (S, [2, 2, 3]), "counts": (I64, [2, 2]),
                   "words": (S, [2, 2, 2]), "nwords": (I64, [2, 2])},
                  {"w": words, "tail": np.array(["!", "?"], dtype=object)})
    assert got["match"].tolist() == [[True, False], [True, False]]


def test_string_normalizer_on_a_constant_folds():
    node = helper.make_node("StringNormalizer", ["w"], ["n"], case_change_action="LOWER", stopwords=["B"])
    model = ml_model([node], {"w": (S, [1, 3])}, {"n": (S, [1, None])})
    got = svod_run(model, {}, input_values={"w": np.array([["A", "b", "Ç"]])})
    assert got["n"].tolist() == [["a", "ç"]]


def test_string_outputs_return_input_strings_the_vocabulary_lacks():
    nodes = [helper.make_node("Identity", ["x"], ["same"]),
             helper.make_node("Where", ["pick", "x", "k"], ["mixed"]),
             helper.make_node("Constant", [], ["k"], value_strings=["known"])]
    model = ml_model(nodes, {"x": (S, [3]), "pick": (BOOL, [3])}, {"same": (S, [3]), "mixed": (S, [3])})
    feeds = {"x": np.array(["new", "東京", ""]), "pick": np.array([True, False, True])}
    got = svod_run(model, feeds)
    assert got["same"].tolist() == ["new", "東京", ""] and got["same"].dtype == object
    assert got["mixed"].tolist() == ["new", "known", ""]


def _refusal(model) -> str:
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile(model)
    return str(e.value)


def test_string_work_on_run_time_strings_is_refused_with_the_reason():
    concat = helper.make_node("StringConcat", ["x", "x"], ["y"], name="join")
    msg = _refusal(ml_model([concat], {"x": (S, [2])}, {"y": (S, [2])}, opset=20))
    assert "join (ai.onnx::StringConcat" in msg and "svod does no string work in compiled code" in msg
    nodes = [helper.make_node("StringNormalizer", ["x"], ["n"], case_change_action="UPPER"),
             helper.make_node("Equal", ["n", "n"], ["y"], name="after")]
    msg = _refusal(ml_model(nodes, {"x": (S, [2])}, {"y": (BOOL, [None])}))
    assert "after (ai.onnx::Equal" in msg and "which svod computes only as a graph output" in msg
