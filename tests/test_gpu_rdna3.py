"""AMD code executed on its own ISA: svodrt's HIP path runs the gfx1100 code object in the bundle,
each kernel interpreted instruction by instruction by the RDNA3 emulator (tests/gpu/rdna3/), over
the stand-in driver's device memory, against onnxruntime. Also: the WMMA float16 GEMM kernel
(svodc/codegen/gpu_wmma.py) against NumPy, the emulator's decoder against llvm-objdump on every
instruction of our code objects, and unknown instructions failing loudly.

`make test` runs the small CNN, a Winograd convolution feeding a concat and the WMMA GEMM (seconds);
`make test-gpu` also runs squeezenet, shufflenet and gpt2_small_random (about a minute each here)."""

from __future__ import annotations

import dataclasses
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from onnx import helper

import svodrt
from svodc.codegen.gpu_compile import compile_gpu_programs
from svodc.codegen.gpu_wmma import SYMBOL, WmmaGemm, compile_wmma_gemm
from svodc.errors import CodegenError
from svodc.gpu_target import GpuTarget, parse_targets
from svodc.ir.ops import Ops
from svodc.options import CompileOptions
from tests.gpu.harness import assert_close, gpu_bundle, lower
from tests.gpu.rdna3.decode import UnknownInstruction, decode
from tests.gpu.rdna3.objdump import find_objdump, mismatches
from tests.gpu.rdna3.on_stub import RDNA3Launcher, run_in_emulator
from tests.gpu.rdna3.runner import CodeObject, Emulator
from tests.gpu.rdna3.wave import Memory, MemoryFault
from tests.light_models import dummy_inputs, random_weight_variant
from tests.onnx_util import make_model, reference

GPT2 = Path(__file__).resolve().parents[2] / "shared" / "models" / "gpt2_small_random"
GPT2_SEQ = 8  # tokens: emulating the gfx1100 code of 8 takes about a minute here
OBJDUMP = pytest.mark.skipif(find_objdump() is None, reason="llvm-objdump (LLVM 17+) is not installed: the oracle")


def _gfx1100(program, options=None):
    """The program's gfx1100 image; its decoding checked against llvm-objdump where that is installed."""
    image = compile_gpu_programs(program, parse_targets("gfx1100"), options or CompileOptions())[0]
    if find_objdump() is not None:
        assert mismatches(image.code) == []
    return image


@pytest.fixture(scope="module")
def small_gfx1100(small_model):
    model, feeds = small_model
    program = lower(model)
    return model, feeds, program, _gfx1100(program)


@pytest.fixture
def emulated_hip(stub, monkeypatch):
    monkeypatch.setenv("SVOD_STUB_MACH", "0x41")  # the stand-in driver poses as a gfx1100
    return stub


def test_small_model_runs_in_the_emulator(emulated_hip, small_gfx1100):
    """Against onnxruntime; and the lockstep batches give bit for bit what the reference schedule (each
    workgroup's waves one at a time between barriers) gives."""
    model, feeds, program, image = small_gfx1100
    bundle = gpu_bundle(program, [image])
    got = run_in_emulator(emulated_hip, bundle, image.code, feeds)
    assert_close(got, reference(model, feeds))
    one_at_a_time = run_in_emulator(emulated_hip, bundle, image.code, feeds, lockstep=False)
    for name, value in got.items():
        np.testing.assert_array_equal(value, one_at_a_time[name])


def test_a_bounded_batch_runs_in_the_emulator_at_two_sizes(emulated_hip):
    """One gfx1100 bundle with N in 1..4 (tests/test_dynamic.py's model: a conv GEMM over a run-time batch,
    pooling, a Gemm, Softmax): its machine code reads N from `dims` and runs at N=1 and N=3."""
    import svodc
    from tests.test_dynamic import _cnn, _feeds

    model, options = _cnn(), CompileOptions(dims={"N": (1, 4)})
    image = _gfx1100(lower(model, options), options)
    bundle = svodc.compile(model, target="gfx1100", options=options)
    for n in (1, 3):
        feeds = _feeds(n)
        got = run_in_emulator(emulated_hip, bundle, image.code, feeds)
        assert_close(got, reference(model, feeds))
        assert got["z"].shape == (n, 10)


def _fire_module(c: int, o1: int, o3: int, size: int):
    """Squeezenet's fire module without its squeeze: a 1x1 (o1 channels) and a 3x3 (o3) convolution of x,
    concatenated (the 3x3 one Winograd's under the test's policy, so the concatenation copies its tile layout)."""
    r = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w1"], ["a"]), helper.make_node("Conv", ["x", "w3"], ["b"], pads=[1] * 4),
             helper.make_node("Concat", ["a", "b"], ["y"], axis=1)]
    weights = {"w1": r.standard_normal((o1, c, 1, 1)).astype(np.float32),
               "w3": (r.standard_normal((o3, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32)}
    model = make_model(nodes, {"x": (np.float32, [1, c, size, size])}, ["y"], weights)
    return model, {"x": r.standard_normal((1, c, size, size)).astype(np.float32)}


def _accesses_in_bounds(program) -> int:
    """Every unmasked load and every store of every kernel, by its index's interval bounds, inside its buffer
    (the loop ASTs are what the CPU and GPU code both index by); how many there are."""
    count = 0
    for k in program.kernels:
        for n in k.ast.toposort():
            if n.op not in (Ops.LOAD, Ops.STORE) or n.src[0].op is not Ops.PARAM or (n.op is Ops.LOAD and len(n.src) > 2):
                continue
            buf = k.params[n.src[0].arg.index]
            assert n.src[1].vmin >= 0 and n.src[1].vmax < math.prod(buf.shape), (k.name, n.op, buf)
            count += 1
    return count


def test_a_winograd_convolution_feeding_a_concat_runs_in_the_emulator(emulated_hip):
    """The graph that found the emulator's in-place borrow bug (tests/test_rdna3_instructions.py): the concat
    kernel's gfx1100 code updates its 64-bit index in place, and read 2^34 bytes below its buffer in the
    emulator. Lowered with the step, which GPU bundles leave out (svodc.api.bundle_policy), so its kernels
    are checked as GPU code all the same. Against onnxruntime on gfx1100 and on the CPU, whose loops index
    the same buffers."""
    import svodc
    from svodc.api import bundle_policy
    from tests.test_winograd import EVERYWHERE

    model, feeds = _fire_module(8, 8, 8, 13)
    options = CompileOptions(policies={"*": EVERYWHERE})
    program = lower(model, options, dataclasses.replace(bundle_policy(parse_targets("gfx1100"), options), winograd=True))
    gemms = [s.arg for k in program.kernels for s in k.ast.src if s.op is Ops.GEMM]
    assert any(g.batch == (16,) for g in gemms), "the batched GEMM of Winograd's 16 transformed positions"
    assert _accesses_in_bounds(program) > 0
    image = _gfx1100(program, options)
    want = reference(model, feeds)
    assert_close(run_in_emulator(emulated_hip, gpu_bundle(program, [image]), image.code, feeds), want)
    with svodrt.load(svodc.compile(model, options=options)) as m:
        assert_close(m.run(feeds), want)


@pytest.mark.parametrize(("precision", "instruction", "tolerance"), [("f16", "v_wmma_f32_16x16x16_f16", 2e-3),
                                                                    ("bf16", "v_wmma_f32_16x16x16_bf16", 2e-2)])
def test_reduced_precision_gemms_run_on_the_matrix_units(emulated_hip, small_model, precision, instruction,
                                                          tolerance):
    """--precision on gfx1100: the model's GEMMs run on WMMA (weights stored in that type, activations
    rounded to it, float32 accumulation); against onnxruntime's fp32 within the stated tolerance (softmax
    outputs; f16 keeps 11 significant bits, bf16 8)."""
    model, feeds = small_model
    options = CompileOptions(precision=precision)
    program = lower(model, options)
    image = _gfx1100(program, options)
    launcher = RDNA3Launcher(emulated_hip, image.code)
    emulated_hip.set_launcher(launcher)
    with svodrt.load(gpu_bundle(program, [image]), device="hip:0", graph=False) as m:
        got = m.run(feeds)
    assert not launcher.errors, launcher.errors[0]
    ran = {ins.name for k in launcher.emulator.code.kernels.values() for _, ins, _ in k.decoded.values()}
    assert instruction in ran
    for (name, g), w in zip(got.items(), reference(model, feeds), strict=True):
        err = float(np.abs(g - w).max())
        assert 0.0 < err <= tolerance, (name, err)


@OBJDUMP
def test_decoder_agrees_with_llvm_objdump(wmma_code):
    assert mismatches(wmma_code[1]) == []  # and every model's code object, in _gfx1100


@pytest.fixture(scope="module")
def wmma_code(llvm_workers):
    g = WmmaGemm(32, 48, 64)
    return g, compile_wmma_gemm(g, GpuTarget("gfx1100"), llvm_workers)


def _run_wmma(g: WmmaGemm, code: bytes, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> Emulator:
    memory = Memory()
    pointers = [struct.pack("<Q", memory.add(x.reshape(-1).view(np.uint8))) for x in (a, b, c)]
    emulator = Emulator(CodeObject(code))
    emulator.dispatch(SYMBOL, (g.grid, 1, 1), (g.block, 1, 1), pointers, memory)
    return emulator


def test_wmma_gemm_matches_numpy(wmma_code):
    g, code = wmma_code
    rng = np.random.default_rng(0)
    a = rng.standard_normal((g.m, g.k)).astype(np.float16)
    b = rng.standard_normal((g.k, g.n)).astype(np.float16)
    c = np.full((g.m, g.n), np.nan, np.float32)  # every element must be written
    emulator = _run_wmma(g, code, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float32) @ b.astype(np.float32), rtol=1e-3, atol=1e-4)
    assert "v_wmma_f32_16x16x16_f16" in {ins.name for _, ins, _ in emulator.code.kernels[SYMBOL].decoded.values()}


def test_access_outside_device_memory_fails_loudly(wmma_code):
    g, code = wmma_code
    a, b = np.zeros((g.m, g.k), np.float16), np.zeros((g.k, g.n), np.float16)
    too_small = np.zeros(g.m * g.n - 1, np.float32)
    with pytest.raises(MemoryFault, match=r"by global_store_b32 .* at PC 0x[0-9a-f]+ is outside device memory"):
        _run_wmma(g, code, a, b, too_small)


def test_wmma_gemm_refuses_what_it_cannot_do(llvm_workers):
    with pytest.raises(CodegenError, match="multiple of 16"):
        compile_wmma_gemm(WmmaGemm(20, 16, 16), GpuTarget("gfx1100"), llvm_workers)
    with pytest.raises(CodegenError, match="gfx942 has no gfx11 WMMA"):
        compile_wmma_gemm(WmmaGemm(16, 16, 16), GpuTarget("gfx942"), llvm_workers)


def test_unknown_instruction_fails_loudly():
    code = struct.pack("<I", 0xBE800000 | (0x7F << 8))  # SOP1 opcode 0x7f: not one our kernels use
    with pytest.raises(UnknownInstruction, match=r"SOP1 opcode 0x7f .* at PC 0x0"):
        decode(code, 0)


@pytest.mark.gpu_sweep
@pytest.mark.parametrize("name", ["squeezenet", "shufflenet"])
def test_light_model_runs_in_the_emulator(emulated_hip, name):
    model = random_weight_variant(name)
    feeds = dummy_inputs(model)
    program = lower(model)
    image = _gfx1100(program)
    got = run_in_emulator(emulated_hip, gpu_bundle(program, [image]), image.code, feeds)
    assert_close(got, reference(model, feeds))


@pytest.mark.gpu_sweep
@pytest.mark.skipif(not GPT2.is_dir(), reason=f"no {GPT2}")
def test_gpt2_runs_in_the_emulator(emulated_hip):
    import onnx

    model = onnx.load(GPT2 / "model.onnx")
    ids = np.load(GPT2 / "inputs.npz")["input_ids"][:, :GPT2_SEQ]
    options = CompileOptions(dims={"batch": 1, "seq": GPT2_SEQ})
    program = lower(model, options)
    image = _gfx1100(program, options)
    got = run_in_emulator(emulated_hip, gpu_bundle(program, [image]), image.code, {"input_ids": ids})
    assert_close(got, reference(model, {"input_ids": ids}))
