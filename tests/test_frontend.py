"""The ONNX frontend: handlers against onnxruntime on small models, folding of shape subgraphs,
and the errors for models it cannot compile."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from svodc.errors import InputShapeError, InvalidModelError, UnsupportedModelError
from svodc.frontend.importer import import_model
from svodc.ir.interpret import evaluate
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from tests.onnx_util import compile_and_run, make_model, reference
from tests.test_indexing import CASES as INDEXING_CASES
from tests.test_indexing import case_model as indexing_case_model

R = np.random.default_rng(0)


def rand(*shape, dtype=np.float32):
    return R.standard_normal(shape).astype(dtype)


CASES = {
    "conv_pads_strides": (
        [helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 2, 1, 0], strides=[2, 1])],
        {"x": rand(2, 3, 9, 8)}, {"w": rand(4, 3, 3, 2), "b": rand(4)}),
    "conv_groups_dilations": (
        [helper.make_node("Conv", ["x", "w"], ["y"], group=2, dilations=[2, 2], pads=[2, 1, 2, 3])],
        {"x": rand(1, 4, 10, 10)}, {"w": rand(6, 2, 3, 3)}),
    "conv_1d": ([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1])], {"x": rand(2, 3, 11)},
                {"w": rand(5, 3, 3)}),
    "maxpool_ceil": ([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)],
                     {"x": rand(1, 2, 10, 11)}, {}),
    "maxpool_pads": ([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])],
                     {"x": rand(1, 2, 6, 6)}, {}),
    "avgpool_exclude_pad": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])],
        {"x": rand(1, 3, 7, 7)}, {}),
    "avgpool_include_pad": (
        [helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], pads=[1, 1, 1, 1], count_include_pad=1)],
        {"x": rand(1, 3, 5, 5)}, {}),
    "global_average": ([helper.make_node("GlobalAveragePool", ["x"], ["y"])], {"x": rand(2, 3, 5, 4)}, {}),
    "batchnorm_relu": (
        [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["t"], epsilon=1e-3),
         helper.make_node("Relu", ["t"], ["y"])],
        {"x": rand(2, 3, 4, 4)},
        {"s": rand(3), "b": rand(3), "m": rand(3), "v": np.abs(rand(3)) + 0.5}),
    "lrn": ([helper.make_node("LRN", ["x"], ["y"], size=5, alpha=2e-4, beta=0.75, bias=2.0)],
            {"x": rand(1, 7, 3, 3)}, {}),
    "gemm_trans": ([helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=1, transB=1, alpha=0.5, beta=2.0)],
                   {"a": rand(6, 4)}, {"b": rand(5, 6), "c": rand(5)}),
    "matmul_batched": ([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": rand(2, 3, 4, 5)},
                       {"b": rand(3, 5, 6)}),
    "matmul_vector": ([helper.make_node("MatMul", ["a", "b"], ["y"])], {"a": rand(5)}, {"b": rand(2, 5, 3)}),
    "softmax_axis1": ([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": rand(2, 5, 3)}, {}),
    "softmax_last": ([helper.make_node("Softmax", ["x"], ["y"])], {"x": rand(3, 7) * 10}, {}),
    "concat_transpose_flatten": (
        [helper.make_node("Concat", ["x", "c"], ["t"], axis=1), helper.make_node("Transpose", ["t"], ["u"], perm=[0, 2, 1]),
         helper.make_node("Flatten", ["u"], ["y"], axis=1)],
        {"x": rand(2, 3, 4)}, {"c": rand(2, 2, 4)}),
    "stack_reducemax_concat_reducemin": (  # passes/concat.py: torch.stack(...).max(dim), and a min over a concat
        [helper.make_node("Unsqueeze", ["a", "ax"], ["ua"]), helper.make_node("Unsqueeze", ["b", "ax"], ["ub"]),
         helper.make_node("Concat", ["ua", "ub"], ["s"], axis=2),
         helper.make_node("ReduceMax", ["s"], ["m"], axes=[2], keepdims=0),
         helper.make_node("Concat", ["a", "b"], ["w"], axis=1),
         helper.make_node("ReduceMin", ["w"], ["n"], axes=[1], keepdims=1), helper.make_node("Add", ["m", "n"], ["y"])],
        {"a": rand(3, 4), "b": rand(3, 4)}, {"ax": np.array([2], np.int64)}),
    "sum_mul_add_broadcast": (
        [helper.make_node("Sum", ["x", "a", "b"], ["s"]), helper.make_node("Mul", ["s", "a"], ["m"]),
         helper.make_node("Add", ["m", "b"], ["y"])],
        {"x": rand(2, 3, 4)}, {"a": rand(3, 1), "b": rand(4)}),
    "reshape_shape_subgraph": (
        [helper.make_node("Shape", ["x"], ["s"]),
         helper.make_node("Gather", ["s", "i"], ["g"], axis=0),
         helper.make_node("Concat", ["g", "m1"], ["shape"], axis=0),
         helper.make_node("Reshape", ["x", "shape"], ["y"])],
        {"x": rand(2, 3, 4)}, {"i": np.array([0], np.int64), "m1": np.array([-1], np.int64)}),
    "constant_of_shape_unsqueeze": (
        [helper.make_node("ConstantOfShape", ["shp"], ["c"], value=helper.make_tensor("v", 1, [1], [0.5])),
         helper.make_node("Unsqueeze", ["x", "ax"], ["u"]), helper.make_node("Add", ["u", "c"], ["y"])],
        {"x": rand(3, 4)}, {"shp": np.array([3, 1, 4], np.int64), "ax": np.array([1], np.int64)}),
    "exp_log_tanh_sigmoid": (
        [helper.make_node("Exp", ["x"], ["e"]), helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Log", ["a"], ["l"]),
         helper.make_node("Tanh", ["x"], ["t"]), helper.make_node("Sigmoid", ["x"], ["s"]),
         helper.make_node("Sum", ["e", "l", "t", "s"], ["y"])],
        {"x": rand(4, 50) * 3}, {}),
    "dropout_identity_clip": (
        [helper.make_node("Dropout", ["x"], ["d"]), helper.make_node("Identity", ["d"], ["i"]),
         helper.make_node("Clip", ["i", "lo", "hi"], ["y"])],
        {"x": rand(3, 4)}, {"lo": np.array(-0.5, np.float32), "hi": np.array(0.5, np.float32)}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_against_onnxruntime(name):
    nodes, feeds, inits = CASES[name]
    model = make_model(nodes, {k: (v.dtype, list(v.shape)) for k, v in feeds.items()}, ["y"], inits)
    want = reference(model, feeds)[0]
    got = compile_and_run(model, feeds)["y"]
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def _interpret(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The imported graph evaluated by the reference interpreter (ir/interpret.py): no passes, no LLVM."""
    graph = import_model(model)
    return evaluate([x for _, x in graph.outputs], feeds)


@pytest.mark.parametrize("name", sorted(CASES))
def test_imported_graph_against_onnxruntime(name):
    """The frontend alone: what each handler builds computes what onnxruntime computes (milliseconds
    per case; test_op_against_onnxruntime runs the same cases end to end)."""
    nodes, feeds, inits = CASES[name]
    model = make_model(nodes, {k: (v.dtype, list(v.shape)) for k, v in feeds.items()}, ["y"], inits)
    (want,) = reference(model, feeds)
    (got,) = _interpret(model, feeds)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", sorted(INDEXING_CASES))
def test_imported_indexing_graph_against_onnxruntime(name):
    model, inputs, outputs = indexing_case_model(name)
    for out, got, want in zip(outputs, _interpret(model, inputs), reference(model, inputs), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7, err_msg=out)


def test_shape_subgraphs_fold_at_compile_time():
    nodes, _, inits = CASES["reshape_shape_subgraph"]
    model = make_model(nodes, {"x": (np.float32, [2, 3, 4])}, ["y"], inits)
    g = import_model(model)
    ops = {n.op for n in g.outputs[0][1].toposort()}
    assert ops <= {Ops.INPUT, Ops.RESHAPE}


def test_every_unsupported_node_is_listed():
    model = make_model([helper.make_node("Relu", ["x"], ["a"], name="ok"),
                        helper.make_node("NotAnOp", ["a"], ["b"], name="bad1"),
                        helper.make_node("Relu", ["b"], ["c"], name="after_bad"),
                        helper.make_node("Dropout", ["a", "ratio", "training"], ["d"], name="bad2"),
                        helper.make_node("Add", ["c", "d"], ["y"])],
                       {"x": (np.float32, [1, 1, 2, 2])}, ["y"],
                       {"ratio": np.array(0.5, np.float32), "training": np.array(True)})
    with pytest.raises(UnsupportedModelError) as e:
        import_model(model)
    names = [n.name for n in e.value.nodes]
    assert names == ["bad1", "bad2"]
    assert "NotAnOp" in str(e.value) and "opset 17" in str(e.value) and "random dropout" in str(e.value)


def test_op_version_without_handler_names_both_versions():
    # Softmax at opset 10 resolves to version 1 (implemented); LRN at opset 28 resolves to 13.
    # A fake handler range: Dropout v1 exists in the registry, but "Upsample" is not an op past opset 10.
    model = make_model([helper.make_node("Upsample", ["x", "s"], ["y"])], {"x": (np.float32, [1, 1, 2, 2])}, ["y"],
                       {"s": np.ones(4, np.float32)}, opset=17)
    with pytest.raises(UnsupportedModelError, match="Upsample"):
        import_model(model)


def test_symbolic_input_dims_must_be_fixed():
    from onnx import TensorProto

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(InputShapeError, match="--dim N=1..64"):
        import_model(model)
    g = import_model(model, CompileOptions(dims={"N": 5}))
    assert g.inputs[0][1].shape == (5, 3)
    g = import_model(model, CompileOptions(input_shapes={"x": (2, 3)}))
    assert g.inputs[0][1].shape == (2, 3)


def test_cycles_and_dangling_inputs_are_invalid():
    cyc = make_model([helper.make_node("Relu", ["b"], ["a"]), helper.make_node("Relu", ["a"], ["b"]),
                      helper.make_node("Add", ["x", "a"], ["y"])], {"x": (np.float32, [2])}, ["y"])
    with pytest.raises(InvalidModelError, match="cycle"):
        import_model(cyc)
    dangling = make_model([helper.make_node("Add", ["x", "nowhere"], ["y"])], {"x": (np.float32, [2])}, ["y"])
    with pytest.raises(InvalidModelError, match="nowhere"):
        import_model(dangling)


def test_folded_broadcasts_stay_small_in_the_bundle():
    """An ALU of per-channel constants broadcast to an activation's shape folds to a per-channel
    weight plus an EXPAND (fold.py), not to a full-size copy in the bundle; x ** 2 with a one-element
    exponent weight becomes a multiplication of the constant (weights of one element are splats)."""
    import svodc
    from svodrt.bundle import parse_bundle

    r = np.random.default_rng(2)
    shape = [1, 32, 64, 64]
    nodes = [helper.make_node("Expand", ["a", "shape"], ["ea"]), helper.make_node("Mul", ["ea", "b"], ["ab"]),
             helper.make_node("Pow", ["x", "two"], ["x2"]), helper.make_node("Add", ["x2", "ab"], ["y"])]
    inits = {"a": r.standard_normal((1, 32, 1, 1)).astype(np.float32), "shape": np.array(shape, np.int64),
             "b": r.standard_normal((1, 32, 1, 1)).astype(np.float32), "two": np.array([2.0], np.float32)}
    model = make_model(nodes, {"x": (np.float32, shape)}, ["y"], inits)
    bundle = svodc.compile(model)
    assert parse_bundle(bundle).manifest["weights_size"] <= 1024  # 32 products, not 32 * 64 * 64
    feeds = {"x": r.standard_normal(shape).astype(np.float32)}
    np.testing.assert_allclose(compile_and_run(model, feeds)["y"], reference(model, feeds)[0], rtol=1e-5, atol=1e-6)
