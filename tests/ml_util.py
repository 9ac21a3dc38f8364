"""Compile-and-compare helpers for the ai.onnx.ml and string tests: svod against onnxruntime (or the
onnx reference evaluator), outputs of every kind (numbers, strings, ZipMap's list of dicts)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

import svodc
import svodrt

ML = "ai.onnx.ml"


def ml_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[int, list]], outputs: dict[str, tuple[int, list]],
             ml_opset: int = 3, opset: int = 19) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, "ml", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
                              [helper.make_tensor_value_info(n, t, s) for n, (t, s) in outputs.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ML, ml_opset)])


def svod_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], **kw) -> dict:
    shapes = {k: v.shape for k, v in feeds.items()}
    with svodrt.load(svodc.compile(model, input_shapes=shapes, **kw), threads=1) as m:
        return m.run(feeds)


def ort_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    import onnxruntime as ort

    s = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return s.run(None, {k: v.astype(object) if v.dtype.kind == "U" else v for k, v in feeds.items()})


def reference_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list:
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model).run(None, feeds)


def assert_same(got: object, want: object, name: str, rtol: float = 1e-5, atol: float = 1e-6) -> None:
    if isinstance(want, list):  # ZipMap
        assert isinstance(got, list) and len(got) == len(want), name
        for g, w in zip(got, want, strict=True):
            assert list(g) == list(w), name
            np.testing.assert_allclose(list(g.values()), list(w.values()), rtol=rtol, atol=atol, err_msg=name)
        return
    want = np.asarray(want)
    assert got.shape == want.shape, (name, got.shape, want.shape)
    if want.dtype.kind in "OUS" or got.dtype == object:
        assert got.dtype == object, name
        assert got.tolist() == want.astype(str).tolist(), name
    elif want.dtype.kind in "iub":
        assert got.dtype == want.dtype, name
        np.testing.assert_array_equal(got, want, err_msg=name)
    else:
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=name)


def check(model: onnx.ModelProto, feeds: dict[str, np.ndarray], against=ort_run, **tol) -> dict:
    """svod's outputs equal `against`'s (onnxruntime by default), output by output."""
    got = svod_run(model, feeds)
    want = against(model, feeds)
    names = [o.name for o in model.graph.output]
    assert sorted(got) == sorted(names)
    for name, w in zip(names, want, strict=True):
        assert_same(got[name], w, name, **tol)
    return got
