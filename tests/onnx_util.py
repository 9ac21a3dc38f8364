"""Small ONNX models built in memory for tests, and a compile-and-run helper."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

NP_TO_ONNX = {np.dtype(k): v for k, v in {
    "float32": TensorProto.FLOAT, "float64": TensorProto.DOUBLE, "float16": TensorProto.FLOAT16,
    "int64": TensorProto.INT64, "int32": TensorProto.INT32, "int8": TensorProto.INT8, "uint8": TensorProto.UINT8,
    "bool": TensorProto.BOOL}.items()}


def make_model(nodes: list[onnx.NodeProto], inputs: dict[str, tuple[np.dtype, list[int]]], outputs: list[str],
               initializers: dict[str, np.ndarray] | None = None, opset: int = 17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "test",
        [helper.make_tensor_value_info(n, NP_TO_ONNX[np.dtype(dt)], shape) for n, (dt, shape) in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (initializers or {}).items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    # Give outputs the types shape inference finds (onnxruntime refuses untyped outputs).
    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:
        return model
    known = {v.name: v for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
    for out in model.graph.output:
        if out.name in known and known[out.name].type.tensor_type.elem_type:
            out.type.tensor_type.elem_type = known[out.name].type.tensor_type.elem_type
    return model


def compile_and_run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], threads: int = 1,
                    **options) -> dict[str, np.ndarray]:
    import svodc
    import svodrt

    bundle = svodc.compile(model, **options)
    with svodrt.load(bundle, threads=threads) as m:
        return m.run(feeds)


def reference(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feeds)


def small_cnn() -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """A conv -> relu -> pool -> gemm -> softmax model with seeded random weights, and one input."""
    r = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"]),
    ]
    inits = {"w": r.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": r.standard_normal(4).astype(np.float32),
             "fw": (r.standard_normal((10, 64)) * 0.1).astype(np.float32)}
    model = make_model(nodes, {"x": (np.float32, [2, 3, 8, 8])}, ["y"], inits)
    x = r.standard_normal((2, 3, 8, 8)).astype(np.float32)
    return model, {"x": x}
