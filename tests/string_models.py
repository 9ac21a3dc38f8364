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
