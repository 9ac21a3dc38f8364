"""Small ONNX models with string tensors, for the string tests (tests/test_strings.py,
tests/test_string_inputs.py) and the golden bundle of format 1.4 (scripts/golden_bundles.py)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

ML = "ai.onnx.ml"
S, I64, F32, BOOL = TensorProto.STRING, TensorProto.INT64, TensorProto.FLOAT, TensorProto.BOOL


def string_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list[int]]],
                 outputs: dict[str, tuple[int, list[int]]], initializers: list[onnx.TensorProto] = (),
                 opset: int = 19, ml_opset: int = 4) -> onnx.ModelProto:
    """A model of the given nodes; inputs and outputs as {name: (ONNX element type, shape)}."""
    graph = helper.make_graph(nodes, "strings",
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()],
                              list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ML, ml_opset)])


def strings_tensor(name: str, values: list[str], shape: list[int] | None = None) -> onnx.TensorProto:
    return helper.make_tensor(name, S, shape if shape is not None else [len(values)],
                              [v.encode() for v in values])


def category_codes() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """What an sklearn-onnx pipeline does with a categorical column: string -> code (LabelEncoder),
    string -> float weight, and a comparison of two string inputs (Equal), with non-ASCII, empty and
    unknown strings in the input."""
    nodes = [
        helper.make_node("LabelEncoder", ["color"], ["code"], domain=ML,
                         keys_strings=["red", "green", "blue", "grün", ""], values_int64s=[0, 1, 2, 3, 4],
                         default_int64=-1),
        helper.make_node("LabelEncoder", ["color"], ["weight"], domain=ML, keys_strings=["red", "東京"],
                         values_floats=[0.25, 4.0], default_float=-1.5),
        helper.make_node("Equal", ["color", "other"], ["same"]),
    ]
    model = string_model(nodes, {"color": (S, [2, 3]), "other": (S, [3])},
                         {"code": (I64, [2, 3]), "weight": (F32, [2, 3]), "same": (BOOL, [2, 3])})
    feeds = {"color": np.array([["red", "grün", "mauve"], ["", "東京", "mauve"]]),
             "other": np.array(["red", "teal", "mauve"])}
    return model, feeds


def labels_and_maps() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Format 1.5's outputs decoded at the edge: a two-tree classifier with string labels (a string
    output) and its ZipMap (a list of dicts), LabelEncoder int64 -> string, an input string passed
    through (a string the vocabulary lacks comes back), and StringNormalizer of a string input."""
    tree = dict(nodes_treeids=[0, 0, 0, 1, 1, 1], nodes_nodeids=[0, 1, 2, 0, 1, 2],
                nodes_featureids=[0, 0, 0, 1, 0, 0], nodes_values=[0.5, 0, 0, -1.0, 0, 0],
                nodes_modes=["BRANCH_LEQ", "LEAF", "LEAF", "BRANCH_LT", "LEAF", "LEAF"],
                nodes_truenodeids=[1, 0, 0, 1, 0, 0], nodes_falsenodeids=[2, 0, 0, 2, 0, 0],
                class_treeids=[0, 0, 0, 1, 1], class_nodeids=[1, 2, 2, 1, 2], class_ids=[0, 1, 2, 0, 1],
                class_weights=[0.5, 0.25, 0.75, 1.0, 0.6], classlabels_strings=["ant", "bee", "東京"],
                post_transform="SOFTMAX")
    nodes = [helper.make_node("TreeEnsembleClassifier", ["x"], ["label", "scores"], domain=ML, **tree),
             helper.make_node("ZipMap", ["scores"], ["probabilities"], domain=ML,
                              classlabels_strings=["ant", "bee", "東京"]),
             helper.make_node("LabelEncoder", ["code"], ["name"], domain=ML, keys_int64s=[1, 2, 7],
                              values_strings=["one", "two", "seven"], default_string="?"),
             helper.make_node("Identity", ["word"], ["same_word"]),
             helper.make_node("StringNormalizer", ["word"], ["normal"], case_change_action="UPPER",
                              stopwords=["the"], locale="C.UTF-8")]
    graph = helper.make_graph(nodes, "labels_and_maps",
                              [helper.make_tensor_value_info("x", F32, [3, 2]),
                               helper.make_tensor_value_info("code", I64, [4]),
                               helper.make_tensor_value_info("word", S, [3])],
                              [helper.make_tensor_value_info("label", S, [3]),
                               helper.make_tensor_value_info("scores", F32, [3, 3]),
                               helper.make_value_info("probabilities", helper.make_sequence_type_proto(
                                   helper.make_map_type_proto(S, helper.make_tensor_type_proto(F32, [])))),
                               helper.make_tensor_value_info("name", S, [4]),
                               helper.make_tensor_value_info("same_word", S, [3]),
                               helper.make_tensor_value_info("normal", S, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19), helper.make_opsetid(ML, 3)])
    feeds = {"x": np.array([[0.2, -3.0], [0.9, 0.0], [np.nan, -2.0]], np.float32),
             "code": np.array([2, 7, 0, 1], np.int64), "word": np.array(["The", "cat", "東京"])}
    return model, feeds


def string_program() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """Format 1.8's string program, run by svodrt before the code: StringNormalizer -> LabelEncoder ->
    Cast, StringSplit's counts into code and its substrings out, StringConcat with a constant ->
    RegexFullMatch (RE2 `\\d` and `$`, rewritten for Python's re)."""
    nodes = [helper.make_node("StringNormalizer", ["text"], ["lower"], case_change_action="LOWER", locale="C.UTF-8"),
             helper.make_node("LabelEncoder", ["lower"], ["code"], domain=ML, keys_strings=["red", "green", "東京"],
                              values_int64s=[1, 2, 3], default_int64=0),
             helper.make_node("StringSplit", ["text"], ["words", "count"], delimiter=" "),
             helper.make_node("Cast", ["count"], ["n"], to=F32),
             helper.make_node("Add", ["n", "code_f"], ["score"]),
             helper.make_node("Cast", ["code"], ["code_f"], to=F32),
             helper.make_node("StringConcat", ["lower", "tail"], ["tagged"]),
             helper.make_node("Constant", [], ["tail"], value_strings=["#1"]),
             helper.make_node("RegexFullMatch", ["tagged"], ["ok"], pattern=r"[a-z ]+#\d$")]
    graph = helper.make_graph(nodes, "string_program", [helper.make_tensor_value_info("text", S, [4])],
                              [helper.make_tensor_value_info("score", F32, [4]),
                               helper.make_tensor_value_info("words", S, [4, None]),
                               helper.make_tensor_value_info("ok", BOOL, [4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(ML, 4)])
    return model, {"text": np.array(["Red", "GREEN light", "東京", "a b c"])}


def storable(v: object) -> np.ndarray:
    """An output as an array np.savez keeps without pickling, compared bit for bit: strings as str, a
    ZipMap's list of dicts as "key=repr(score)" strings (repr is exact for floats)."""
    if isinstance(v, list):
        return np.array([[f"{k}={s!r}" for k, s in row.items()] for row in v])
    return v.astype(str) if v.dtype == object else v
