"""Each com.microsoft op on a small seeded graph against onnxruntime (floats: rtol 1e-4; quantized:
within one step, and the exact integers of tests/contrib_reference.py where it defines the op)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from tests.contrib_reference import CONTRIB_OPS
from tests.quantized_models import ort_session

MS = "com.microsoft"
R = np.random.default_rng(3)
ONNX_TYPE = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.int64): TensorProto.INT64,
             np.dtype(np.int32): TensorProto.INT32, np.dtype(np.uint8): TensorProto.UINT8,
             np.dtype(np.int8): TensorProto.INT8}


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (R.standard_normal(shape) * scale).astype(np.float32)


def u8(*shape: int) -> np.ndarray:
    return R.integers(0, 256, shape).astype(np.uint8)


def i8(*shape: int) -> np.ndarray:
    return R.integers(-128, 128, shape).astype(np.int8)


def i7(*shape: int) -> np.ndarray:
    """int8 weights in the 7-bit range: onnxruntime's u8s8 kernels on x86 without VNNI sum pairs of
    products in saturating int16, so full-range int8 weights give it wrong integers (see
    docs/architecture.md); reduce_range quantization keeps weights in this range for that reason."""
    return R.integers(-64, 64, shape).astype(np.int8)


def s(v: float) -> np.ndarray:
    return np.array(v, np.float32)


def z(v: int, dt=np.uint8) -> np.ndarray:
    return np.array(v, dt)


def model(op: str, feeds: dict[str, np.ndarray], weights: dict[str, np.ndarray], inputs: list[str],
          out_types: list[int], **attrs) -> onnx.ModelProto:
    outs = [f"y{i}" for i in range(len(out_types))]
    node = helper.make_node(op, inputs, outs, domain=MS, **attrs)
    g = helper.make_graph([node], op, [helper.make_tensor_value_info(k, ONNX_TYPE[v.dtype], v.shape)
                                       for k, v in feeds.items()],
                         [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types, strict=True)],
                         [numpy_helper.from_array(v, k) for k, v in weights.items()])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])


def run_both(m: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    with svodrt.load(svodc.compile(m)) as b:
        got = b.run(feeds)
    return [got[o.name] for o in m.graph.output if o.name in got], ort_session(m).run(None, feeds)


F, U8 = TensorProto.FLOAT, TensorProto.UINT8
H, HEADS = 16, 2  # hidden size, attention heads
X3 = f32(2, 5, H)
FLOAT_CASES = {
    "Gelu": ("Gelu", {"x": X3}, {}, ["x"], [F], {}),
    "BiasGelu": ("BiasGelu", {"x": X3}, {"b": f32(H)}, ["x", "b"], [F], {}),
    "FastGelu": ("FastGelu", {"x": X3}, {"b": f32(H)}, ["x", "b"], [F], {}),
    "FastGelu_nobias": ("FastGelu", {"x": X3}, {}, ["x"], [F], {}),
    "FusedMatMul": ("FusedMatMul", {"a": f32(2, 4, 3)}, {"b": f32(2, 5, 4)}, ["a", "b"], [F],
                    {"transA": 1, "transB": 1, "alpha": 0.5}),
    "FusedConv_relu_z": ("FusedConv", {"x": f32(1, 3, 8, 8)}, {"w": f32(4, 3, 3, 3), "b": f32(4),
                                                                "z": f32(1, 4, 8, 8)},
                         ["x", "w", "b", "z"], [F], {"pads": [1, 1, 1, 1], "activation": "Relu"}),
    "FusedConv_clip": ("FusedConv", {"x": f32(1, 3, 8, 8)}, {"w": f32(4, 3, 3, 3)}, ["x", "w"], [F],
                       {"strides": [2, 2], "activation": "Clip", "activation_params": [0.0, 6.0]}),
    "SkipLayerNormalization": ("SkipLayerNormalization", {"x": X3, "skip": f32(2, 5, H)},
                               {"g": f32(H), "beta": f32(H), "bias": f32(H)}, ["x", "skip", "g", "beta", "bias"],
                               [F, F, F, F], {"epsilon": 1e-5}),
    "EmbedLayerNormalization": ("EmbedLayerNormalization", {"ids": R.integers(0, 30, (2, 5)).astype(np.int32),
                                                            "seg": R.integers(0, 2, (2, 5)).astype(np.int32),
                                                            "mask": np.array([[1, 1, 1, 0, 0], [1] * 5], np.int32)},
                                {"we": f32(30, H), "pe": f32(8, H), "se": f32(2, H), "g": f32(H), "beta": f32(H)},
                                ["ids", "seg", "we", "pe", "se", "g", "beta", "mask"], [F, TensorProto.INT32, F],
                                {"epsilon": 1e-5}),
    "Attention_causal_mask": ("Attention", {"x": X3, "mask": np.array([[1, 1, 1, 1, 0], [1] * 5], np.int32)},
                              {"w": f32(H, 3 * H, scale=0.3), "b": f32(3 * H)}, ["x", "w", "b", "mask"], [F, F],
                              {"num_heads": HEADS, "unidirectional": 1}),
    "Attention_past": ("Attention", {"x": X3, "past": f32(2, 2, HEADS, 3, H // HEADS)},
                       {"w": f32(H, 3 * H, scale=0.3)}, ["x", "w", "", "", "past"], [F, F],
                       {"num_heads": HEADS, "unidirectional": 1}),
    "MultiHeadAttention": ("MultiHeadAttention", {"q": X3, "k": f32(2, 7, H), "v": f32(2, 7, H),
                                                  "kpm": np.array([[1] * 7, [1] * 5 + [0] * 2], np.int32)},
                           {"b": f32(3 * H)}, ["q", "k", "v", "b", "kpm"], [F, F, F], {"num_heads": HEADS}),
    "RotaryEmbedding": ("RotaryEmbedding", {"x": X3, "pos": np.array([[0, 1, 2, 3, 4], [3, 4, 5, 6, 7]], np.int64)},
                        {"cos": f32(10, H // HEADS // 2), "sin": f32(10, H // HEADS // 2)},
                        ["x", "pos", "cos", "sin"], [F], {"num_heads": HEADS}),
    "RotaryEmbedding_interleaved_offset": ("RotaryEmbedding", {"x": f32(2, HEADS, 5, H // HEADS),
                                                               "pos": np.array([2], np.int64)},
                                           {"cos": f32(10, H // HEADS // 2), "sin": f32(10, H // HEADS // 2)},
                                           ["x", "pos", "cos", "sin"], [F], {"interleaved": 1}),
    "GroupQueryAttention_prompt": ("GroupQueryAttention", {"q": f32(2, 5, 4 * 8), "k": f32(2, 5, 2 * 8),
                                                           "v": f32(2, 5, 2 * 8), "lens": np.array([4, 4], np.int32),
                                                           "tot": np.array(5, np.int32)},
                                   {}, ["q", "k", "v", "", "", "lens", "tot"], [F, F, F],
                                   {"num_heads": 4, "kv_num_heads": 2}),
    "GroupQueryAttention_local_window": ("GroupQueryAttention", {"q": f32(1, 6, 2 * 8), "k": f32(1, 6, 8),
                                                                 "v": f32(1, 6, 8), "lens": np.array([5], np.int32),
                                                                 "tot": np.array(6, np.int32)},
                                         {}, ["q", "k", "v", "", "", "lens", "tot"], [F, F, F],
                                         {"num_heads": 2, "kv_num_heads": 1, "local_window_size": 2}),
    "GroupQueryAttention_decode_rotary": ("GroupQueryAttention", {"q": f32(2, 1, 4 * 16), "k": f32(2, 1, 2 * 16),
                                                                  "v": f32(2, 1, 2 * 16), "pk": f32(2, 2, 3, 16),
                                                                  "pv": f32(2, 2, 3, 16), "lens": np.array([3, 3], np.int32),
                                                                  "tot": np.array(4, np.int32)},
                                          {"cos": f32(6, 8), "sin": f32(6, 8)},
                                          ["q", "k", "v", "pk", "pv", "lens", "tot", "cos", "sin"], [F, F, F],
                                          {"num_heads": 4, "kv_num_heads": 2, "do_rotary": 1}),
}


@pytest.mark.parametrize("case", list(FLOAT_CASES))
def test_float_op_matches_onnxruntime(case):
    op, feeds, weights, inputs, types, attrs = FLOAT_CASES[case]
    m = model(op, feeds, weights, inputs, types, **attrs)
    got, want = run_both(m, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.abs(w).max())))


QUANT_CASES = {
    "QLinearAdd_broadcast": ("QLinearAdd", {"a": u8(2, 3, 4), "b": u8(4)}, {"as": s(0.02), "az": z(120),
                             "bs": s(0.05), "bz": z(3), "cs": s(0.04), "cz": z(128)},
                             ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], [U8], {}),
    "QLinearMul": ("QLinearMul", {"a": i8(3, 4), "b": i8(3, 4)}, {"as": s(0.02), "az": z(-3, np.int8),
                   "bs": s(0.03), "bz": z(5, np.int8), "cs": s(0.1), "cz": z(0, np.int8)},
                   ["a", "as", "az", "b", "bs", "bz", "cs", "cz"], [TensorProto.INT8], {}),
    "QLinearSigmoid": ("QLinearSigmoid", {"x": np.arange(256, dtype=np.uint8)}, {"xs": s(0.05), "xz": z(128),
                       "ys": s(1 / 256), "yz": z(0)}, ["x", "xs", "xz", "ys", "yz"], [U8], {}),
    "QLinearConcat": ("QLinearConcat", {"a": u8(2, 3), "b": u8(2, 5)}, {"ys": s(0.1), "yz": z(100), "as": s(0.1),
                      "az": z(100), "bs": s(0.037), "bz": z(7)}, ["ys", "yz", "a", "as", "az", "b", "bs", "bz"],
                      [U8], {"axis": 1}),
    "QLinearConcat_same_parameters": ("QLinearConcat", {"a": u8(2, 3), "b": u8(2, 5)}, {"ys": s(0.1), "yz": z(100)},
                                      ["ys", "yz", "a", "ys", "yz", "b", "ys", "yz"], [U8], {"axis": -1}),
    "QLinearGlobalAveragePool": ("QLinearGlobalAveragePool", {"x": u8(2, 3, 5, 5)}, {"xs": s(0.1), "xz": z(10),
                                 "ys": s(0.07), "yz": z(20)}, ["x", "xs", "xz", "ys", "yz"], [U8], {}),
    "QGemm_quantized_out": ("QGemm", {"a": u8(3, 8)}, {"as": s(0.02), "az": z(128), "b": i7(5, 8),
                            "bs": np.linspace(0.001, 0.003, 5).astype(np.float32), "bz": np.zeros(5, np.int8),
                            "c": R.integers(-500, 500, 5).astype(np.int32), "ys": s(0.05), "yz": z(100)},
                            ["a", "as", "az", "b", "bs", "bz", "c", "ys", "yz"], [U8], {"transB": 1}),
    "QGemm_float_out": ("QGemm", {"a": u8(3, 8)}, {"as": s(0.02), "az": z(128), "b": i7(8, 5), "bs": s(0.002),
                        "bz": z(0, np.int8)}, ["a", "as", "az", "b", "bs", "bz"], [F], {"alpha": 0.5}),
}


@pytest.mark.parametrize("case", list(QUANT_CASES))
def test_quantized_op_matches_reference_and_onnxruntime(case):
    op, feeds, weights, inputs, types, attrs = QUANT_CASES[case]
    m = model(op, feeds, weights, inputs, types, **attrs)
    (got,), (want,) = run_both(m, feeds)
    ref, = ReferenceEvaluator(m, new_ops=CONTRIB_OPS).run(None, feeds)
    assert got.dtype == want.dtype == ref.dtype
    if got.dtype == np.float32:
        np.testing.assert_allclose(got, ref, rtol=1e-6)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    else:
        np.testing.assert_array_equal(got, ref)
        assert np.abs(got.astype(np.int64) - want.astype(np.int64)).max() <= 1


def test_matmul_integer_to_float_and_dynamic_quantize_matmul():
    a, b, bias = f32(3, 8), i7(8, 5), f32(5)
    weights = {"b": b, "bs": np.linspace(0.01, 0.02, 5).astype(np.float32), "bz": np.zeros(5, np.int8), "bias": bias}
    m = model("DynamicQuantizeMatMul", {"a": a}, weights, ["a", "b", "bs", "bz", "bias"], [F])
    (got,), (want,) = run_both(m, {"a": a})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    qa = u8(3, 8)
    m = model("MatMulIntegerToFloat", {"qa": qa}, {"b": b, "as": s(0.03), "bs": s(0.01), "az": z(120), "bz": z(2, np.int8),
                                                   "bias": bias}, ["qa", "b", "as", "bs", "az", "bz", "bias"], [F])
    (got,), (want,) = run_both(m, {"qa": qa})
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_missing_contrib_op_is_named_with_its_domain():
    """An op we lack is listed, with its domain, in the one error naming every unsupported node."""
    nodes = [helper.make_node("Inverse", ["x"], ["y"], domain=MS, name="inv"),
             helper.make_node("BiasSoftmax", ["y", "x"], ["z"], domain=MS, name="bsm"),
             helper.make_node("Relu", ["x"], ["r"], name="fine")]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [2, 2])],
                          [helper.make_tensor_value_info("z", F, None), helper.make_tensor_value_info("r", F, None)])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)])
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile(m)
    assert [(n.name, n.domain, n.op_type) for n in e.value.nodes] == [("inv", MS, "Inverse"), ("bsm", MS, "BiasSoftmax")]
    assert "com.microsoft::Inverse" in str(e.value) and "com.microsoft::BiasSoftmax" in str(e.value)
