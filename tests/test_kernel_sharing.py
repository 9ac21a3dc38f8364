"""Kernels equal but for their buffers' places and compared constants share one compiled body
(codegen/share.py): a recurrent layer's steps, unrolled (CompileOptions.step_loops off, as for GPU
variants), compile once however long the sequence (issue 13)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.onnx_util import compile_and_run, make_model, reference
from tests.test_rnn_resize import _rnn_model


def _units(model, **options):
    from svodc.codegen.compile import prepare_kernel
    from svodc.codegen.units import render_units
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.policy import gemm_blocking
    from svodc.target import host_target

    program = build_program(import_model(model, CompileOptions(**options)), CompileOptions(**options))
    target = host_target()
    kernels = [prepare_kernel(k, target) for k in program.kernels]
    return kernels, render_units(kernels, target, gemm_blocking(target))


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_recurrent_steps_share_bodies_whatever_the_sequence_length(op, gates):
    # bidirectional, with run-time sequence lengths: the steps differ in their offsets and in the step
    # index compared with the lengths
    counts = {}
    for seq in (3, 9):
        model, _, _ = _rnn_model(op, gates, 4, {"direction": "bidirectional"}, seq=seq)
        kernels, units = _units(model, step_loops=False)
        counts[seq] = (len(kernels), len(units))
    assert counts[9][0] > counts[3][0]  # more steps, more kernels
    assert counts[9][1] == counts[3][1], counts  # and no more bodies


def test_shared_step_bodies_compute_what_onnxruntime_does():
    model, feeds, outputs = _rnn_model("GRU", 3, 5, {"direction": "bidirectional"}, seq=7)
    got = compile_and_run(model, feeds, step_loops=False)
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


def test_a_load_indexed_by_a_shifted_load_is_shifted_once():
    """Gathers from three slices of x through one slice of the indices: the kernels share a body with both
    pointers moved, so the inner load's own constant must leave the body too (review: it stayed, and the body
    read ix[r + 4], past the slice)."""
    nodes, outs, inits = [helper.make_node("Slice", ["ix", "s", "e"], ["ixs"])], [], {"s": np.array([2]),
                                                                                      "e": np.array([8])}
    for i, off in enumerate([1, 4, 9]):
        inits[f"s{i}"], inits[f"e{i}"] = np.array([off]), np.array([off + 5])
        nodes += [helper.make_node("Slice", ["x", f"s{i}", f"e{i}"], [f"t{i}"]),
                  helper.make_node("Gather", [f"t{i}", "ixs"], [f"y{i}"], axis=0)]
        outs.append(f"y{i}")
    model = make_model(nodes, {"x": (np.float32, [16]), "ix": (np.int64, [8])}, outs, inits)
    feeds = {"x": np.arange(16, dtype=np.float32), "ix": np.array([9, 9, 0, 1, 2, 3, 4, -1])}
    got = compile_and_run(model, feeds)
    for name, want in zip(outs, reference(model, feeds), strict=True):
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_a_compare_of_a_value_holding_a_lifted_compare_declares_both_arguments():
    """(x > 3 ? x : 0) > c for two c: both constants become body arguments (review: the outer compare kept the
    inner one's constant, the body declared one argument, the wrapper passed two, and the part count arrived
    as 0: SIGFPE)."""
    nodes, outs = [helper.make_node("Greater", ["x", "c3"], ["g"]), helper.make_node("Where", ["g", "x", "z"], ["a"])], []
    inits = {"c3": np.array(3, np.int32), "z": np.array(0, np.int32)}
    for i, c in enumerate([5, 7]):
        inits[f"c{i}"] = np.array(c, np.int32)
        nodes += [helper.make_node("Greater", ["a", f"c{i}"], [f"h{i}"]),
                  helper.make_node("Cast", [f"h{i}"], [f"y{i}"], to=6)]
        outs.append(f"y{i}")
    model = make_model(nodes, {"x": (np.int32, [20])}, outs, inits)
    feeds = {"x": np.random.default_rng(7).integers(-5, 12, 20).astype(np.int32)}
    got = compile_and_run(model, feeds)
    for name, want in zip(outs, reference(model, feeds), strict=True):
        np.testing.assert_array_equal(got[name], want, err_msg=name)


def test_a_store_of_a_shifted_load_moves_both_constants_out():
    """STORE(o, r + 8, LOAD(x, r + 3)): the template stores o[r] from x[r] with shifts (8, 3) (review: the
    STORE kept the unshifted LOAD, so the body would have read x[r + 6])."""
    from svodc.codegen.share import template
    from svodc.ir.dtypes import dtypes
    from svodc.ir.ops import KernelArg, Ops, ParamArg, RangeArg, RangeKind
    from svodc.ir.uop import UOp
    from svodc.program import Buffer, BufferKind, Kernel

    def index(v: int) -> UOp:
        return UOp.const(dtypes.index, v)

    out = UOp(Ops.PARAM, dtypes.float32.ptr(), (), ParamArg(index=0, name="o"))
    x = UOp(Ops.PARAM, dtypes.float32.ptr(), (), ParamArg(index=1, name="x"))
    r = UOp(Ops.RANGE, dtypes.index, (index(6),), RangeArg(id=0, kind=RangeKind.PARALLEL))
    store = UOp(Ops.STORE, dtypes.void, (out, r + index(8), UOp(Ops.LOAD, dtypes.float32, (x, r + index(3)), 0)))
    ast = UOp(Ops.SINK, dtypes.void, (store,), KernelArg(name="k", serial=False))
    params = [Buffer(0, BufferKind.SCRATCH, dtypes.float32, (16,), "o", offset=0),
              Buffer(1, BufferKind.INPUT, dtypes.float32, (16,), "x", slot=0)]
    t = template(Kernel("k", ast, params))
    (st,) = t.ast.src
    assert t.shifts == (8, 3) and st.src[1] is r and st.src[2].src[1] is r
