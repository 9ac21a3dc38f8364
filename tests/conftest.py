from __future__ import annotations

import os

import pytest

from tests.onnx_util import small_cnn


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """svodrt's weights records (svodrt/bundle.py Record: weights and plan) go to the session's own cache, for subprocesses
    too: a test never finds one an earlier run left, nor leaves one in the user's home."""
    old = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg_cache"))
    yield
    if old is None:
        del os.environ["XDG_CACHE_HOME"]
    else:
        os.environ["XDG_CACHE_HOME"] = old


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


@pytest.fixture(scope="session")
def stub_library(tmp_path_factory):
    """The stand-in GPU driver (tests/gpu/stub_driver.c), built once per session."""
    from tests.gpu.harness import StubDriver, build_stub, c_compiler

    if c_compiler() is None:
        pytest.skip("no C compiler to build the stand-in GPU driver (install gcc or the ziglang package)")
    return StubDriver(build_stub(tmp_path_factory.mktemp("stub")))


@pytest.fixture
def stub(stub_library, monkeypatch):
    """svodrt opens the stand-in driver instead of libcuda.so.1 / libamdhip64.so."""
    import svodrt_gpu.device

    path = str(stub_library.path)
    monkeypatch.setattr(svodrt_gpu.device, "LIBRARIES", {"cuda": (path,), "hip": (path,)})
    for var in ("SVOD_STUB_CC", "SVOD_STUB_MACH", "SVOD_STUB_DEVICES", "SVOD_STUB_FAIL"):
        monkeypatch.delenv(var, raising=False)
    stub_library.clear()
    yield stub_library
    stub_library.set_launcher(None)


def pytest_terminal_summary(terminalreporter):
    """Print the real models' max errors (tests/test_models.py) and tests/summary.py's lines."""
    import sys

    from tests.summary import LINES

    if LINES:
        terminalreporter.section("summary")
        for line in LINES:
            terminalreporter.line(line)
    module = sys.modules.get("tests.test_models")
    if module is not None and module.ERRORS:
        terminalreporter.section("real models: max error vs onnxruntime")
        for line in module.ERRORS:
            terminalreporter.line(line)


@pytest.fixture(scope="session")
def llvm_workers():
    """One LLVM worker pool for the session: pass it as `workers=` where a test compiles directly."""
    import os

    from svodc.codegen.worker import WorkerPool

    with WorkerPool(os.cpu_count() or 1) as pool:
        yield pool


@pytest.fixture(scope="session", autouse=True)
def checked_compilations(llvm_workers):
    """Every svodc.compile / compile_to_file in the tests verifies the IR after every pass
    (CompileOptions.check_ir) and runs LLVM on the session's worker pool."""
    import dataclasses

    import svodc.api
    from svodc.options import CompileOptions

    real = svodc.api._compile_parts

    def compile_parts(model, target, options, progress, kernels_done=None, workers=None, **kw):
        options = dataclasses.replace(options or CompileOptions(**kw), check_ir=True)
        return real(model, target, options, progress, kernels_done, workers or llvm_workers)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(svodc.api, "_compile_parts", compile_parts)
        yield
