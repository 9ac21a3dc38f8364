"""Models rewritten by onnxruntime's own tools (tests/quantized_models.py; generated once per
session) compile and match onnxruntime: quantize_dynamic on an LSTM and on gpt2_small_random, and
the transformer optimizer on gpt2_small_random, each also through onnxruntime's graph optimizer
(which fuses further into com.microsoft ops). Each model is compiled once."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest

import svodc
import svodrt
from svodc.options import CompileOptions
from tests.quantized_models import (
    GPT2,
    IMAGE,
    MOBILENET,
    MODELS,
    gpt2_dynamic,
    gpt2_transformer_optimized,
    mobilenet_at_image_size,
    ort_fused,
    ort_session,
    small_lstm,
)

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
    """Activations quantized as onnxruntime's kernel quantizes them (all of X, then each hidden
    state), integer products exact: equal to onnxruntime up to float32 rounding."""
    path, feed = small_lstm(tmp_path)
    model = onnx.load(path)
    assert contrib_ops(model) == {"DynamicQuantizeLSTM": 1}
    got = compile_run(model, feed)
    want = ort_session(model).run(None, feed)
    for out, w in zip(model.graph.output, want, strict=True):
        np.testing.assert_allclose(got[out.name], w, rtol=1e-4, atol=1e-6)


def _gpt2_matches_onnxruntime(model: onnx.ModelProto, fused_ops: set[str], rel_to_max: float) -> None:
    assert fused_ops <= set(contrib_ops(model))
    feed = dict(np.load(MODELS / "gpt2_small_random" / "inputs.npz"))
    got = compile_run(model, feed)
    want, = ort_session(model).run(None, feed)
    _close(got["logits"], want, rel_to_max)


@needs_gpt2
def test_gpt2_dynamic_quantization(tmp_path):
    """DynamicQuantizeMatMul quantizes activations as DynamicQuantizeLinear defines (as onnxruntime
    does); its integer products are exact, so the logits differ from onnxruntime's only where an
    activation rounds the other way: within 1% of the largest logit."""
    _gpt2_matches_onnxruntime(onnx.load(gpt2_dynamic(tmp_path)),
                              {"DynamicQuantizeMatMul", "FusedMatMul", "SkipLayerNormalization"}, 1e-2)


@needs_gpt2
def test_gpt2_transformer_optimizer(tmp_path):
    pytest.importorskip("sympy", reason="onnxruntime.transformers.optimizer needs sympy (in the dev extra)")
    _gpt2_matches_onnxruntime(onnx.load(gpt2_transformer_optimized(tmp_path)),
                              {"FastGelu", "FusedMatMul", "SkipLayerNormalization"}, 1e-4)


@pytest.mark.skipif(not MOBILENET.is_file(), reason=f"no {MOBILENET}")
def test_mobilenet_fused_conv(tmp_path):
    """onnxruntime's graph optimizer folds each Conv + Clip (ReLU6) of mobilenetv2 into FusedConv."""
    fused = onnx.load(ort_fused(mobilenet_at_image_size(tmp_path), tmp_path / "mobilenet_fused.onnx"))
    assert contrib_ops(fused)["FusedConv"] > 0
    feed = {"input": np.random.default_rng(0).standard_normal(IMAGE).astype(np.float32)}
    got = compile_run(fused, feed)
    want, = ort_session(fused).run(None, feed)
    _close(got[fused.graph.output[0].name], want, 1e-4)
