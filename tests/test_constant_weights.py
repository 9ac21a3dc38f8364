"""A weight is a weight whatever made it: a Conv, Gemm or MatMul whose weight is an initializer, a
Constant node, a folded subgraph, a DequantizeLinear or Transpose of a constant, or a splat
(ConstantOfShape) takes the GEMM path, and computes what onnxruntime computes with that weight."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodrt.bundle import parse_bundle
from tests.onnx_util import make_model, reference

R = np.random.default_rng(11)


def _quantized(w: np.ndarray) -> tuple[np.ndarray, np.float32]:
    scale = np.float32(np.abs(w).max() / 127)
    return np.round(w / scale).astype(np.int8), scale


def weight_value(source: str, w: np.ndarray) -> np.ndarray:
    """The value the nodes of weight_nodes(source, w) compute."""
    if source == "dequantized":
        q, scale = _quantized(w)
        return q.astype(np.float32) * scale
    return np.full(w.shape, 0.02, np.float32) if source == "splat" else w


def weight_nodes(source: str, w: np.ndarray) -> tuple[list, dict[str, np.ndarray]]:
    """Nodes and initializers that produce `w` (or, for "splat", a fill of w's shape) as tensor "w"."""
    if source == "initializer":
        return [], {"w": w}
    if source == "constant":
        return [helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w))], {}
    if source == "folded":  # w = (w - 1) + 1 over two initializers: a subgraph constant folding computes
        return [helper.make_node("Add", ["w0", "one"], ["w"])], {"w0": w - 1, "one": np.ones((), np.float32)}
    if source == "dequantized":
        q, scale = _quantized(w)
        return ([helper.make_node("DequantizeLinear", ["q", "s", "z"], ["w"])],
                {"q": q, "s": np.asarray(scale, np.float32), "z": np.zeros((), np.int8)})
    if source == "transposed":
        perm = list(reversed(range(w.ndim)))
        return [helper.make_node("Transpose", ["wt"], ["w"], perm=perm)], {"wt": np.ascontiguousarray(w.transpose(perm))}
    if source == "splat":
        fill = helper.make_tensor("fill", TensorProto.FLOAT, [1], [0.02])
        return ([helper.make_node("ConstantOfShape", ["shape"], ["w"], value=fill)],
                {"shape": np.asarray(w.shape, np.int64)})
    raise AssertionError(source)


SOURCES = ["initializer", "constant", "folded", "dequantized", "transposed", "splat"]
# op node, input shape, weight shape; each big enough for the GEMM path (the policy's gemm_min_macs, svodc/policy.py)
# even with a splat weight, whose product is computed for one row or column and broadcast
CASES = {
    "conv3x3": (helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1]), [1, 16, 12, 12], (32, 16, 3, 3)),
    "conv1x1": (helper.make_node("Conv", ["x", "w"], ["y"]), [1, 64, 10, 10], (40, 64, 1, 1)),
    "grouped": (helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1]), [1, 16, 9, 9],
                (32, 8, 3, 3)),
    "matmul": (helper.make_node("MatMul", ["x", "w"], ["y"]), [64, 80], (80, 48)),
    "gemm": (helper.make_node("Gemm", ["x", "w"], ["y"], transB=1), [48, 96], (40, 96)),
}


def kernel_kinds(bundle: bytes) -> list[tuple[str, list[str]]]:
    return [(k["kind"], k["provenance"]) for k in parse_bundle(bundle).manifest["kernels"]]


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("case", list(CASES))
def test_contraction_takes_the_gemm_path_whatever_made_its_weight(case, source):
    op, x_shape, w_shape = CASES[case]
    w = (R.standard_normal(w_shape) / np.sqrt(np.prod(w_shape[1:]))).astype(np.float32)
    nodes, inits = weight_nodes(source, w)
    model = make_model([*nodes, op], {"x": (np.float32, x_shape)}, ["y"], inits)
    feeds = {"x": R.standard_normal(x_shape).astype(np.float32)}
    bundle = svodc.compile(model, test_vectors=False)
    kinds = kernel_kinds(bundle)
    assert any(kind == "gemm" and "y" in prov for kind, prov in kinds), kinds
    with svodrt.load(bundle, threads=1) as m:
        got = m.run(feeds)["y"]
    # onnxruntime on the same graph with the weight's value as an initializer: given DequantizeLinear
    # -> MatMul it quantizes the activations too (errors of 1e-2 here)
    _, effective = weight_nodes("initializer", weight_value(source, w))
    want = reference(make_model([op], {"x": (np.float32, x_shape)}, ["y"], effective), feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
