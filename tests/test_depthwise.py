"""Depthwise and grouped convolutions and pooling windows on the generic path: small reductions written
out term by term (passes/lower.py) and padding read in place (schedule.py, split.py), against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops
from svodc.ir.uop import toposort
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy
from tests.onnx_util import compile_and_run, make_model, reference


def conv_model(c: int, h: int, w: int, k: int, stride: int, pad: int, groups: int, out: int | None = None,
               epilogue: str = "clip", residual: bool = False, seed: int = 0):
    """x -> Conv(groups) + bias -> Clip(0, 6) / Relu / nothing [-> + x]; seeded random weights."""
    r = np.random.default_rng(seed)
    o = out or c
    inits = {"w": r.standard_normal((o, c // groups, k, k)).astype(np.float32),
             "b": r.standard_normal(o).astype(np.float32)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y0"], group=groups, kernel_shape=[k, k],
                              pads=[pad] * 4, strides=[stride] * 2)]
    last = "y0"
    if epilogue == "clip":
        inits |= {"lo": np.array(0, np.float32), "hi": np.array(6, np.float32)}
        nodes.append(helper.make_node("Clip", [last, "lo", "hi"], ["y1"]))
        last = "y1"
    elif epilogue == "relu":
        nodes.append(helper.make_node("Relu", [last], ["y1"]))
        last = "y1"
    if residual:
        nodes.append(helper.make_node("Add", [last, "x"], ["y2"]))
        last = "y2"
    model = make_model(nodes, {"x": (np.float32, [1, c, h, w])}, [last], inits)
    return model, {"x": r.standard_normal((1, c, h, w)).astype(np.float32)}


CASES = [  # (channels, height, width, kernel, stride, pad, groups, epilogue, residual)
    (16, 12, 12, 3, 1, 1, 16, "clip", False),
    (13, 11, 9, 3, 2, 1, 13, "clip", False),  # channels and odd widths not a multiple of a vector
    (10, 15, 17, 5, 2, 2, 10, "relu", False),  # 5x5, stride 2 (ppocr's depthwise layers)
    (24, 7, 7, 3, 1, 1, 24, "none", True),  # a residual add fused behind the convolution
    (9, 10, 23, 3, 1, 0, 9, "clip", False),  # no padding
    (12, 9, 9, 3, 2, 1, 6, "relu", False),  # grouped: 2 channels per group (18 taps)
    (8, 6, 6, 1, 1, 0, 8, "none", False),  # 1x1 depthwise: one tap, nothing to unroll
    (5, 9, 45, 3, 1, 1, 5, "clip", False),  # rows of 47 padded: the padded copy split (split.LONG_ROW)
]


@pytest.mark.parametrize("c,h,w,k,stride,pad,groups,epilogue,residual", CASES)
def test_windowed_convolution_matches_onnxruntime(c, h, w, k, stride, pad, groups, epilogue, residual):
    model, feeds = conv_model(c, h, w, k, stride, pad, groups, epilogue=epilogue, residual=residual)
    got = next(iter(compile_and_run(model, feeds, threads=2).values()))
    np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_max_pool_over_padding_matches_onnxruntime():
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node("MaxPool", ["x"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
             helper.make_node("AveragePool", ["x"], ["a"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              count_include_pad=1)]
    model = make_model(nodes, {"x": (np.float32, [1, 5, 13, 11])}, ["p", "a"])
    feeds = {"x": np.random.default_rng(3).standard_normal((1, 5, 13, 11)).astype(np.float32)}
    got = compile_and_run(model, feeds)
    for name, want in zip(("p", "a"), reference(model, feeds), strict=True):
        np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-6)


def _kernel_stats(policy: OptimizationPolicy, model, options: CompileOptions | None = None) -> tuple[int, int, int]:
    """(kernels, LOOP_REDUCEs, MULACCs) of the program."""
    options = options or CompileOptions()
    program = build_program(import_model(model, options), options, policy)
    nodes = [n for k in program.kernels for n in toposort([k.ast])]
    return (len(program.kernels), sum(n.op is Ops.LOOP_REDUCE for n in nodes), sum(n.op is Ops.MULACC for n in nodes))


def test_taps_are_unrolled_and_padding_read_in_place():
    model, _ = conv_model(16, 12, 12, 3, 2, 1, 16)
    kernels, loops, fmas = _kernel_stats(DEFAULT_POLICY, model)
    assert (kernels, loops) == (1, 0) and fmas > 0  # no padded copy, no tap loop
    # each switch restores what it replaces: a padded copy, a loop over the taps
    assert _kernel_stats(DEFAULT_POLICY.without("fuse_window_pads"), model)[0] == 2
    kernels, loops, fmas = _kernel_stats(OptimizationPolicy(unroll_reduce_max=4), model)
    assert (kernels, fmas) == (2, 0) and loops > 0
    # stride 1: the padded copy stays (about the output's size; the kernel over it runs whole rows)
    stride1, _ = conv_model(16, 12, 12, 3, 1, 1, 16)
    assert _kernel_stats(DEFAULT_POLICY, stride1)[:2] == (2, 0)


def test_a_computed_source_keeps_its_padded_copy():
    """Taps over padding read in place would recompute a fused source once per tap."""
    model, _ = conv_model(8, 10, 10, 3, 2, 1, 8, epilogue="none")
    nodes = [helper.make_node("Sigmoid", ["x"], ["s"]), *model.graph.node]
    nodes[1].input[0] = "s"
    fused = make_model(nodes, {"x": (np.float32, [1, 8, 10, 10])}, ["y0"],
                       {i.name: np.frombuffer(i.raw_data, np.float32).reshape(i.dims) for i in model.graph.initializer})
    assert _kernel_stats(DEFAULT_POLICY, fused)[0] == 2


def test_over_a_run_time_height_the_padded_copy_stays_and_outputs_match():
    """split.py cannot cut a run-time loop's borders off, so a bounded dim keeps the padded copy."""
    import svodc
    import svodrt

    model, _ = conv_model(6, 9, 11, 3, 2, 1, 6)
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    shapes = {"x": (1, 6, (4, 12), 11)}
    options = CompileOptions(input_shapes=shapes)
    assert _kernel_stats(DEFAULT_POLICY, model, options) == _kernel_stats(DEFAULT_POLICY.without("fuse_window_pads"),
                                                                          model, options)
    bundle = svodc.compile(model, input_shapes=shapes)
    r = np.random.default_rng(2)
    with svodrt.load(bundle) as m:
        for h in (4, 9, 12):
            feeds = {"x": r.standard_normal((1, 6, h, 11)).astype(np.float32)}
            got = next(iter(m.run(feeds).values()))
            np.testing.assert_allclose(got, reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


def test_a_short_float16_sum_rounds_once_as_the_loop_does():
    """Sums of float16 are not written out (each term would round to float16): the loop accumulates them in
    float32 and rounds once, so the result is the exact sum rounded, but for rare near-ties."""
    r = np.random.default_rng(5)
    x = r.standard_normal((64, 32)).astype(np.float16)
    axes = np.array([1], np.int64)
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)],
                       {"x": (np.float16, [64, 32])}, ["y"], {"axes": axes}, opset=18)
    got = compile_and_run(model, {"x": x})["y"]
    exact = x.astype(np.float64).sum(axis=1).astype(np.float16)
    ulps = np.abs(got.view(np.int16).astype(np.int32) - exact.view(np.int16).astype(np.int32))
    assert ulps.max() <= 1 and np.mean(ulps == 0) >= 0.95, ulps
