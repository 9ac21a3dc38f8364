"""The onnx package's 9 light models for GPUs (random-weight variants, see tests/light_models.py).

Each compiles for gfx942, gfx1100, sm_90 and sm_80: every code object is checked (PTX assembled by
ptxas, AMD ET_DYN HSA v5 objects whose metadata lists every kernel, see check_code_objects), then
the bundle runs through svodrt's CUDA and HIP paths on the stand-in driver, its kernels emulated on
this CPU, against onnxruntime. `make test` runs SUBSET so, and compiles and checks the other seven;
`make test-gpu` runs all nine (~10 min here).
"""

from __future__ import annotations

import pytest

from svodc.codegen.gpu_compile import compile_gpu_programs
from svodc.gpu_target import parse_targets
from svodc.options import CompileOptions
from tests.gpu.harness import assert_close, check_code_objects, emulate, gpu_bundle, lower, run_on_stub
from tests.light_models import LIGHT_MODELS, dummy_inputs, random_weight_variant
from tests.onnx_util import reference

# squeezenet: convolutions as GEMMs with packed weights, concatenations, pools, a global average;
# shufflenet: grouped convolutions, channel shuffles (transposes through reshapes).
SUBSET = ["squeezenet", "shufflenet"]


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if n in SUBSET else pytest.mark.gpu_sweep)
                                  for n in LIGHT_MODELS])
def test_light_model_on_gpu_targets(stub, name, llvm_workers):
    model = random_weight_variant(name)
    feeds = dummy_inputs(model)
    program = lower(model)
    images = compile_gpu_programs(program, parse_targets("gfx942,gfx1100,sm_90,sm_80"), CompileOptions(), llvm_workers)
    check_code_objects(program, images)
    bundle = gpu_bundle(program, images)
    emu = emulate(model, program=program, workers=llvm_workers)
    want = reference(model, feeds)
    for device in ("cuda:0", "hip:0"):
        assert_close(run_on_stub(stub, bundle, emu, feeds, device), want)


@pytest.mark.parametrize("name", [n for n in LIGHT_MODELS if n not in SUBSET])
def test_light_model_compiles_for_gpu_targets(name, llvm_workers):
    """The light models make test does not run end to end: compiled for gfx942, gfx1100 and sm_90 and
    every code object checked (ptxas, ET_DYN HSA v5 with every kernel's .kd and argument sizes), so
    `make test` covers all nine (about 70 s for these seven here)."""
    program = lower(random_weight_variant(name))
    images = compile_gpu_programs(program, parse_targets("gfx942,gfx1100,sm_90"), CompileOptions(), llvm_workers)
    check_code_objects(program, images)
