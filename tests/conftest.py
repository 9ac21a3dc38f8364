from __future__ import annotations

import pytest

from tests.onnx_util import small_cnn


@pytest.fixture(scope="session")
def small_model():
    """A conv -> relu -> pool -> gemm -> softmax model with random weights, and one input."""
    return small_cnn()


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


def pytest_terminal_summary(terminalreporter):
    """Print the real models' max errors (tests/test_models.py) after the run."""
    import sys

    module = sys.modules.get("tests.test_models")
    if module is not None and module.ERRORS:
        terminalreporter.section("real models: max error vs onnxruntime")
        for line in module.ERRORS:
            terminalreporter.line(line)
