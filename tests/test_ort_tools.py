"""Models rewritten by onnxruntime's own tools (tests/quantized_models.py; generated once per
session) compile and match onnxruntime: quantize_dynamic on an LSTM and on gpt2_small_random, and
the transformer optimizer on gpt2_small_random, each also through onnxruntime's graph optimizer
(which fuses further into com.microsoft ops). Each model is compiled once."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from onnx.reference import ReferenceEvaluator

import svodc
import svodrt
from svodc.options import CompileOptions
from tests.quantized_models import GPT2, MODELS, gpt2_dynamic, gpt2_transformer_optimized, ort_session, small_lstm

needs_gpt2 = pytest.mark.skipif(not GPT2.is_file(), reason=f"no {GPT2}")


def compile_run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = CompileOptions(input_shapes={k: v.shape for k, v in feed.items()})
    with svodrt.load(svodc.compile(model, options=options)) as m:
        return m.run(feed)


def contrib_ops(model: onnx.ModelProto) -> collections.Counter:
    return collections.Counter(n.op_type for n in model.graph.node if n.domain == "com.microsoft")


def _close(got: np.ndarray, want: np.ndarray, rel_to_max: float) -> None:
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=rel_to_max * float(np.abs(want).max()))


def test_dynamic_quantize_lstm(tmp_path):
    """Exact (float32 rounding) against ONNX LSTM on the dequantized weights in onnx.reference;
    within a few activation quantization steps of onnxruntime, which also quantizes X and each hidden
    state to uint8 before its integer GEMMs (contrib_quant.py)."""
    path, feed = small_lstm(tmp_path)
    model = onnx.load(path)
    assert contrib_ops(model) == {"DynamicQuantizeLSTM": 1}
    got = compile_run(model, feed)
    want = ort_session(model).run(None, feed)
    ref = ReferenceEvaluator(_dequantized_lstm(model)).run(None, feed)
    for out, w, r in zip(model.graph.output, want, ref, strict=True):
        np.testing.assert_allclose(got[out.name], r, rtol=1e-4, atol=1e-5)
        _close(got[out.name], w, 2e-2)


def _dequantized_lstm(model: onnx.ModelProto) -> onnx.ModelProto:
    """The DynamicQuantizeLSTM as an ONNX LSTM with float weights W [dirs, 4h, in] and R."""
    inits = {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}
    node = next(n for n in model.graph.node if n.op_type == "DynamicQuantizeLSTM")

    def real(w: str, s: str, z: str) -> np.ndarray:
        scale, zp = inits[s], inits[z]
        shape = (-1, 1, 1) if scale.ndim == 1 else (scale.shape[0], 1, scale.shape[1])
        f = (inits[w].astype(np.float32) - zp.reshape(shape).astype(np.float32)) * scale.reshape(shape)
        return f.transpose(0, 2, 1)

    weights = {"W": real(node.input[1], node.input[8], node.input[9]),
               "R": real(node.input[2], node.input[10], node.input[11]), "B": inits[node.input[3]]}
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    lstm = onnx.helper.make_node("LSTM", [node.input[0], "W", "R", "B"], list(node.output), **attrs)
    g = onnx.helper.make_graph([lstm], "lstm", list(model.graph.input), list(model.graph.output),
                               [numpy_helper.from_array(v.astype(np.float32), k) for k, v in weights.items()])
    return onnx.helper.make_model(g, opset_imports=[onnx.helper.make_opsetid("", 17)])


def _gpt2_feed() -> dict[str, np.ndarray]:
    return dict(np.load(MODELS / "gpt2_small_random" / "inputs.npz"))


@needs_gpt2
def test_gpt2_dynamic_quantization(tmp_path):
    """DynamicQuantizeMatMul quantizes activations as DynamicQuantizeLinear defines (as onnxruntime
    does); its integer products are exact, so the logits differ from onnxruntime's only where an
    activation rounds the other way: within 1% of the largest logit."""
    model = onnx.load(gpt2_dynamic(tmp_path))
    assert {"DynamicQuantizeMatMul", "FusedMatMul", "SkipLayerNormalization"} <= set(contrib_ops(model))
    feed = _gpt2_feed()
    got = compile_run(model, feed)
    want, = ort_session(model).run(None, feed)
    _close(got["logits"], want, 1e-2)


@needs_gpt2
def test_gpt2_transformer_optimizer(tmp_path):
    pytest.importorskip("sympy", reason="onnxruntime.transformers.optimizer needs sympy (in the dev extra)")
    model = onnx.load(gpt2_transformer_optimized(tmp_path))
    assert {"FastGelu", "FusedMatMul", "SkipLayerNormalization"} <= set(contrib_ops(model))
    feed = _gpt2_feed()
    got = compile_run(model, feed)
    want, = ort_session(model).run(None, feed)
    _close(got["logits"], want, 1e-4)
