"""QDQ fusion (svodc/frontend/qdq.py) on small hand-built QDQ graphs: which ops fuse, which must not,
and the compiled results against onnxruntime with its default optimizations (ORT_ENABLE_ALL, whose
QDQ transformer fuses the same patterns) and literal (ORT_DISABLE_ALL), in output quantization steps.
Weights are 7-bit (|w| <= 63): onnxruntime's u8 x s8 kernels on x86 without VNNI sum byte pairs in
saturating int16 and give other integers with full-range weights (docs/architecture.md)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import svodc
import svodrt
from svodc.frontend.qdq import fuse_qdq
from tests.quantized_models import MOBILENET, ort_session, qdq_mobilenet
from tests.summary import LINES
from tests.test_contrib_quant import reference_run

S8, U8 = np.int8, np.uint8


class QdqGraph:
    """A float graph written the way quantize_static's QDQ format writes it."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.nodes: list = []
        self.inits: list = []
        self.inputs: dict[str, np.ndarray] = {}

    def const(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def input(self, name: str, shape: tuple[int, ...]) -> str:
        self.inputs[name] = self.rng.standard_normal(shape).astype(np.float32)
        return name

    def qdq(self, x: str, scale: float, dtype=S8, zero: int = 0, scale_name: str | None = None) -> str:
        """Q then DQ of x: the DQ's output. scale_name: use that (already defined) scale tensor."""
        s = scale_name or self.const(f"{x}_scale", np.float32(scale))
        z = self.const(f"{x}_zero", np.array(zero, dtype))
        self.nodes += [helper.make_node("QuantizeLinear", [x, s, z], [f"{x}_q"]),
                       helper.make_node("DequantizeLinear", [f"{x}_q", s, z], [f"{x}_dq"])]
        return f"{x}_dq"

    def weight(self, name: str, shape: tuple[int, ...], scale, axis: int = 0, dtype=S8) -> str:
        """DQ of a constant 7-bit weight, per tensor (a float scale) or per channel along axis (a list)."""
        w = self.rng.integers(-63, 64, shape).astype(dtype) if dtype is S8 else \
            self.rng.integers(64, 192, shape).astype(dtype)
        scale = np.asarray(scale, np.float32)
        zero = np.zeros(scale.shape, dtype) if dtype is S8 else np.full(scale.shape, 128, dtype)
        self.const(f"{name}_q", w), self.const(f"{name}_scale", scale), self.const(f"{name}_zero", zero)
        self.nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [name],
                                           axis=axis))
        return name

    def bias(self, name: str, n: int, scale) -> str:
        self.const(f"{name}_q", self.rng.integers(-500, 500, n).astype(np.int32))
        scale = np.asarray(scale, np.float32)
        self.const(f"{name}_scale", scale), self.const(f"{name}_zero", np.zeros(scale.shape, np.int32))
        self.nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_scale", f"{name}_zero"], [name],
                                           axis=0))
        return name

    def op(self, op_type: str, inputs: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def model(self, outputs: list[str]):
        g = helper.make_graph(self.nodes, "qdq", [helper.make_tensor_value_info(k, TensorProto.FLOAT, v.shape)
                                                  for k, v in self.inputs.items()],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], self.inits)
        return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def conv(dtype=S8, per_channel=False, with_bias=True) -> QdqGraph:
    g = QdqGraph(1)
    zero = 0 if dtype is S8 else 128
    x = g.qdq(g.input("x", (1, 4, 7, 7)), 0.02, dtype, zero)
    ws = [0.01, 0.006, 0.012, 0.008, 0.01, 0.009] if per_channel else 0.01
    w = g.weight("w", (6, 4, 3, 3), ws)
    inputs = [x, w, g.bias("b", 6, np.float32(0.02) * np.asarray(ws, np.float32))] if with_bias else [x, w]
    g.qdq(g.op("Conv", inputs, "y", pads=[1, 1, 1, 1], strides=[2, 1]), 0.03, dtype, zero)
    return g


def matmul() -> QdqGraph:
    g = QdqGraph(2)
    a = g.qdq(g.input("a", (2, 3, 16)), 0.02, U8, 128)
    g.qdq(g.op("MatMul", [a, g.weight("b", (16, 5), [0.01, 0.02, 0.015, 0.01, 0.012], axis=1)], "y"), 0.05)
    return g


def gemm() -> QdqGraph:
    g = QdqGraph(3)
    a = g.qdq(g.input("a", (3, 16)), 0.02)
    ws = [0.01, 0.02, 0.015, 0.01, 0.012]
    c = g.bias("c", 5, np.float32(0.02) * np.asarray(ws, np.float32))
    g.qdq(g.op("Gemm", [a, g.weight("b", (5, 16), ws, axis=0), c], "y", transB=1), 0.05)
    return g


def binary(op_type: str, dtype=S8) -> QdqGraph:
    g = QdqGraph(4)
    zero = 0 if dtype is S8 else 128
    a = g.qdq(g.input("a", (1, 4, 3, 3)), 0.02, dtype, zero)
    b = g.qdq(g.input("b", (1, 4, 1, 3)), 0.03, dtype, zero)
    g.qdq(g.op(op_type, [a, b], "y"), 0.04 if op_type == "Add" else 0.005, dtype, zero)
    return g


def pool_and_shapes() -> QdqGraph:
    """GlobalAveragePool, then MaxPool and Flatten at the same scale and zero point."""
    g = QdqGraph(5)
    x = g.qdq(g.input("x", (1, 4, 6, 6)), 0.02, U8, 100)
    m = g.qdq(g.op("MaxPool", [x], "m", kernel_shape=[2, 2], pads=[1, 1, 1, 1], strides=[2, 2]), 0, U8, 100,
              scale_name="x_scale")
    g.qdq(g.op("Flatten", [m], "f"), 0, U8, 100, scale_name="x_scale")
    g.qdq(g.op("GlobalAveragePool", [x], "p"), 0.01, U8, 100)
    return g


FUSED = {
    "conv_s8_per_tensor": (lambda: conv(), ["y_dq"], "QLinearConv"),
    "conv_u8_per_channel": (lambda: conv(U8, per_channel=True), ["y_dq"], "QLinearConv"),
    "conv_s8_no_bias": (lambda: conv(with_bias=False), ["y_dq"], "QLinearConv"),
    "matmul_u8_per_column": (matmul, ["y_dq"], "QLinearMatMul"),
    "gemm_s8_per_channel_bias": (gemm, ["y_dq"], "QGemm"),
    "add_s8": (lambda: binary("Add"), ["y_dq"], "QLinearAdd"),
    "add_u8": (lambda: binary("Add", U8), ["y_dq"], "QLinearAdd"),
    "mul_s8": (lambda: binary("Mul"), ["y_dq"], "QLinearMul"),
    "pools_and_shapes_u8": (pool_and_shapes, ["f_dq", "p_dq"], "QLinearGlobalAveragePool"),
}


def _ops(model) -> Counter:
    return Counter(n.op_type for n in fuse_qdq(model.graph, set())[0])


def _steps(model, outputs: list[str], feeds: dict[str, np.ndarray]) -> tuple[float, float]:
    """Our outputs' distance from onnxruntime's, optimized and literal, in steps of each output's scale
    (the scale its DequantizeLinear reads)."""
    with svodrt.load(svodc.compile(model)) as m:
        got = m.run(feeds)
    values = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    scale = {n.output[0]: values[n.input[1]] for n in model.graph.node if n.op_type == "DequantizeLinear"}
    out = []
    for optimize in (True, False):
        want = dict(zip(outputs, ort_session(model, optimize).run(outputs, feeds), strict=True))
        out.append(max(float(np.abs(got[o] - want[o]).max() / scale[o]) for o in outputs))
    return out[0], out[1]


@pytest.mark.parametrize("case", list(FUSED))
def test_pattern_fuses_and_matches_onnxruntime(case):
    build, outputs, fused_op = FUSED[case]
    g = build()
    model = g.model(outputs)
    ops = _ops(model)
    assert ops[fused_op] >= 1, ops
    assert not {"Conv", "MatMul", "Gemm", "Add", "Mul", "GlobalAveragePool"} & set(ops), ops
    # the only Q left quantizes the float inputs; the only DQs dequantize the outputs
    assert ops["QuantizeLinear"] == len(g.inputs) and ops["DequantizeLinear"] == len(outputs), ops
    if case == "pools_and_shapes_u8":
        assert ops["MaxPool"] == 1 and ops["Flatten"] == 1
    optimized, literal = _steps(model, outputs, g.inputs)
    # exact integers against onnxruntime's float32 rescale: a rare result within an ulp of .5 rounds
    # the other way (one step); the literal float QDQ graph rounds each layer's float result instead
    assert optimized <= 1 + 1e-3, f"{optimized:.2f} steps from onnxruntime's optimized session"
    assert literal <= 1 + 1e-3, f"{literal:.2f} steps from onnxruntime's literal session"


def test_q_with_a_second_reader_keeps_the_float_op():
    g = conv()
    g.op("Relu", ["y"], "r")  # the Conv's float output is read by the Q and by Relu
    model = g.model(["y_dq", "r"])
    assert _ops(model)["Conv"] == 1
    assert max(_steps(model, ["y_dq"], g.inputs)) <= 1 + 1e-3


def test_float_op_output_that_is_a_graph_output_keeps_the_float_op():
    model = conv().model(["y_dq", "y"])
    assert _ops(model)["Conv"] == 1


def test_non_constant_scale_does_not_fuse():
    g = QdqGraph(6)
    x = g.qdq(g.input("x", (1, 4, 5, 5)), 0.02)
    w = g.weight("w", (3, 4, 1, 1), 0.01)
    g.inputs["s"] = np.array(0.03, np.float32)
    g.op("Abs", ["s"], "y_scale")  # computed at run time
    g.qdq(g.op("Conv", [x, w], "y"), 0, scale_name="y_scale")
    model = g.model(["y_dq"])
    assert _ops(model)["Conv"] == 1
    with svodrt.load(svodc.compile(model)) as m:
        got = m.run(g.inputs)["y_dq"]
    want, = ort_session(model).run(["y_dq"], g.inputs)
    assert float(np.abs(got - want).max()) <= 0.03 * (1 + 1e-3)


def test_bias_on_another_scale_does_not_fuse():
    g = QdqGraph(7)
    x = g.qdq(g.input("x", (1, 4, 5, 5)), 0.02)
    w = g.weight("w", (3, 4, 1, 1), 0.01)
    g.qdq(g.op("Conv", [x, w, g.bias("b", 3, 0.0004)], "y"), 0.03)  # not 0.02 * 0.01
    assert _ops(g.model(["y_dq"]))["Conv"] == 1


def test_shape_op_between_different_scales_does_not_fuse():
    g = QdqGraph(8)
    x = g.qdq(g.input("x", (1, 4, 2, 2)), 0.02)
    g.qdq(g.op("Flatten", [x], "f"), 0.04)
    ops = _ops(g.model(["f_dq"]))
    assert ops["Flatten"] == 1 and ops["QuantizeLinear"] == 2


@pytest.fixture(scope="module", params=[True, False], ids=["7bit_weights", "full_range_weights"])
def mobilenet(request, tmp_path_factory):
    """quantize_static's QDQ mobilenetv2 at 64 x 64, compiled, with our output and onnxruntime's."""
    if not MOBILENET.is_file():
        pytest.skip(f"no {MOBILENET} (set SVOD_MODELS)")
    path, feed = qdq_mobilenet(tmp_path_factory.mktemp("qdq"), reduce_range=request.param)
    model = onnx.load(path)
    with svodrt.load(svodc.compile(model)) as m:
        got = next(iter(m.run(feed).values()))
    ort = {opt: ort_session(model, opt).run(None, feed)[0] for opt in (True, False)}
    out = next(n for n in model.graph.node if n.output[0] == model.graph.output[0].name)
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == out.input[1])))
    return request.param, model, feed, got, ort, step


def test_mobilenet_runs_on_the_quantized_ops(mobilenet):
    _, model, *_ = mobilenet
    ops = _ops(model)
    assert ops["QLinearConv"] == Counter(n.op_type for n in model.graph.node)["Conv"] and ops["QGemm"] == 1, ops
    assert not {"Conv", "Add", "Gemm", "GlobalAveragePool"} & set(ops), ops
    assert ops["QuantizeLinear"] == 1 and ops["DequantizeLinear"] == 1, ops  # the input's and the logits'


def test_mobilenet_integers_are_the_fused_graphs(mobilenet):
    """Our logits are onnx.reference's of the fused (QOperator) graph the pass builds, exactly."""
    seven_bit, model, feed, got, _, _ = mobilenet
    if not seven_bit:
        pytest.skip("one weight range is enough for the exact check (onnx.reference takes a minute)")
    fused = onnx.ModelProto()
    fused.CopyFrom(model)
    del fused.graph.node[:]
    fused.graph.node.extend(fuse_qdq(model.graph, set())[0])
    fused.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    np.testing.assert_array_equal(got, reference_run(fused, feed)[model.graph.output[0].name])


def test_mobilenet_matches_onnxruntime_in_steps(mobilenet):
    """onnxruntime's optimized session fuses only part of the graph (onnxruntime 1.32: 37 of
    52 Conv, none of the 10 Add), so it computes neither the literal float graph nor the fully fused one:
    at the logits it is a few steps from both (measured: 4 from its literal session, 6 from ours, with
    7-bit weights). The bound is the bench's for mobilenetv2_int8, 10 steps. With full-range weights its
    optimized session is off further (its saturating vpmaddubsw sums, docs/architecture.md): then only
    the literal session is held to the bound, the rest reported."""
    seven_bit, _, _, got, ort, step = mobilenet
    optimized, literal = (float(np.abs(got - ort[opt]).max()) / step for opt in (True, False))
    between = float(np.abs(ort[True] - ort[False]).max()) / step
    LINES.append(f"QDQ mobilenetv2 64x64 ({'7-bit' if seven_bit else 'full-range'} weights): svod vs onnxruntime "
                 f"optimized {optimized:.0f} steps, vs literal {literal:.0f}; onnxruntime's two {between:.0f}")
    if seven_bit:
        assert optimized <= 10 + 1e-3, f"{optimized:.2f} steps from onnxruntime's optimized session"
    assert literal <= 10 + 1e-3, f"{literal:.2f} steps from onnxruntime's literal session"


def test_scale_replaced_by_weights_files_is_no_constant():
    """An initializer --weights supplies at compile time (`unknown`) holds no value the pass may read."""
    model = conv().model(["y_dq"])
    assert Counter(n.op_type for n in fuse_qdq(model.graph, {"y_scale"})[0])["Conv"] == 1


def test_scale_from_a_constant_node_fuses():
    g = conv()
    value = next(i for i in g.inits if i.name == "y_scale")
    g.inits.remove(value)
    g.nodes.insert(0, helper.make_node("Constant", [], ["y_scale"], value=value))
    assert _ops(g.model(["y_dq"]))["QLinearConv"] == 1
