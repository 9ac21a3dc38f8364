"""Control flow, sequences and the importer's scopes: If (compile-time and run-time conditions),
Loop/Scan unrolling, function-body expansion, inputs fixed at compile time, sequence values at the
graph boundary, and the error for nodes that cannot compile."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import svodc
import svodrt
from svodc.errors import UnsupportedModelError
from svodc.frontend.importer import import_model
from svodc.options import CompileOptions
from tests.onnx_util import compile_and_run, make_model, reference

R = np.random.default_rng(5)
F = TensorProto.FLOAT


def _branch(name: str, op: str, out: str) -> object:
    """A branch computing op(x, c) from the outer scope's x and c."""
    return helper.make_graph([helper.make_node(op, ["x", "c"], [out])], name, [],
                             [helper.make_tensor_value_info(out, F, [2, 3])])


def _if_model() -> object:
    return make_model([helper.make_node("Greater", ["s", "zero"], ["cond"]),
                       helper.make_node("If", ["cond"], ["y"], then_branch=_branch("then", "Add", "t"),
                                        else_branch=_branch("else", "Mul", "e"))],
                      {"x": (np.float32, [2, 3]), "s": (np.float32, [])}, ["y"],
                      {"c": R.standard_normal((2, 3)).astype(np.float32), "zero": np.array(0, np.float32)})


@pytest.mark.parametrize("s", [1.0, -1.0])
def test_if_with_a_run_time_condition_selects(s):
    model = _if_model()
    feeds = {"x": R.standard_normal((2, 3)).astype(np.float32), "s": np.array(s, np.float32)}
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-6)


def test_if_with_a_fixed_condition_compiles_one_branch():
    model = _if_model()
    g = import_model(model, CompileOptions(input_values={"s": np.array(2.0, np.float32)}))
    assert [name for name, _ in g.inputs] == ["x"]
    assert {n.op.name for n in g.outputs[0][1].toposort()} >= {"ADD"}
    assert "MUL" not in {n.op.name for n in g.outputs[0][1].toposort()}


def test_loop_unrolls_with_a_run_time_condition_as_masks():
    """y = x; repeat 4 times while y[0] < 10: y = y * 2 (the condition depends on x)."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["y_in", "two"], ["y_out"]),
         helper.make_node("Gather", ["y_out", "first"], ["head"]),
         helper.make_node("Less", ["head", "ten"], ["cond_out"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_in", F, [3])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_value_info("y_out", F, [3])])
    model = make_model([helper.make_node("Loop", ["n", "start", "x"], ["y"], body=body)],
                       {"x": (np.float32, [3]), "start": (np.bool_, [])}, ["y"],
                       {"n": np.array(4, np.int64), "two": np.array(2, np.float32), "ten": np.array(10, np.float32),
                        "first": np.array(0, np.int64)})
    for x in (np.array([0.1, 0.2, 0.3], np.float32), np.array([3, 3, 3], np.float32)):
        feeds = {"x": x, "start": np.array(True)}
        np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-6)


def test_scan_reverse_with_output_axis():
    body = helper.make_graph([helper.make_node("Add", ["s_in", "x_t"], ["s_out"]),
                              helper.make_node("Identity", ["s_out"], ["y_t"])], "body",
                             [helper.make_tensor_value_info("s_in", F, [2]), helper.make_tensor_value_info("x_t", F, [2])],
                             [helper.make_tensor_value_info("s_out", F, [2]), helper.make_tensor_value_info("y_t", F, [2])])
    node = helper.make_node("Scan", ["s0", "xs"], ["s", "ys"], body=body, num_scan_inputs=1,
                            scan_input_directions=[1], scan_output_axes=[1])
    model = make_model([node], {"s0": (np.float32, [2]), "xs": (np.float32, [5, 2])}, ["s", "ys"])
    feeds = {"s0": R.standard_normal(2).astype(np.float32), "xs": R.standard_normal((5, 2)).astype(np.float32)}
    got, want = compile_and_run(model, feeds), reference(model, feeds)
    for name, ref in zip(["s", "ys"], want, strict=True):
        np.testing.assert_allclose(got[name], ref, rtol=1e-5)


def test_ops_without_a_handler_expand_through_their_function_body():
    from onnx.reference import ReferenceEvaluator

    model = make_model([helper.make_node("AffineGrid", ["theta", "size"], ["y"], align_corners=0)],
                       {"theta": (np.float32, [2, 2, 3])}, ["y"], {"size": np.array([2, 1, 3, 4], np.int64)}, opset=20)
    g = import_model(model)
    assert "AffineGrid" in g.expanded_ops
    theta = R.standard_normal((2, 2, 3)).astype(np.float32)
    want = ReferenceEvaluator(model).run(None, {"theta": theta})[0]
    np.testing.assert_allclose(compile_and_run(model, {"theta": theta})["y"], want, rtol=1e-5, atol=1e-6)


def test_shape_inputs_can_be_fixed_at_compile_time():
    """Resize's scales are not taken at run time (a Reshape's shape is: tests/test_runtime_sizes.py)."""
    model = make_model([helper.make_node("Resize", ["x", "", "shape"], ["y"])],
                       {"x": (np.float32, [2, 6]), "shape": (np.float32, [2])}, ["y"], opset=13)
    with pytest.raises(UnsupportedModelError) as e:
        import_model(model)
    assert e.value.nodes[0].needs_values == ("shape",) and "--input-value" in str(e.value)
    scales = np.array([1.5, 2], np.float32)
    bundle = svodc.compile(model, options=CompileOptions(input_values={"shape": scales}))
    with svodrt.load(bundle) as m:
        assert [t.name for t in m.inputs] == ["x"]
        x = R.standard_normal((2, 6)).astype(np.float32)
        want = reference(model, {"x": x, "shape": scales})[0]
        np.testing.assert_array_equal(m.run({"x": x})["y"], want)


def test_sequences_at_the_graph_boundary_are_flattened():
    seq_in = helper.make_tensor_sequence_value_info("s", F, None)
    seq_out = helper.make_tensor_sequence_value_info("t", F, None)
    graph = helper.make_graph([helper.make_node("SequenceInsert", ["s", "x"], ["t"])], "g",
                              [seq_in, helper.make_tensor_value_info("x", F, [2])], [seq_out])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = CompileOptions(input_shapes={"s[0]": (2,), "s[1]": (2,)})
    with svodrt.load(svodc.compile(model, options=options)) as m:
        a, b, x = (R.standard_normal(2).astype(np.float32) for _ in range(3))
        got = m.run({"s[0]": a, "s[1]": b, "x": x})
    assert list(got) == ["t[0]", "t[1]", "t[2]"]
    for name, want in zip(got, (a, b, x), strict=True):
        np.testing.assert_array_equal(got[name], want)


def test_an_out_of_scope_model_lists_every_offending_node_and_writes_nothing(tmp_path):
    from onnx import TensorProto as TP

    graph = helper.make_graph(
        [helper.make_node("StringNormalizer", ["s"], ["n"], name="normalize"),
         helper.make_node("RegexFullMatch", ["n"], ["m"], name="match", pattern="a(?=b)"),
         helper.make_node("NotAnOp", ["x"], ["y"], name="bogus")], "g",
        [helper.make_tensor_value_info("s", TP.STRING, [2]), helper.make_tensor_value_info("x", F, [2])],
        [helper.make_tensor_value_info("m", TP.BOOL, [2]), helper.make_tensor_value_info("y", F, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])
    out = tmp_path / "m.svod"
    with pytest.raises(UnsupportedModelError) as e:
        svodc.compile_to_file(model, out, options=CompileOptions(input_shapes={"s": (2,)}))
    assert not out.exists() and not list(tmp_path.iterdir())
    # the string input compiles (format 1.4: strings as ids), and so do StringNormalizer and RegexFullMatch of
    # it (svodrt's string program, format 1.8) -- but not a lookahead, which RE2 lacks
    assert [n.name for n in e.value.nodes] == ["match", "bogus"]
    assert str(e.value).startswith("2 unsupported nodes:")
    assert "match (ai.onnx::RegexFullMatch, opset 20): pattern 'a(?=b)': the group '(?=b'" in str(e.value)


def test_declared_output_shapes_are_not_trusted():
    """Output shapes are inferred; a model that declares wrong ones (or none) still compiles right."""
    graph = helper.make_graph([helper.make_node("Transpose", ["x"], ["y"], perm=[1, 0])], "g",
                              [helper.make_tensor_value_info("x", F, [2, 3])],
                              [helper.make_tensor_value_info("y", F, [7, 7, 7])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = R.standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(compile_and_run(model, {"x": x})["y"], x.T)
