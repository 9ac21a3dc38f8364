"""AMD code executed on its own ISA: svodrt's HIP path runs the gfx1100 code object in the bundle,
each kernel interpreted instruction by instruction by the RDNA3 emulator (tests/gpu/rdna3/), over
the stand-in driver's device memory, against onnxruntime. Also: the emulator's decoder agrees with
llvm-objdump on every instruction of our code objects, and unknown instructions fail loudly.

`make test` runs the small CNN (seconds); `make test-gpu` runs squeezenet, shufflenet and
gpt2_small_random (minutes each, see docs/architecture.md "GPU targets")."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from svodc.codegen.gpu_compile import compile_gpu_programs
from svodc.gpu_target import parse_targets
from svodc.options import CompileOptions
from tests.gpu.harness import assert_close, gpu_bundle, lower
from tests.gpu.rdna3.decode import UnknownInstruction, decode
from tests.gpu.rdna3.objdump import find_objdump, mismatches
from tests.gpu.rdna3.on_stub import run_in_emulator
from tests.light_models import dummy_inputs, random_weight_variant
from tests.onnx_util import reference

GPT2 = Path(__file__).resolve().parents[2] / "shared" / "models" / "gpt2_small_random"
GPT2_SEQ = 8  # tokens: the emulator runs about 10^5 instructions a second


def _gfx1100(program, options=None):
    return compile_gpu_programs(program, parse_targets("gfx1100"), options or CompileOptions())[0]


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
    model, feeds, program, image = small_gfx1100
    got = run_in_emulator(emulated_hip, gpu_bundle(program, [image]), image.code, feeds)
    assert_close(got, reference(model, feeds))


@pytest.mark.skipif(find_objdump() is None, reason="llvm-objdump (LLVM 17+) is not installed: the oracle")
def test_decoder_agrees_with_llvm_objdump(small_gfx1100):
    assert mismatches(small_gfx1100[3].code) == []


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
