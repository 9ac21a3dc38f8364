"""1-D convolutions over channels-last memory (contraction.channels_last_conv_to_matmul): the product's
orientation (patches read in place as A, the filter packed as B) and outputs against onnxruntime, and the
cases that keep conv_to_matmul's im2col."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
import svodrt
from svodc.frontend.importer import import_model
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from svodc.passes.fold import is_folded_constant
from svodc.passes.pipeline import optimize
from svodc.policy import DEFAULT_POLICY
from tests.onnx_util import make_model, reference


def _model(length: int, c: int, o: int, k: int, *, two_d: bool, pad: int = 0, stride: int = 1, dilation: int = 1,
           computed: bool = False, channels_last: bool = True, seed: int = 0):
    """x [1, L, C] (or [1, C, L] when not channels_last), optionally through a Relu, transposed to [1, C, L]
    (and unsqueezed to [1, C, L, 1] when two_d), then Conv (kernel k along L) + bias + Relu."""
    r = np.random.default_rng(seed)
    nodes, name = [], "x"
    if computed:
        nodes.append(helper.make_node("Relu", [name], ["xr"]))
        name = "xr"
    if channels_last:
        nodes.append(helper.make_node("Transpose", [name], ["xt"], perm=[0, 2, 1]))
        name = "xt"
    w = (r.standard_normal((o, c, k)) / np.sqrt(k * c)).astype(np.float32)
    inits = {"b": r.standard_normal(o).astype(np.float32)}
    attrs = {"pads": [pad, pad], "strides": [stride], "dilations": [dilation]}
    if two_d:
        inits["axes"] = np.array([3], np.int64)
        nodes.append(helper.make_node("Unsqueeze", [name, "axes"], ["x4"]))
        name, w = "x4", w[..., None]
        attrs = {"pads": [pad, 0, pad, 0], "strides": [stride, 1], "dilations": [dilation, 1]}
    inits["w"] = w
    nodes += [helper.make_node("Conv", [name, "w", "b"], ["c"], **attrs), helper.make_node("Relu", ["c"], ["y"])]
    shape = [1, length, c] if channels_last else [1, c, length]
    feeds = {"x": r.standard_normal(shape).astype(np.float32)}
    return make_model(nodes, {"x": (np.float32, shape)}, ["y"], inits), feeds


def _patches_matmuls(model) -> int:
    """MATMULs in the channels-last orientation: a run-time A, a constant B."""
    sink = optimize(import_model(model), CompileOptions(), DEFAULT_POLICY)
    return sum(1 for n in sink.toposort() if n.op is Ops.MATMUL and not is_folded_constant(n.src[0])
               and is_folded_constant(n.src[1]))


@pytest.mark.parametrize("kwargs, in_place", [
    ({"two_d": True}, True),  # as magika exports it: Transpose, Unsqueeze, a [k, 1] kernel
    ({"two_d": False, "computed": True}, True),  # Conv1d over a computed tensor
    ({"two_d": True, "stride": 2}, True),
    ({"two_d": False, "pad": 2}, False),  # padding: the im2col copy
    ({"two_d": True, "dilation": 2}, False),  # taps 2C apart do not merge with the channels
    ({"two_d": False, "channels_last": False}, False),  # channels-first memory: im2col of x in place
])
def test_channels_last_conv(kwargs, in_place):
    model, feeds = _model(40, 24, 32, 5, **kwargs)
    assert _patches_matmuls(model) == (1 if in_place else 0)
    with svodrt.load(svodc.compile(model)) as m:
        got = m.run(feeds)["y"]
    want = reference(model, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
