"""Run-time branches (passes/branches.py, codegen/module.py): an If whose condition is known only at run
time runs only the taken branch's kernels, with one thread and through the work queue, nested; a Loop
with a run-time trip count or condition runs up to its --loop-bound. Compared with onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import svodc
import svodrt
from svodc.errors import InputShapeError, UnsupportedModelError
from svodc.frontend.importer import import_model
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.program import BufferKind
from tests.onnx_util import make_model, reference

R = np.random.default_rng(11)
F = TensorProto.FLOAT
W = {"w1": R.standard_normal((64, 64)).astype(np.float32) / 8, "w2": R.standard_normal((64, 512)).astype(np.float32) / 8,
     "w3": R.standard_normal((512, 64)).astype(np.float32) / 8, "zero": np.array(0, np.float32),
     "one": np.array(1, np.float32)}


def _graph(name: str, nodes: list, out: str) -> object:
    return helper.make_graph(nodes, name, [], [helper.make_tensor_value_info(out, F, [4, 64])])


def _small(name: str, out: str) -> object:  # tanh(shared @ w1)
    return _graph(name, [helper.make_node("MatMul", ["shared", "w1"], [f"{name}_m"]),
                         helper.make_node("Tanh", [f"{name}_m"], [out])], out)


def _large(name: str, out: str) -> object:  # relu(shared @ w2) @ w3: a [4, 512] intermediate
    return _graph(name, [helper.make_node("MatMul", ["shared", "w2"], [f"{name}_m"]),
                         helper.make_node("Relu", [f"{name}_m"], [f"{name}_r"]),
                         helper.make_node("MatMul", [f"{name}_r", "w3"], [out])], out)


def _model(nested: bool) -> object:
    """y = sum(x) > 0 ? small : large, over shared = relu(x), which z = shared + 1 also reads. Nested:
    the then branch is itself an If on s > 0 between small and large."""
    then = _small("then", "t")
    if nested:
        then = _graph("then", [helper.make_node("Greater", ["s", "zero"], ["c2"]),
                               helper.make_node("If", ["c2"], ["t"], then_branch=_small("in_then", "it"),
                                                else_branch=_large("in_else", "ie"))], "t")
    nodes = [helper.make_node("Relu", ["x"], ["shared"]), helper.make_node("ReduceSum", ["x"], ["sum"], keepdims=0),
             helper.make_node("Greater", ["sum", "zero"], ["cond"]),
             helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=_large("else", "e")),
             helper.make_node("Add", ["shared", "one"], ["z"])]
    return make_model(nodes, {"x": (np.float32, [4, 64]), "s": (np.float32, [])}, ["y", "z"], W)


def _feeds(positive: bool, s: float = 1.0) -> dict[str, np.ndarray]:
    x = np.abs(R.standard_normal((4, 64)).astype(np.float32)) * (1 if positive else -1)
    x[0, :8] *= -1  # some negatives either way, so relu matters
    return {"x": x, "s": np.array(s, np.float32)}


def _program(model):
    return build_program(import_model(model, CompileOptions()), CompileOptions())


def test_each_branch_kernel_is_guarded_by_its_side_and_shared_work_is_not():
    program = _program(_model(nested=False))
    by_side: dict[tuple, list[str]] = {}
    for k in program.kernels:
        by_side.setdefault(tuple((b.name, v) for t in k.guard for b, v in t), []).append(k.name)
    flag = next(b.name for k in program.kernels for t in k.guard for b, _ in t)
    assert set(by_side) == {(), ((flag, True),), ((flag, False),)}
    assert len(by_side[((flag, False),)]) >= 2  # the large branch: two products
    first_guarded = min(i for i, k in enumerate(program.kernels) if k.guard)
    assert any(k.params[0].name == flag for k in program.kernels[:first_guarded])  # the flag is written first


def test_nested_run_time_ifs_guard_by_both_conditions():
    program = _program(_model(nested=True))
    assert max(len(t) for k in program.kernels for t in k.guard) == 2


def _untouched_skipped_bytes(model, feeds, taken: bool, threads: int) -> int:
    """Run with the arena filled with a pattern; the bytes of the not-taken branch's buffers that no
    kernel that ran owns must still hold it. Returns how many such bytes were checked."""
    program = _program(model)
    ran, skipped = [], []
    for k in program.kernels:
        runs = not k.guard or any(all(v == taken for _, v in t) for t in k.guard)
        if k.params[0].kind is BufferKind.SCRATCH:
            (ran if runs else skipped).append(k.params[0])
    with svodrt.load(svodc.compile(model), threads=threads) as m:
        memory, address = m._arenas[0]  # white box: the pool's one arena, which the next call borrows
        memory[:] = 0x5A
        got = m.run(feeds)
        start = address - memory.ctypes.data  # the arena is the aligned part of its allocation
        pattern = memory[start:start + program.arena_size].copy()
    want = reference(model, feeds)
    np.testing.assert_allclose(got["y"], want[0], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got["z"], want[1], rtol=1e-6)
    written = np.zeros(len(pattern), bool)
    for b in ran:
        written[b.offset:b.offset + b.nbytes] = True
    checked = 0
    for b in skipped:
        free = ~written[b.offset:b.offset + b.nbytes]
        assert (pattern[b.offset:b.offset + b.nbytes][free] == 0x5A).all(), f"skipped kernel wrote {b.name}"
        checked += int(free.sum())
    return checked


@pytest.mark.parametrize("threads", [1, 2])
def test_only_the_taken_branch_runs(threads):
    model = _model(nested=False)
    # cond true: the large branch is skipped, and its [4, 512] intermediate lies partly where nothing ran
    assert _untouched_skipped_bytes(model, _feeds(True), True, threads) > 0
    _untouched_skipped_bytes(model, _feeds(False), False, threads)


@pytest.mark.parametrize("positive,s", [(True, 1.0), (True, -1.0), (False, 1.0)])
def test_nested_run_time_ifs_match_onnxruntime(positive, s):
    model = _model(nested=True)
    feeds = _feeds(positive, s)
    with svodrt.load(svodc.compile(model), threads=2) as m:
        got = m.run(feeds)
    for name, want in zip(["y", "z"], reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-4, atol=1e-5)


def _loop_model(with_trip_count: bool) -> object:
    """y = x; loop: y = y + x, while y[0] < 1.5 or keep_going (the condition), at most n times (the trip count)."""
    b = TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Add", ["y_in", "x"], ["y_out"]),
         helper.make_node("Gather", ["y_out", "first"], ["head"]), helper.make_node("Less", ["head", "limit"], ["c"]),
         helper.make_node("Or", ["c", "keep_going"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("cond_in", b, []),
         helper.make_tensor_value_info("y_in", F, [16])],
        [helper.make_tensor_value_info("cond_out", b, []), helper.make_tensor_value_info("y_out", F, [16])])
    loop = helper.make_node("Loop", ["n" if with_trip_count else "", "go", "x"], ["y"], body=body, name="loop")
    inputs = {"x": (np.float32, [16]), "go": (np.bool_, []), "keep_going": (np.bool_, [])}
    if with_trip_count:
        inputs["n"] = (np.int64, [])
    return make_model([loop], inputs, ["y"], {"first": np.array(0, np.int64),
                                              "limit": np.array(1.5, np.float32)})


def _loop_feeds(n: int | None, keep_going: bool, x0: float = 0.4) -> dict[str, np.ndarray]:
    x = np.full(16, x0, np.float32) + R.uniform(0, 0.1, 16).astype(np.float32)
    x[0] = x0
    feeds = {"x": x, "go": np.array(True), "keep_going": np.array(keep_going)}
    return feeds if n is None else {**feeds, "n": np.array(n, np.int64)}


@pytest.mark.parametrize("threads", [1, 2])
def test_a_loop_with_a_run_time_trip_count_runs_that_many_iterations(threads):
    model = _loop_model(with_trip_count=True)
    with svodrt.load(svodc.compile(model, options=CompileOptions(loop_bounds={"loop": 6})), threads=threads) as m:
        for n, keep_going in ((0, True), (3, True), (6, True), (5, False)):
            feeds = _loop_feeds(n, keep_going)
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-6, err_msg=f"n={n}")
        # past the bound the loop runs the bound's iterations (documented: the bound is the most it runs)
        feeds = _loop_feeds(6, True)
        np.testing.assert_allclose(m.run({**feeds, "n": np.array(9, np.int64)})["y"], reference(model, feeds)[0],
                                   rtol=1e-6)


def test_a_while_loop_on_a_run_time_condition_stops_when_it_turns_false():
    model = _loop_model(with_trip_count=False)
    with svodrt.load(svodc.compile(model, options=CompileOptions(loop_bounds={"loop": 8}))) as m:
        for x0 in (0.4, 0.7, 2.0):  # y[0] reaches 1.5 after a different number of iterations
            feeds = _loop_feeds(None, False, x0)
            np.testing.assert_allclose(m.run(feeds)["y"], reference(model, feeds)[0], rtol=1e-6, err_msg=f"x0={x0}")


def test_each_iteration_of_a_run_time_loop_is_a_guarded_branch():
    model = _loop_model(with_trip_count=True)
    program = build_program(import_model(model, CompileOptions(loop_bounds={"loop": 6})), CompileOptions())
    assert len({t for k in program.kernels for t in k.guard}) >= 6  # a flag per iteration


def test_a_run_time_trip_count_without_a_bound_names_the_node_and_the_flag():
    with pytest.raises(UnsupportedModelError, match="--loop-bound loop=N"):
        svodc.compile(_loop_model(with_trip_count=True))
    with pytest.raises(InputShapeError, match=r"no Loop node 'lop'; its Loop nodes are \['loop'\]"):
        svodc.compile(_loop_model(with_trip_count=True), options=CompileOptions(loop_bounds={"lop": 4}))


def test_the_cli_passes_loop_bounds(tmp_path):
    from click.testing import CliRunner

    from svodc.cli import main

    path = tmp_path / "loop.onnx"
    path.write_bytes(_loop_model(with_trip_count=True).SerializeToString())
    result = CliRunner().invoke(main, ["compile", str(path), "-q", "--loop-bound", "loop=3"])
    assert result.exit_code == 0, result.output
    with svodrt.load(str(tmp_path / "loop.svod")) as m:
        feeds = _loop_feeds(3, True)
        np.testing.assert_allclose(m.run({**feeds, "n": np.array(5, np.int64)})["y"],
                                   reference(_loop_model(with_trip_count=True), feeds)[0], rtol=1e-6)
