"""Winograd F(2x2, 3x3) convolution (svodc/passes/winograd.py): outputs against onnxruntime, and the gate."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.pipeline import optimize
from svodc.passes.winograd import BT, _filter_transform_einsum, filter_transform, filter_transform64
from svodc.policy import DEFAULT_POLICY
from tests.onnx_util import make_model, reference

# Low thresholds, so small (fast) convolutions take the Winograd path.
EVERYWHERE = dataclasses.replace(DEFAULT_POLICY, winograd_min_in_channels=1, winograd_min_out_channels=1,
                                 winograd_min_tiles=1, winograd_min_macs=1, parallel_min=1)


def _conv_model(c: int, o: int, h: int, w: int, pad: int, bias: bool = True, epilogue: bool = False,
                stride: int = 1, group: int = 1, dilation: int = 1, seed: int = 0):
    r = np.random.default_rng(seed)
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    nodes = [helper.make_node("Conv", inputs, ["y" if not epilogue else "c"], pads=[pad] * 4, strides=[stride] * 2,
                              group=group, dilations=[dilation] * 2)]
    inits = {"w": (r.standard_normal((o, c // group, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)}
    if bias:
        inits["b"] = r.standard_normal(o).astype(np.float32)
    shapes = {"x": (np.float32, [1, c, h, w])}
    feeds = {"x": r.standard_normal((1, c, h, w)).astype(np.float32)}
    if epilogue:  # relu, then a residual add, as in a ResNet block
        oh, ow = h + 2 * pad - 2, w + 2 * pad - 2
        nodes += [helper.make_node("Relu", ["c"], ["r"]), helper.make_node("Add", ["r", "res"], ["y"])]
        shapes["res"] = (np.float32, [1, o, oh, ow])
        feeds["res"] = r.standard_normal((1, o, oh, ow)).astype(np.float32)
    return make_model(nodes, shapes, ["y"], inits), feeds


def _winograd_matmuls(model, policy) -> int:
    """MATMULs of the Winograd form: one product per transformed position, [t*t, O, tiles]."""
    sink = optimize(import_model(model), CompileOptions(), policy)
    t2 = BT.shape[0] ** 2
    return sum(1 for n in sink.toposort() if n.op is Ops.MATMUL and n.ndim == 3 and n.shape[0] == t2)


@pytest.mark.parametrize("c, o, h, w, pad, bias, epilogue, policy", [
    (8, 8, 8, 8, 1, True, False, EVERYWHERE),
    (5, 7, 9, 11, 1, True, True, EVERYWHERE),  # odd channels and sizes: the last tiles are cut off
    (16, 12, 10, 7, 0, False, False, EVERYWHERE),  # no padding
    (3, 20, 8, 8, 0, True, True, EVERYWHERE),
    (64, 32, 23, 22, 1, True, True, DEFAULT_POLICY),  # the default thresholds (the kernels' own parallel loops)
])
def test_single_convolutions_match_onnxruntime(c, o, h, w, pad, bias, epilogue, policy):
    model, feeds = _conv_model(c, o, h, w, pad, bias, epilogue)
    assert _winograd_matmuls(model, policy) == 1
    bundle = svodc.compile(model, options=CompileOptions(policies={"*": policy}))
    with svodrt.load(bundle) as m:
        got = m.run(feeds)["y"]
    want = reference(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


def test_filter_transform_is_g_g_gt():
    g = np.random.default_rng(1).standard_normal((3, 2, 3, 3)).astype(np.float32)
    u = filter_transform(g)  # [t*t, O, C]
    G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
    for o in range(3):
        for c in range(2):
            np.testing.assert_allclose(u[:, o, c].reshape(4, 4), G @ g[o, c] @ G.T, rtol=1e-6, atol=1e-6)


def test_filter_transform_bits_are_einsums():
    """The ordered sum gives einsum's float64 bits (bundles did not change): taps over 80 binades, where another
    order of the sums (l outer) gives other bits, and signed zeros; a filter with an inf takes einsum's path."""
    rng = np.random.default_rng(2)
    for o, c in ((5, 7), (33, 36), (1, 1)):
        g = (rng.standard_normal((o, c, 3, 3)) * np.exp2(rng.integers(-40, 40, (o, c, 3, 3)))).astype(np.float32)
        g[0, 0, 1] = -0.0
        assert np.array_equal(filter_transform64(g).view(np.int64), _filter_transform_einsum(g).view(np.int64))
    g[0, 0, 0, 0] = np.inf
    assert np.array_equal(filter_transform(g), _filter_transform_einsum(g).astype(np.float32), equal_nan=True)


def test_gate():
    model, _ = _conv_model(8, 8, 8, 8, 1)
    assert _winograd_matmuls(model, EVERYWHERE.without("winograd")) == 0  # the step switched off
    assert _winograd_matmuls(model, DEFAULT_POLICY) == 0  # too few channels and tiles for the defaults
    for kwargs in ({"stride": 2}, {"group": 2}, {"dilation": 2}):  # the direct path
        strided, _ = _conv_model(8, 8, 12, 12, 1, **kwargs)
        assert _winograd_matmuls(strided, EVERYWHERE) == 0, kwargs
    c, o = DEFAULT_POLICY.winograd_min_in_channels, DEFAULT_POLICY.winograd_min_out_channels
    big, _ = _conv_model(c, o, 32, 32, 1)
    assert _winograd_matmuls(big, DEFAULT_POLICY) == 1
    fewer_channels, _ = _conv_model(c - 1, o, 32, 32, 1)
    assert _winograd_matmuls(fewer_channels, DEFAULT_POLICY) == 0


def test_squeezenet_matches_onnxruntime():
    from bench.models import light

    bm = light("squeezenet")
    assert _winograd_matmuls(bm.model, DEFAULT_POLICY) > 0
    bundle = svodc.compile(bm.model)
    with svodrt.load(bundle) as m:
        got = list(m.run(bm.feeds).values())
    for g, w in zip(got, reference(bm.model, bm.feeds), strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()))


def test_a_bundle_with_a_gpu_variant_keeps_direct_convolutions():
    """On a GPU each split piece of Winograd's transforms is a launch, for little or no work saved
    (docs/architecture.md): a bundle with a GPU variant compiles without the step; CPU-only bundles keep it."""
    from svodc.api import bundle_policy
    from svodc.gpu_target import parse_targets
    from svodc.options import CompileOptions

    options = CompileOptions()
    assert not bundle_policy(parse_targets("x86_64,sm_90"), options).winograd
    assert bundle_policy(parse_targets("x86_64"), options).winograd
