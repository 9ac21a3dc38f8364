"""Recurrent layers as step loops (passes/steploop.py, issue 13): the step graph is scheduled, lowered and
compiled once and the entry runs it once per step, so kernels and bodies do not grow with the sequence;
the loop computes what onnxruntime does, on one thread and on several (kernels cut into parts, tickets
numbered across steps), and the reference interpreter runs the same loop."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from svodrt_tools.profile import kernel_times
from tests.onnx_util import compile_and_run, make_model, reference
from tests.test_kernel_sharing import _units
from tests.test_rnn_resize import _rnn_model

R = np.random.default_rng(5)
LAYERS = [("LSTM", 4, {"direction": "bidirectional"}), ("GRU", 3, {"direction": "reverse", "linear_before_reset": 1}),
          ("RNN", 1, {"direction": "bidirectional"})]


def _program(model, **options):
    from svodc.frontend.importer import import_model
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program

    return build_program(import_model(model, CompileOptions(**options)), CompileOptions(**options))


@pytest.mark.parametrize("op,gates,attrs", LAYERS)
def test_kernels_and_bodies_do_not_grow_with_the_sequence(op, gates, attrs):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    counts = {}
    for seq in (3, 24):
        model, _, _ = _rnn_model(op, gates, 4, attrs, seq=seq, dirs=dirs)  # with run-time sequence lengths
        kernels, units = _units(model)
        program = _program(model)
        assert [trips for _, _, trips in program.loops] == [seq] * dirs
        counts[seq] = (len(kernels), len(units))
    assert counts[24] == counts[3], counts


@pytest.mark.parametrize("op,gates,attrs", LAYERS)
@pytest.mark.parametrize("threads", [1, 3])
def test_step_loops_compute_what_onnxruntime_does(op, gates, attrs, threads):
    dirs = 2 if attrs["direction"] == "bidirectional" else 1
    model, feeds, outputs = _rnn_model(op, gates, 5, attrs, seq=7, dirs=dirs)
    got = compile_and_run(model, feeds, threads=threads)
    for name, want in zip(outputs, reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_a_step_loop_whose_kernels_are_cut_into_parts():
    # batch 64, hidden 128: the step's GEMM and cell kernels are worth several parts each, so threads claim
    # tickets of one step's kernel while the step index travels in the part (module.py)
    from svodc.codegen.module import parallel_parts
    from svodc.policy import gemm_blocking
    from svodc.target import host_target

    seq, batch, hidden, size = 6, 64, 128, 16
    inits = {"w": R.standard_normal((1, 4 * hidden, size)).astype(np.float32) * 0.2,
             "r": R.standard_normal((1, 4 * hidden, hidden)).astype(np.float32) * 0.1}
    model = make_model([helper.make_node("LSTM", ["x", "w", "r"], ["y", "yh", "yc"], hidden_size=hidden)],
                       {"x": (np.float32, [seq, batch, size])}, ["y", "yh", "yc"], inits, opset=14)
    program = _program(model)
    (first, end, trips), = program.loops
    target = host_target()
    assert trips == seq
    assert any(parallel_parts(k, target, gemm_blocking(target)) > 1 for k in program.kernels[first:end])
    feeds = {"x": R.standard_normal((seq, batch, size)).astype(np.float32)}
    got = compile_and_run(model, feeds, threads=3)
    for name, want in zip(["y", "yh", "yc"], reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_one_layer_applied_twice_loops_over_its_own_buffers_each_time():
    # the same weights on two inputs: one step graph (interned), lowered for each loop's buffers
    hidden, seq = 4, 5
    inits = {"w": R.standard_normal((1, 3 * hidden, 3)).astype(np.float32),
             "r": R.standard_normal((1, 3 * hidden, hidden)).astype(np.float32)}
    nodes = [helper.make_node("GRU", [x, "w", "r"], [f"y{x}", f"h{x}"], hidden_size=hidden) for x in ("a", "b")]
    model = make_model(nodes, {"a": (np.float32, [seq, 2, 3]), "b": (np.float32, [seq, 2, 3])},
                       ["ya", "ha", "yb", "hb"], inits, opset=14)
    feeds = {x: R.standard_normal((seq, 2, 3)).astype(np.float32) for x in ("a", "b")}
    assert len(_program(model).loops) == 2
    got = compile_and_run(model, feeds)
    for name, want in zip(["ya", "ha", "yb", "hb"], reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5, err_msg=name)


def test_the_interpreter_runs_the_step_loop():
    from svodc.frontend.importer import import_model
    from svodc.ir.interpret import evaluate

    model, feeds, outputs = _rnn_model("LSTM", 4, 3, {"direction": "bidirectional", "clip": 1.5})
    graph = import_model(model)
    got = evaluate([o for _, o in graph.outputs], feeds)
    for name, g, want in zip(outputs, got, reference(model, feeds), strict=True):
        np.testing.assert_allclose(g, want, rtol=1e-5, atol=1e-6, err_msg=name)


def test_unrolled_and_looped_agree_and_profile_runs_step_zero():
    import svodc
    import svodrt

    model, feeds, outputs = _rnn_model("RNN", 1, 4, {"direction": "bidirectional"}, seq=6)
    looped = svodc.compile(model)
    unrolled = compile_and_run(model, feeds, step_loops=False)
    with svodrt.load(looped) as m:
        got = m.run(feeds)
        names = [name for name, _, _ in kernel_times(m, feeds, repeat=1)]  # each kernel alone: a loop's at step 0
    assert len(names) == len(set(names))
    for name in outputs:
        np.testing.assert_allclose(got[name], unrolled[name], rtol=1e-6, atol=1e-6, err_msg=name)


def test_a_step_loop_that_is_a_graph_output_is_copied_out():
    from svodc.ir.interpret import evaluate
    from svodc.ir.ops import Ops
    from svodc.ir.provenance import Provenance
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program
    from svodc.program import ImportedGraph
    from tests.test_op_tables import _step_loop

    loop = _step_loop()  # h[t + 1] = 0.5 * h[t] + x[t]
    feeds = {"h0": R.standard_normal((2, 3)).astype(np.float32), "x": R.standard_normal((4, 2, 3)).astype(np.float32)}
    want = [feeds["h0"]]
    for t in range(4):
        want.append(0.5 * want[-1] + feeds["x"][t])
    (got,) = evaluate([loop], feeds)
    np.testing.assert_allclose(got[:, 0], np.stack(want), rtol=1e-6)
    inputs = [(n.arg.name, n) for n in loop.toposort() if n.op is Ops.INPUT]
    program = build_program(ImportedGraph(inputs, [("y", loop)], Provenance(), "test"), CompileOptions())
    (_, end, trips), = program.loops
    assert trips == 4 and [k.params[0] for k in program.kernels[end:]] == [program.outputs[0]]


def test_sizes_from_run_time_values_need_unrolled_layers_and_the_cli_says_how(tmp_path):
    """A step loop cannot take a size decided by a run-time value (the size's kernel would be hoisted out
    of its loop): the compile is refused with the option to use, in the API and on the command line, and
    with the layers unrolled the model runs as onnxruntime does."""
    import svodc
    import svodrt
    from svodc.passes.dynamic import DynamicShapeError
    from tests.test_cli import run

    model, feeds, outputs = _rnn_model("GRU", 3, 5, {}, dirs=1)
    model.graph.node.append(helper.make_node("Slice", ["x", "starts", "ends"], ["s"]))  # a size from run-time values
    model.graph.input.extend(helper.make_tensor_value_info(n, TensorProto.INT64, [1]) for n in ("starts", "ends"))
    model.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    feeds = {**feeds, "starts": np.array([1], np.int64), "ends": np.array([4], np.int64)}
    with pytest.raises(DynamicShapeError, match="--no-step-loops"):
        svodc.compile(model)
    with svodrt.load(svodc.compile(model, options=svodc.CompileOptions(step_loops=False))) as m:
        got = m.run(feeds)
    for name, want in zip([*outputs, "s"], reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5)
    src = tmp_path / "m.onnx"
    src.write_bytes(model.SerializeToString())
    refused = run("svodc", "compile", str(src), "-o", str(tmp_path / "a.svod"))
    assert refused.returncode != 0 and "--no-step-loops" in refused.stderr
    assert run("svodc", "compile", str(src), "--no-step-loops", "-o", str(tmp_path / "b.svod")).returncode == 0
