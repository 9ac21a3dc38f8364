"""Row fusion (passes/rows.py): a softmax or log-softmax along trailing axes is one kernel that computes each
row's max and sum once per row; other softmaxes keep their kernels. Checked on the kernel list, the lowered
loops and the outputs against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops, RangeKind
from svodc.ir.uop import toposort
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY
from tests.onnx_util import make_model, reference


def _softmax(op: str, shape: list[int], axis: int, extra_output: bool = False, shape_in=None):
    nodes = [helper.make_node(op, ["x"], ["y"], axis=axis)]
    outputs = ["y"]
    if extra_output:  # the row max is also a graph output: the softmax's inside is used outside it
        nodes.append(helper.make_node("ReduceMax", ["x"], ["m"], keepdims=1, axes=[axis]))
        outputs.append("m")
    return make_model(nodes, {"x": (np.float32, shape_in or shape)}, outputs, opset=17)


def _program(model, policy=DEFAULT_POLICY, **options):
    opts = CompileOptions(**options)
    return build_program(import_model(model, opts), opts, policy)


def _ranges(kernel):
    return [n for n in toposort([kernel.ast]) if n.op is Ops.RANGE]


def _x(shape, seed=0):
    return (np.random.default_rng(seed).standard_normal(shape) * 4).astype(np.float32)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("shape", [[3, 5, 300], [1, 40], [2, 3, 50], [4, 1, 7, 33], [70]])
def test_softmax_along_the_last_axis_is_one_kernel_and_matches_onnxruntime(op, shape):
    model = _softmax(op, shape, -1)
    program = _program(model)
    assert len(program.kernels) == 1
    (kernel,) = program.kernels
    row = shape[-1]
    # the row axis is an inner loop of its own, never part of the parallel range: the row's reductions are
    # then computed once per row, not once per element
    parallel = [r for r in _ranges(kernel) if r.arg.kind is RangeKind.PARALLEL]
    assert all(int(r.src[0].arg) * row <= int(np.prod(shape)) for r in parallel)
    x = _x(shape)
    with svodrt.load(svodc.compile(model), threads=2) as m:
        got = m.run({"x": x})["y"]
    np.testing.assert_allclose(got, reference(model, {"x": x})[0], rtol=2e-6, atol=2e-6)


def test_the_rows_reductions_are_computed_once_per_row():
    program = _program(_softmax("Softmax", [8, 64, 256], -1))
    (kernel,) = program.kernels
    loops = {r: int(r.src[0].arg) for r in _ranges(kernel)}
    # one parallel range over the 512 rows; inside it the max's loop, the loop storing exp(x - max), the sum's
    # loop over the stored row and the loop scaling it: no range of more than a row inside a row
    assert sorted(loops.values()) == [256, 256, 256, 256, 512]
    outer = next(r for r in loops if r.arg.kind is RangeKind.PARALLEL)
    write, scale = kernel.ast.src  # two statements over the same rows (passes/rows.py two_pass_softmax)
    assert all(s.op is Ops.STORE and outer in set(toposort([s])) for s in (write, scale))
    assert sum(n.op is Ops.EXP for n in toposort([kernel.ast])) == 1  # exp once per element
    reduces = [n for n in toposort([kernel.ast]) if n.op is Ops.LOOP_REDUCE]
    inner_out = [r for r in loops if r.arg.kind is RangeKind.LOOP]
    assert len(reduces) == 2
    for red in reduces:  # each reduction's value depends on the row (the parallel range), not on an output loop
        deps = set(toposort([red.src[0]]))
        assert outer in deps and not any(r in deps for r in inner_out)


@pytest.mark.parametrize("case", ["axis1", "too_long", "used_outside", "policy_off"])
def test_other_softmaxes_keep_their_kernels(case):
    shape, axis, policy, extra = [2, 6, 5, 7], -1, DEFAULT_POLICY, False
    if case == "axis1":
        axis = 1  # not the trailing axis: a row is not contiguous, each element would reduce its own column
    elif case == "too_long":
        shape = [2, DEFAULT_POLICY.row_fusion_max + 1]
    elif case == "used_outside":
        extra = True
    else:
        policy = DEFAULT_POLICY.without("row_fusion")
    model = _softmax("Softmax", shape, axis, extra_output=extra)
    assert len(_program(model, policy).kernels) >= 4 - (case == "used_outside")
    x = _x(shape, seed=1)
    with svodrt.load(svodc.compile(model), threads=1) as m:
        got = m.run({"x": x})
    for name, want in zip(["y", "m"], reference(model, {"x": x}), strict=False):
        np.testing.assert_allclose(got[name], want, rtol=2e-6, atol=2e-6)


def test_row_fusion_over_a_bounded_sequence():
    # attention scores [1, heads, T, T] with T bounded: the row length is known only at run time
    model = _softmax("Softmax", [1, 4, "T", "T"], -1)
    with svodrt.load(svodc.compile(model, dims={"T": (1, 40)}), threads=2) as m:
        for t in (1, 17, 40):
            x = _x((1, 4, t, t), seed=t)
            np.testing.assert_allclose(m.run({"x": x})["y"], reference(model, {"x": x})[0], rtol=2e-6, atol=2e-6)


def test_softmax_of_nan_and_inf_rows_matches_onnxruntime():
    x = _x((4, 16))
    x[0, 3] = np.nan
    x[1, :] = -np.inf
    x[2, 5] = np.inf
    model = _softmax("Softmax", [4, 16], -1)
    with svodrt.load(svodc.compile(model), threads=1) as m:
        got = m.run({"x": x})["y"]
    with np.errstate(all="ignore"):
        want = reference(model, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(got[ok], want[ok], rtol=2e-6, atol=2e-6)


def test_a_gpu_variant_keeps_softmax_in_four_kernels():
    from svodc.api import bundle_policy
    from svodc.gpu_target import parse_targets

    policy = bundle_policy(parse_targets("x86_64:x86-64-v3,sm_90"), CompileOptions())
    assert not policy.row_fusion
    assert len(_program(_softmax("Softmax", [3, 5, 300], -1), policy).kernels) == 4
