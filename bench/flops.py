"""A model's contraction FLOPs (Conv, Gemm, MatMul), counted from its ONNX graph, and its achieved GFLOP/s
next to the GEMM roofline (the best sgemm GFLOP/s of bench/gemm.py's table, svod's and numpy's).

The count is nominal: 2 per multiply-add of the operator as ONNX defines it (a direct convolution),
whatever the engine runs (svod's Winograd layers do fewer multiplies), so GFLOP/s compare engines and
machines on the same work.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

CONTRACTIONS = ("Conv", "Gemm", "MatMul")


class FlopCountError(ValueError):
    """A contraction's operand or result shape is not known after shape inference."""


def contraction_flops(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> int:
    """2 x the multiply-adds of the model's Conv, Gemm and MatMul nodes at the feeds' shapes (main graph;
    nodes inside If/Loop bodies are not counted)."""
    graph = onnx.GraphProto()
    graph.CopyFrom(model.graph)
    for v in graph.input:  # the feeds' shapes replace symbolic dims
        if v.name in feeds:
            dims = v.type.tensor_type.shape.dim
            del dims[:]
            for d in feeds[v.name].shape:
                dims.add().dim_value = d
    # IR 4 and later: an initializer need not be a graph input (earlier, inference ignores those that are not)
    fixed = onnx.helper.make_model(graph, opset_imports=model.opset_import, ir_version=max(model.ir_version, 4))
    inferred = onnx.shape_inference.infer_shapes(fixed, data_prop=True).graph
    shapes = {i.name: tuple(i.dims) for i in inferred.initializer}
    for v in [*inferred.input, *inferred.value_info, *inferred.output]:
        dims = v.type.tensor_type.shape.dim
        if v.type.tensor_type.HasField("shape") and all(d.HasField("dim_value") for d in dims):
            shapes[v.name] = tuple(d.dim_value for d in dims)

    def shape(node: onnx.NodeProto, name: str) -> tuple[int, ...]:
        if name not in shapes:
            raise FlopCountError(f"{node.op_type} node {node.name!r}: the shape of {name!r} is not known; "
                                 "give the model's inputs fixed shapes")
        return shapes[name]

    total = 0
    for node in inferred.node:
        if node.op_type not in CONTRACTIONS:
            continue
        out = math.prod(shape(node, node.output[0]))
        if node.op_type == "Conv":  # each output element: W's C/group x kernel taps
            total += 2 * out * math.prod(shape(node, node.input[1])[1:])
        elif node.op_type == "Gemm":
            trans_a = next((a.i for a in node.attribute if a.name == "transA"), 0)
            total += 2 * out * shape(node, node.input[0])[0 if trans_a else 1]
        else:
            total += 2 * out * shape(node, node.input[0])[-1]
    return total


def counted_gflop(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> float | None:
    """contraction_flops in GFLOP, or None where shape inference cannot give every contraction's shapes (a
    bench row then has no GFLOP/s cell)."""
    try:
        return contraction_flops(model, feeds) / 1e9
    except (FlopCountError, onnx.shape_inference.InferenceError, ValueError) as e:
        print(f"  flops: not counted: {str(e)[:160]}", flush=True)
        return None


def roofline(gemm_rows: list[dict], threads: int) -> tuple[float, float] | None:
    """(best svod, best numpy) sgemm GFLOP/s of the GEMM table at `threads`, or None without a table."""
    cells = [g[f"t{threads}"] for g in gemm_rows if f"t{threads}" in g]
    if not cells:
        return None
    return max(c["svod_gflops"] for c in cells), max(c["numpy_gflops"] for c in cells)
