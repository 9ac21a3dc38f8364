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


def pytest_terminal_summary(terminalreporter):
    """Print the real models' max errors (tests/test_models.py) after the run."""
    import sys

    module = sys.modules.get("tests.test_models")
    if module is not None and module.ERRORS:
        terminalreporter.section("real models: max error vs onnxruntime")
        for line in module.ERRORS:
            terminalreporter.line(line)
