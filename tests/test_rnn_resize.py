"""Recurrent layers and Resize in configurations the conformance suite does not cover, against
onnxruntime (or the onnx reference evaluator): run-time sequence lengths with the reverse direction, GRU's linear_before_reset with a
bias, clipping and non-default activations; Resize as pure views (integer nearest upscale) and with
antialiasing on 3 axes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.onnx_util import compile_and_run, make_model, reference

R = np.random.default_rng(11)


def _run(model, feeds, outputs, spec_reference: bool = False):
    """Compare with onnxruntime, or with the onnx package's reference evaluator where onnxruntime
    does not implement the configuration (cubic on 3 axes, linear on 4-D with scaled channels)."""
    if spec_reference:
        from onnx.reference import ReferenceEvaluator

        want = ReferenceEvaluator(model).run(None, feeds)
    else:
        want = reference(model, feeds)
    got = compile_and_run(model, feeds)
    for name, ref in zip(outputs, want, strict=True):
        np.testing.assert_allclose(got[name], ref, rtol=1e-4, atol=1e-5, err_msg=name)


def _rnn_model(op: str, gates: int, hidden: int, attrs: dict, seq=5, batch=3, size=4, dirs=2):
    inputs = ["x", "w", "r", "b", "lens", "h0"] + (["c0"] if op == "LSTM" else [])
    outputs = ["y", "yh"] + (["yc"] if op == "LSTM" else [])
    inits = {"w": R.standard_normal((dirs, gates * hidden, size)).astype(np.float32) * 0.5,
             "r": R.standard_normal((dirs, gates * hidden, hidden)).astype(np.float32) * 0.5,
             "b": R.standard_normal((dirs, 2 * gates * hidden)).astype(np.float32) * 0.5}
    graph_inputs = {"x": (np.float32, [seq, batch, size]), "lens": (np.int32, [batch]),
                    "h0": (np.float32, [dirs, batch, hidden])}
    if op == "LSTM":
        graph_inputs["c0"] = (np.float32, [dirs, batch, hidden])
    model = make_model([helper.make_node(op, inputs, outputs, hidden_size=hidden, **attrs)], graph_inputs, outputs,
                       inits, opset=14)
    feeds = {"x": R.standard_normal((seq, batch, size)).astype(np.float32),
             "lens": np.array([seq, 2, 4][:batch], np.int32),
             "h0": R.standard_normal((dirs, batch, hidden)).astype(np.float32)}
    if op == "LSTM":
        feeds["c0"] = R.standard_normal((dirs, batch, hidden)).astype(np.float32)
    return model, feeds, outputs


@pytest.mark.parametrize("op,gates,attrs", [
    ("LSTM", 4, {"direction": "bidirectional", "clip": 1.5}),
    ("GRU", 3, {"direction": "bidirectional", "linear_before_reset": 1}),
    ("GRU", 3, {"direction": "reverse", "activations": ["HardSigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.2],
                "activation_beta": [0.4]}),
    ("RNN", 1, {"direction": "bidirectional", "activations": ["Relu", "Tanh"]}),
])
def test_recurrent_layer_with_sequence_lengths(op, gates, attrs):
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    model, feeds, outputs = _rnn_model(op, gates, 3, attrs, dirs=dirs)
    _run(model, feeds, outputs)


@pytest.mark.parametrize("attrs,scales", [
    ({"mode": "nearest"}, [1, 1, 2, 3]),  # asymmetric-like integer upscale: a view, no gather
    ({"mode": "linear", "coordinate_transformation_mode": "align_corners"}, [1, 1, 1.5, 0.5]),
    ({"mode": "cubic", "antialias": 1}, [1, 0.5, 0.6, 0.7]),
])
def test_resize_against_onnxruntime(attrs, scales):
    x = R.standard_normal((1, 4, 6, 7)).astype(np.float32)
    model = make_model([helper.make_node("Resize", ["x", "", "s"], ["y"], **attrs)], {"x": (np.float32, list(x.shape))},
                       ["y"], {"s": np.array(scales, np.float32)}, opset=19)
    _run(model, {"x": x}, ["y"], spec_reference=True)


def _largest_step_kernel(op: str, gates: int, seq: int) -> int:
    """Nodes in the largest kernel of the layer that writes a [batch, hidden] buffer: a step's state (Y
    gathers every step and grows with the sequence by design)."""
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.program import BufferKind

    model, _, _ = _rnn_model(op, gates, 4, {"direction": "bidirectional"}, seq=seq)  # batch 3, hidden 4
    options = CompileOptions()
    program = build_program(import_model(model, options), options)
    return max(len(k.ast.toposort()) for k in program.kernels
               if k.params[0].kind is BufferKind.SCRATCH and k.params[0].shape == (3, 4))


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3)])
def test_recurrent_steps_read_stored_states(op, gates):
    # Each step's states are realized: step kernels do not grow with the step index (an LSTM's cell
    # state, fused, made step t recompute every earlier step's gates).
    assert _largest_step_kernel(op, gates, 12) <= _largest_step_kernel(op, gates, 3)
