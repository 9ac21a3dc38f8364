"""Kernels equal but for their buffers' places and compared constants share one compiled body
(codegen/share.py): a recurrent layer's steps compile once however long the sequence (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.onnx_util import compile_and_run, make_model, reference
from tests.test_rnn_resize import _rnn_model


def _units(model):
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.module import _render_units
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.policy import gemm_blocking
    from svodc.target import host_target

    program = build_program(import_model(model), CompileOptions())
    target = host_target()
    kernels = [prepare_kernel(k, target) for k in program.kernels]
    return kernels, _render_units(kernels, target, gemm_blocking(target))


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrent_steps_share_bodies_whatever_the_sequence_length(op, gates):
    # bidirectional, with run-time sequence lengths: the steps differ in their offsets and in the step
    # index compared with the lengths
    counts = {}
    for seq in (3, 9):
        model, _, _ = _rnn_model(op, gates, 4, {"direction": "bidirectional"}, seq=seq)
        kernels, units = _units(model)
        counts[seq] = (len(kernels), len(units))
    assert counts[9][0] > counts[3][0]  # more steps, more kernels
    assert counts[9][1] == counts[3][1], counts  # and no more bodies


def test_shared_step_bodies_compute_what_onnxruntime_does():
    model, feeds, outputs = _rnn_model("GRU", 3, 5, {"direction": "bidirectional"}, seq=7)
    got = compile_and_run(model, feeds)
    for name, want in zip(outputs, reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_kernel_that_shares_nothing_keeps_its_own_constants():
    # one slice at an offset: its template matches no other kernel, so its body keeps the offset
    model = make_model([helper.make_node("Slice", ["x", "s", "e"], ["t"]), helper.make_node("Relu", ["t"], ["y"])],
                       {"x": (np.float32, [64])}, ["y"], {"s": np.array([5]), "e": np.array([40])})
    from svodc.codegen.share import template

    kernels, units = _units(model)
    assert any(template(k).shifts != (0,) * len(k.params) for k in kernels)  # the slice's offset could move
    assert all(tmpl is None for unit in units for _, tmpl, _ in unit if len(unit) == 1)
    x = np.random.default_rng(2).standard_normal(64).astype(np.float32)
    np.testing.assert_array_equal(compile_and_run(model, {"x": x})["y"], np.maximum(x[5:40], 0))
