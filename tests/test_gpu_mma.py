"""Matrix units on CUDA (mma.sync, svodc/codegen/gpu_mma.py) and CDNA3 (MFMA, gpu_mfma.py) under --precision,
checked without their hardware (issue 16 item 3):
- the lane -> fragment element mapping the mma.sync emitter uses, against the PTX ISA manual's fragment
  layout tables for mma.m16n8k16 (written out here, independently): a NumPy simulation of each warp's mma;
- the PTX of a small CNN's sm_80 / sm_90 variants contains mma.sync and ptxas assembles it;
- the same bundle's CUDA path on the stand-in driver, its kernels emulated with the warp-collective mma
  step, against onnxruntime;
- gfx942: compile and code-object checks only (llvm-objdump lists v_mfma; the object is well formed)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from svodc.codegen import gpu_mma, gpu_tools
from svodc.options import CompileOptions
from tests.gpu.harness import Emulation, check_code_objects, gpu_bundle, lower, run_on_stub
from tests.onnx_util import reference

WARPS = 8  # 256 threads per GEMM block
TOLERANCE = {"f16": 2e-3, "bf16": 2e-2}  # softmax outputs, as in test_gpu_precision.py


# PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating point type" (.f16 / .bf16 A and B, .f32 C and D):
# groupID = laneid >> 2, threadID_in_group = laneid % 4.
def ptx_a(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    row = g if (0 <= i < 2 or 4 <= i < 6) else g + 8
    col = t * 2 + (i & 1) if i < 4 else t * 2 + (i & 1) + 8
    return row, col


def ptx_b(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    row = t * 2 + (i & 1) if i < 2 else t * 2 + (i & 1) + 8
    return row, g


def ptx_c(lane: int, i: int) -> tuple[int, int]:
    g, t = lane >> 2, lane % 4
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def test_mma_fragments_follow_the_ptx_isa_layout():
    """Each lane loads its fragments from the staged tiles where the emitter's formulas say; the tensor core
    reads them by the manual's layout, multiplies, and hands back D by it; the emitter stores D where its
    formulas say. The block's 64 x 64 tile must come out as A @ B, every element written exactly once."""
    rng = np.random.default_rng(0)
    a_tile = rng.standard_normal((64, 16))
    b_tile = rng.standard_normal((16, 64))
    c = np.full((64, 64), np.nan)
    for w in range(WARPS):
        threads = [32 * w + lane for lane in range(32)]
        a_hw = np.full((16, 16), np.nan)  # what the hardware sees as this warp's A operand
        for lane, t in enumerate(threads):
            for i in range(8):
                a_hw[ptx_a(lane, i)] = a_tile.flat[gpu_mma.a_fetch(t, i)]
        assert not np.isnan(a_hw).any(), "an A element no lane holds"
        for j in range(gpu_mma.SUBTILES_PER_WARP):
            b_hw = np.full((16, 8), np.nan)
            for lane, t in enumerate(threads):
                for i in range(4):
                    b_hw[ptx_b(lane, i)] = b_tile.flat[gpu_mma.b_fetch(t, j, i)]
            assert not np.isnan(b_hw).any(), "a B element no lane holds"
            d = a_hw @ b_hw
            for lane, t in enumerate(threads):
                for i in range(4):
                    row, col = gpu_mma.accumulator_position(t, 4 * j + i)
                    assert np.isnan(c[row, col]), f"C[{row}, {col}] written twice"
                    c[row, col] = d[ptx_c(lane, i)]
    np.testing.assert_allclose(c, a_tile @ b_tile, rtol=1e-12, atol=1e-12)


@pytest.fixture(scope="module")
def reduced(small_model, llvm_workers):
    """The small CNN lowered and compiled for sm_80, sm_90 and gfx942 at each reduced precision."""
    from svodc.codegen.gpu_compile import compile_gpu_programs
    from svodc.gpu_target import parse_targets

    model, _ = small_model
    out = {}
    for precision in ("f16", "bf16"):
        options = CompileOptions(precision=precision)
        program = lower(model, options)
        out[precision] = program, compile_gpu_programs(program, parse_targets("sm_80,sm_90,gfx942"), options,
                                                       llvm_workers)
    return out


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_cuda_variants_use_mma_sync_and_ptxas_assembles_them(reduced, precision):
    program, images = reduced[precision]
    check_code_objects(program, images)  # a cubin per variant where ptxas is installed
    kind = "f16" if precision == "f16" else "bf16"
    for img in images:
        if img.target.kind == "cuda":
            ptx = img.code.decode()
            assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx, img.target.cpu
            assert ".local" not in ptx, "fragments and accumulators live in registers"
    if gpu_tools.find_ptxas() is None:
        pytest.skip("ptxas is not installed: the PTX was not assembled (install the CUDA toolkit's ptxas)")
    assert all(img.cubin for img in images if img.target.kind == "cuda")


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_gfx942_variant_uses_mfma(reduced, precision, tmp_path):
    """Compile and code-object checks only: nothing here executes gfx942 code."""
    from tests.gpu.rdna3.objdump import find_objdump

    program, images = reduced[precision]
    img = next(i for i in images if i.target.cpu == "gfx942")
    check_code_objects(program, [img])
    gpu_tools.check_amd_code_object(img.code, "gfx942", {x.symbol: len(program.kernels[x.kernel].params)
                                                         + (x.dims is not None) for x in img.launches})
    tool = find_objdump()
    if tool is None:
        pytest.skip("llvm-objdump (LLVM 17 or newer) is not installed: the gfx942 object was not disassembled")
    path = tmp_path / "gfx942.hsaco"
    path.write_bytes(img.code)
    out = subprocess.run([tool, "-d", "--mcpu=gfx942", str(path)], capture_output=True, text=True, check=True,
                         timeout=120).stdout
    assert f"v_mfma_f32_16x16x16_{precision}" in out


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_sm80_bundle_with_mma_runs_on_the_stand_in_driver(stub, small_model, reduced, precision, llvm_workers):
    """svodrt's CUDA path loads the sm_80 variant; its launches run the emulated kernels with mma.sync modelled
    as a warp-collective step (all 32 lanes' fragments gathered, multiplied, scattered back by the layouts)."""
    from svodc.codegen.gpu_compile import compile_gpu_emulation
    from svodc.target import parse_target

    model, feeds = small_model
    program, images = reduced[precision]
    host = parse_target("x86_64-linux-gnu:x86-64")[0]
    image, launches = compile_gpu_emulation(program, host, CompileOptions(precision=precision), llvm_workers, "mma")
    sm80 = [img for img in images if img.target.cpu == "sm_80"]
    got = run_on_stub(stub, gpu_bundle(program, sm80), Emulation(program, image, launches), feeds, "cuda:0")
    for (name, g), w in zip(got.items(), reference(model, feeds), strict=True):
        err = float(np.abs(g - w).max())
        assert err <= TOLERANCE[precision], (name, err)
        assert err > 0.0, "the operands were rounded: fp32 outputs cannot come out exactly"


def test_a_bounded_batch_with_mma_runs_on_the_stand_in_driver_at_two_sizes(stub, llvm_workers):
    """tests/test_dynamic.py's model (a conv GEMM over a run-time batch N in 1..4) in f16 for sm_80: the mma
    kernel reads N from `dims`, strides over the run-time tiles, and matches onnxruntime at N=1 and N=3
    (f16 keeps 11 significant bits: within 2e-3 of each output's scale)."""
    from svodc.codegen.gpu_compile import compile_gpu_emulation, compile_gpu_programs
    from svodc.gpu_target import parse_targets
    from svodc.target import parse_target
    from tests.test_dynamic import _cnn, _feeds

    model, options = _cnn(), CompileOptions(dims={"N": (1, 4)}, precision="f16")
    program = lower(model, options)
    images = compile_gpu_programs(program, parse_targets("sm_80"), options, llvm_workers)
    assert "mma.sync" in images[0].code.decode()
    host = parse_target("x86_64-linux-gnu:x86-64")[0]
    emu = Emulation(program, *compile_gpu_emulation(program, host, options, llvm_workers, "mma"))
    for n in (1, 3):
        feeds = _feeds(n)
        got = run_on_stub(stub, gpu_bundle(program, images), emu, feeds, "cuda:0")
        for (name, g), w in zip(got.items(), reference(model, feeds), strict=True):
            assert g.shape == w.shape and float(np.abs(g - w).max()) <= 2e-3 * max(float(np.abs(w).max()), 1.0), name


class _Lines:
    """The part of a GpuEmitter that gpu_mma's rounding code emits into: one scope of IR lines."""

    def __init__(self):
        from svodc.codegen.llvm_ir import Scope

        self.stack, self._n = [Scope(None)], 0

    def emit_line(self, scope, rhs: str, hint: str = "v") -> str:
        self._n += 1
        scope.lines.append(f"  %{hint}{self._n} = {rhs}")
        return f"%{hint}{self._n}"


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_emulated_rounding_matches_numpy(dtype, llvm_workers):
    """The emulation rounds fragments to float16 / bfloat16 in integer code (x86 has no half type without a
    runtime helper): it must round as the hardware's conversion does (to nearest even, overflow to inf,
    float16 subnormals), here against NumPy / ml_dtypes on every tie and its neighbours."""
    import ctypes
    import hashlib

    import ml_dtypes

    from svodc.codegen.compile import run_jobs
    from svodc.codegen.elf import read_object
    from svodc.codegen.link import link
    from svodc.codegen.llvm_job import LLVMJob
    from svodc.ir.dtypes import dtypes
    from svodc.target import parse_target
    from svodrt.memory import map_code

    em = _Lines()
    y = gpu_mma._emulated_round(em, "%x", getattr(dtypes, dtype))
    host = parse_target("x86_64-linux-gnu:x86-64")[0]
    ir = "\n".join([f'target triple = "{host.triple}"', "define void @svod_round(ptr %p, i64 %n) {", "entry:",
                    "  br label %loop", "loop:", "  %i = phi i64 [ 0, %entry ], [ %j, %loop ]",
                    "  %q = getelementptr float, ptr %p, i64 %i", "  %x = load float, ptr %q",
                    *em.stack[0].lines, f"  store float {y}, ptr %q", "  %j = add i64 %i, 1",
                    "  %more = icmp ult i64 %j, %n", "  br i1 %more, label %loop, label %done", "done:",
                    "  ret void", "}"]) + "\n"
    job = LLVMJob("rounding", ir, host.triple, host.llvm_cpu, host.llvm_features, 2, host.codemodel, False)
    (obj, _), = run_jobs([job], llvm_workers)
    image = link([read_object(obj, "rounding")], ["svod_round"])
    code = map_code(image.data, tuple(image.fixups), hashlib.sha256(image.data).digest(), "rounding")
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(code.address + image.symbols["svod_round"])

    low = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    grid = np.arange(0, 1 << 16, dtype=np.uint16).view(low).astype(np.float32)
    grid = np.sort(grid[np.isfinite(grid)])
    ties = (grid[:-1].astype(np.float64) + grid[1:]) / 2  # exact in float32: halfway between neighbours
    x = np.concatenate([grid, ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf),
                        np.float32([65520.0, 1e30, -1e30, 3.4e38, np.inf, -np.inf])]).astype(np.float32)
    x = x[np.abs(x) < 3.39e38] if dtype == "bfloat16" else x  # bfloat16's integer rounding: finite values only
    got = np.ascontiguousarray(x.copy())
    fn(got.ctypes.data, got.size)
    with np.errstate(over="ignore"):  # 65520 and up: inf, as wanted
        want = x.astype(low).astype(np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))
