from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.onnx_util import make_model


@pytest.fixture(scope="session")
def small_model():
    """A conv -> relu -> pool -> gemm -> softmax model with random weights, and one input."""
    r = np.random.default_rng(7)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "fw"], ["g"], transB=1),
        helper.make_node("Softmax", ["g"], ["y"]),
    ]
    inits = {"w": r.standard_normal((4, 3, 3, 3)).astype(np.float32), "b": r.standard_normal(4).astype(np.float32),
             "fw": (r.standard_normal((10, 64)) * 0.1).astype(np.float32)}
    model = make_model(nodes, {"x": (np.float32, [2, 3, 8, 8])}, ["y"], inits)
    x = r.standard_normal((2, 3, 8, 8)).astype(np.float32)
    return model, {"x": x}


@pytest.fixture(scope="session")
def small_bundle(small_model, tmp_path_factory):
    import svodc

    model, feeds = small_model
    path = tmp_path_factory.mktemp("bundle") / "small.svod"
    path.write_bytes(svodc.compile(model))
    return path, feeds


@pytest.fixture(scope="session")
def fat_bundle(small_model, tmp_path_factory):
    """small_model compiled for three x86-64 levels, best first."""
    import svodc

    model, feeds = small_model
    path = tmp_path_factory.mktemp("fat") / "fat.svod"
    path.write_bytes(svodc.compile(model, target="x86_64-linux-gnu:x86-64-v4,x86-64-v3,x86-64"))
    return path, feeds
