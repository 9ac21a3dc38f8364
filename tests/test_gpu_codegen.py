"""GPU targets in svodc: target strings, the launch computation, the code objects (PTX assembled by
ptxas, AMD code objects and their metadata notes), missing tools, and the GEMM kernels' tiling on
every kind of shape, run as their CPU emulation through svodrt's GPU path (tests/gpu/harness.py)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import svodc
from svodc.codegen import gpu_tools
from svodc.codegen.gpu_compile import compile_gpu_programs
from svodc.codegen.gpu_emit import MAP_BLOCK, MAX_GRID, map_launch
from svodc.codegen.gpu_gemm import BM, BN, THREADS, gemm_launch
from svodc.errors import TargetError, ToolMissingError
from svodc.gpu_target import GpuTarget, parse_targets
from svodc.ir.ops import GemmArg, GemmOperand, Ops
from svodc.options import CompileOptions
from tests.gpu.harness import check_code_objects, emulate, gpu_bundle, lower, run_on_stub
from tests.onnx_util import make_model, reference

R = np.random.default_rng(11)


def rand(*shape):
    return R.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("spec,want", [
    ("gfx942", ["hip:gfx942"]),
    ("sm_90", ["cuda:sm_90"]),
    ("cuda:sm_80,hip:gfx1100,amdgcn:gfx1151,nvptx64-nvidia-cuda:sm_90,amdgcn-amd-amdhsa:gfx1200",
     ["cuda:sm_80", "hip:gfx1100", "hip:gfx1151", "cuda:sm_90", "hip:gfx1200"]),
    ("x86_64-linux-gnu:x86-64-v3,x86-64,sm_90,gfx942", ["x86_64:x86-64-v3", "x86_64:x86-64", "cuda:sm_90",
                                                         "hip:gfx942"]),
    ("sm_90,x86_64", ["x86_64:x86-64", "cuda:sm_90"]),
])
def test_target_strings(spec, want):
    assert [t.describe() for t in parse_targets(spec)] == want


@pytest.mark.parametrize("spec,message", [
    ("gfx90a", r"unknown GPU 'gfx90a' in 'gfx90a'; known: sm_80, sm_90, gfx942"),
    ("sm_75", r"unknown GPU 'sm_75'"),
    ("cuda:gfx942", r"'cuda:gfx942': gfx942 is a hip GPU, not cuda"),
    ("hip:sm_90", r"sm_90 is a cuda GPU, not hip"),
    ("cuda:bogus", r"unknown GPU 'bogus'"),
    ("sm_90,gfx942,sm_90", r"names the GPU sm_90 twice"),
])
def test_bad_target_strings(spec, message):
    with pytest.raises(TargetError, match=message):
        parse_targets(spec)


@pytest.mark.parametrize("total,grid", [(1, 1), (255, 1), (256, 1), (257, 2), (MAP_BLOCK * MAX_GRID, MAX_GRID),
                                        (10 ** 9, MAX_GRID)])
def test_map_launch(total, grid):
    x = map_launch(3, "s", total)
    assert (x.kernel, x.symbol, x.grid, x.block) == (3, "s", grid, MAP_BLOCK)
    assert x.grid * x.block >= min(total, MAP_BLOCK * MAX_GRID), "one pass of the grid-stride loop or more"


def test_map_launch_of_nothing():
    assert map_launch(0, "s", 0) is None


def test_gemm_launch_tiles_the_output():
    op = GemmOperand((0,), 1, 1)
    x = gemm_launch(0, "g", GemmArg((3,), 65, 130, 7, op, op, op))
    assert (x.grid, x.block) == (3 * 2 * 3, THREADS) and (BM, BN) == (64, 64)
    assert gemm_launch(0, "g", GemmArg((0,), 65, 130, 7, op, op, op)) is None


@pytest.fixture(scope="module")
def small_images(small_model, llvm_workers):
    """small_model for every GPU architecture."""
    program = lower(small_model[0])
    targets = parse_targets("sm_80,sm_90,gfx942,gfx1100,gfx1151,gfx1200")
    return program, compile_gpu_programs(program, targets, CompileOptions(), llvm_workers)


def test_code_objects_for_every_architecture(small_images):
    program, images = small_images
    assert {i.target.cpu for i in images} == {"sm_80", "sm_90", "gfx942", "gfx1100", "gfx1151", "gfx1200"}
    check_code_objects(program, images)


def test_ptx_is_assembled_for_sm_80_and_sm_90(small_images):
    if gpu_tools.find_ptxas() is None:
        pytest.skip("ptxas (CUDA toolkit) is not installed: bundles carry PTX only")
    assert all(i.cubin for i in small_images[1] if i.target.kind == "cuda")


def test_amd_check_refuses_a_missing_kernel(small_images):
    images = small_images[1]
    img = next(i for i in images if i.target.cpu == "gfx942")
    with pytest.raises(svodc.errors.CodegenError, match=r"kernel svod_nope \(descriptor svod_nope\.kd\) is not"):
        gpu_tools.check_amd_code_object(img.code, "gfx942", {"svod_nope": 1})
    with pytest.raises(svodc.errors.CodegenError, match=r"targets 'amdgcn-amd-amdhsa--gfx942'"):
        gpu_tools.check_amd_code_object(img.code, "gfx1100", {})


def test_missing_ld_lld_says_what_to_install(monkeypatch, tmp_path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ziglang" else real(name, *a))
    monkeypatch.setenv("PATH", str(tmp_path))
    gpu_tools.find_lld.cache_clear()
    try:
        with pytest.raises(ToolMissingError, match=r"need ld\.lld .*pip install .svod\[gpu\]. \(the ziglang package\).*apt-get install lld-22"):
            svodc.compile(_matmul_model(4, 4, 4)[0], target="gfx942")
    finally:
        gpu_tools.find_lld.cache_clear()


def test_without_ptxas_the_bundle_carries_ptx_only(stub, monkeypatch, llvm_workers):
    model, feeds = _matmul_model(5, 6, 7)
    monkeypatch.setattr(gpu_tools, "find_ptxas", lambda: None)
    bundle = svodc.compile(model, target="sm_90")
    emu = emulate(model, workers=llvm_workers)
    got = run_on_stub(stub, bundle, emu, feeds, "cuda:0")
    assert "load ptx sm_90" in stub.log()
    np.testing.assert_allclose(got["y"], reference(model, feeds)[0], rtol=1e-5, atol=1e-5)


def _matmul_model(m, k, n, constant="none", batch=()):
    a, b = rand(*batch, m, k), rand(*batch, k, n)
    inits = {"a": a} if constant == "a" else {"b": b} if constant == "b" else {}
    inputs = {x: (np.float32, list(v.shape)) for x, v in (("a", a), ("b", b)) if x not in inits}
    model = make_model([helper.make_node("MatMul", ["a", "b"], ["y"])], inputs, ["y"], inits)
    return model, {x: v for x, v in (("a", a), ("b", b)) if x not in inits}


@pytest.mark.parametrize("m,k,n,constant", [(64, 64, 64, "none"), (37, 50, 45, "b"), (1, 300, 77, "a"),
                                            (9, 1, 513, "none"), (130, 100, 20, "b"), (70, 17, 16, "a"),
                                            (512, 576, 49, "a")])
def test_gemm_kernels(stub, m, k, n, constant, llvm_workers):
    """Tile edges in m, n and k, K = 1, packed A and B panels, the transposed packing (512x576x49)."""
    model, feeds = _matmul_model(m, k, n, constant)
    program = lower(model)
    gemms = [k.ast.src[0] for k in program.kernels if k.ast.src[0].op is Ops.GEMM]
    assert gemms, "the GEMM path is taken"
    if (m, n) == (512, 49):
        assert gemms[0].arg.transposed
    images = compile_gpu_programs(program, [GpuTarget("sm_90")], CompileOptions(), llvm_workers)
    emu = emulate(model, program=program, workers=llvm_workers)
    got = run_on_stub(stub, gpu_bundle(program, images), emu, feeds, "cuda:0")
    np.testing.assert_allclose(got["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4 * np.sqrt(k))


def test_batched_gemm_with_broadcast_and_fused_epilogue(stub, llvm_workers):
    """Batch axes (one broadcast), and bias + ReLU + residual fused into the GEMM's epilogue."""
    a, b, bias, res = rand(2, 3, 17, 40), rand(3, 40, 33), rand(33), rand(2, 3, 17, 33)
    nodes = [helper.make_node("MatMul", ["a", "b"], ["t"]), helper.make_node("Add", ["t", "bias"], ["u"]),
             helper.make_node("Relu", ["u"], ["v"]), helper.make_node("Add", ["v", "res"], ["y"])]
    model = make_model(nodes, {"a": (np.float32, [2, 3, 17, 40]), "b": (np.float32, [3, 40, 33]),
                               "res": (np.float32, [2, 3, 17, 33])}, ["y"], {"bias": bias})
    feeds = {"a": a, "b": b, "res": res}
    program = lower(model)
    gemm = next(k.ast.src[0] for k in program.kernels if k.ast.src[0].op is Ops.GEMM)
    assert gemm.arg.batch == (2, 3) and len(gemm.src) > 3, "batched, with an epilogue"
    images = compile_gpu_programs(program, [GpuTarget("gfx942")], CompileOptions(), llvm_workers)
    emu = emulate(model, program=program, workers=llvm_workers)
    got = run_on_stub(stub, gpu_bundle(program, images), emu, feeds, "hip:0")
    np.testing.assert_allclose(got["y"], reference(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_serial_kernels_run_on_one_thread_in_order(stub, llvm_workers):
    """A scatter with repeated indices and reduction=add: its kernel must store in order, so every
    statement of it is launched as one block of one thread; the copy before it is its own launch."""
    n, m = 64, 4096
    x = np.zeros((n,), np.float32)
    idx = R.integers(-n, n, size=(m, 1)).astype(np.int64)
    model = make_model([helper.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction="add")],
                       {"x": (np.float32, [n]), "i": (np.int64, [m, 1]), "u": (np.float32, [m])}, ["y"])
    feeds = {"x": x, "i": idx, "u": np.ones((m,), np.float32)}
    program = lower(model)
    serial = [i for i, k in enumerate(program.kernels) if getattr(k.ast.arg, "serial", False)]
    images = compile_gpu_programs(program, [GpuTarget("sm_90")], CompileOptions(), llvm_workers)
    launches = [x for x in images[0].launches if x.kernel in serial]
    assert len(launches) == 2 and all((x.grid, x.block) == (1, 1) for x in launches)
    emu = emulate(model, program=program, workers=llvm_workers)
    got = run_on_stub(stub, gpu_bundle(program, images), emu, feeds, "cuda:0")
    want = np.bincount(np.where(idx[:, 0] < 0, idx[:, 0] + n, idx[:, 0]), minlength=n).astype(np.float32)
    np.testing.assert_array_equal(got["y"], want)
