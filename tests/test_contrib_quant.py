"""onnxruntime's quantized contrib ops against onnx.reference (exact integers, with the com.microsoft
ops of tests/contrib_reference.py) and against onnxruntime (within one quantization step), on a
QOperator mobilenetv2 and a small swish CNN (QLinearSigmoid, QLinearMul, QLinearConcat) made by
onnxruntime's quantize_static."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import svodc
import svodrt
from svodc.options import CompileOptions
from tests.contrib_reference import CONTRIB_OPS
from tests.quantized_models import (
    MOBILENET,
    ZERO_POINT_INPUT,
    expose_quantized_outputs,
    ort_session,
    qoperator_mobilenet,
    qoperator_swish_cnn,
)
from tests.summary import LINES

GENERATORS = {"mobilenetv2": qoperator_mobilenet, "swish_cnn": qoperator_swish_cnn}


@pytest.fixture(scope="module", params=list(GENERATORS))
def quantized(request, tmp_path_factory):
    """A QOperator model from quantize_static with every quantized output exposed, compiled once,
    and our outputs."""
    if request.param == "mobilenetv2" and not MOBILENET.is_file():
        pytest.skip(f"no {MOBILENET}")
    path, feed = GENERATORS[request.param](tmp_path_factory.mktemp("qop"))
    model = onnx.load(path)
    names = expose_quantized_outputs(model)
    options = CompileOptions(input_shapes={k: v.shape for k, v in feed.items()})
    with svodrt.load(svodc.compile(model, options=options)) as m:
        got = m.run(feed)
    return request.param, model, names, feed, got


def reference_run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """onnx.reference's outputs by name. onnx.reference implements QuantizeLinear / DequantizeLinear
    from opset 19; the model's opset-13 uses of them (per tensor) mean the same in opset 21."""
    ref_model = onnx.ModelProto()
    ref_model.CopyFrom(model)
    for o in ref_model.opset_import:
        if o.domain in ("", "ai.onnx") and o.version < 21:
            o.version = 21
    outs = ReferenceEvaluator(ref_model, new_ops=CONTRIB_OPS).run(None, feed)
    return dict(zip([o.name for o in model.graph.output], outs, strict=True))


def test_integers_equal_the_reference(quantized):
    _, model, names, feed, got = quantized
    ref = reference_run(model, feed)
    ops = {n.output[0]: n.op_type for n in model.graph.node}
    assert {"QuantizeLinear", "QLinearConv", "QLinearGlobalAveragePool"} <= {ops[n] for n in names}
    for name in names:
        assert got[name].dtype == ref[name].dtype, name
        np.testing.assert_array_equal(got[name], ref[name], err_msg=f"{ops[name]} {name}")
    out = model.graph.output[0].name
    np.testing.assert_array_equal(got[out], ref[out])


def _single_node(model: onnx.ModelProto, node: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> onnx.ModelProto:
    inits = {i.name: i for i in model.graph.initializer}
    inputs = [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(feeds[n].dtype), feeds[n].shape)
              for n in node.input if n and n not in inits]
    out = helper.make_tensor_value_info(node.output[0], TensorProto.UNDEFINED, None)
    g = helper.make_graph([node], "one", inputs, [out], [inits[n] for n in node.input if n in inits])
    m = helper.make_model(g, opset_imports=model.opset_import, ir_version=model.ir_version)
    return m


def test_nodes_match_onnxruntime(quantized):
    """Each quantized node, run by onnxruntime on the inputs our compiled model gave it, yields our
    integers but for rare off-by-ones: onnxruntime rescales in float32, where onnx.reference and we
    rescale in float64 (docs/architecture.md). The whole model's outputs are within one quantization
    step of onnxruntime's (a rare off-by-one can grow through a random-weight network; the end-of-run
    summary line reports the measured distance)."""
    label, model, names, feed, got = quantized
    values = {**feed, **got}
    off = total = 0
    for node in model.graph.node:
        if node.output[0] not in names or node.op_type not in ZERO_POINT_INPUT:
            continue
        single = _single_node(model, node, values)
        feeds = {i.name: values[i.name] for i in single.graph.input}
        single.graph.output[0].type.tensor_type.elem_type = helper.np_dtype_to_tensor_dtype(got[node.output[0]].dtype)
        want, = ort_session(single).run(None, feeds)
        diff = np.abs(want.astype(np.int64) - got[node.output[0]].astype(np.int64))
        assert diff.max() <= 1, f"{node.op_type} {node.output[0]}: off by {diff.max()}"
        off += int((diff > 0).sum())
        total += diff.size
    assert off <= 1e-4 * total, f"{off} of {total} integers off by one"
    whole = dict(zip([o.name for o in model.graph.output], ort_session(model).run(None, feed), strict=True))
    out = model.graph.output[0].name
    step = float(numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == _dequant_scale(model))))
    steps = float(np.abs(whole[out] - got[out]).max()) / step
    LINES.append(f"QOperator {label} vs onnxruntime: {off} of {total} node integers off by one (each node on "
                 f"the same inputs); whole model: outputs differ by up to {steps:.0f} quantization steps")
    assert steps <= 1 + 1e-3, f"outputs {steps:.2f} quantization steps from onnxruntime's"


def _dequant_scale(model: onnx.ModelProto) -> str:
    return next(n.input[1] for n in model.graph.node if n.op_type == "DequantizeLinear")
