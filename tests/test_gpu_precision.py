"""--precision f16|bf16 (issue 16 item 3): GEMM weights stored in the chosen type, float32 accumulation, inputs
and outputs in the model's dtypes; the error against fp32 measured at compile time (printed, recorded in the
manifest's options, covered by the test vectors' tolerance). GPU targets only: CPU variants are refused."""

from __future__ import annotations

import numpy as np
import pytest

import svodc
from svodc.errors import PrecisionError
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.options import PRECISIONS, CompileOptions
from tests.bundle_tools import manifest_of, vectors_of
from tests.gpu.harness import emulate, gpu_bundle, lower, run_on_stub
from tests.onnx_util import reference

# Weights rounded to float16 (11 significant bits) or bfloat16 (8) in a small CNN whose outputs are
# softmax probabilities: the error against onnxruntime's fp32 stays far below these.
TOLERANCE = {"f16": 2e-3, "bf16": 2e-2}


@pytest.mark.parametrize("precision", ["f16", "bf16"])
def test_gpu_bundle_stores_reduced_weights_and_matches_fp32_within_tolerance(stub, small_model, precision,
                                                                            llvm_workers):
    from svodc.codegen.gpu_compile import compile_gpu_programs
    from svodc.gpu_target import parse_targets

    model, feeds = small_model
    options = CompileOptions(precision=precision)
    program = lower(model, options)
    want_dtype = getattr(dtypes, PRECISIONS[precision])
    gemms = [n for k in program.kernels for n in k.ast.toposort() if n.op is Ops.GEMM]
    packed = {x.dtype.base for g in gemms for x, op in zip(g.src[:2], (g.arg.a, g.arg.b), strict=True) if op.packed}
    assert gemms and packed == {want_dtype}
    images = compile_gpu_programs(program, parse_targets("sm_90,gfx942"), options, llvm_workers)
    emu = emulate(model, options, program=program, workers=llvm_workers)
    bundle = gpu_bundle(program, images)
    want = reference(model, feeds)
    for device in ("cuda:0", "hip:0"):
        got = run_on_stub(stub, bundle, emu, feeds, device)
        for (name, g), w in zip(got.items(), want, strict=True):
            assert g.dtype == w.dtype
            err = float(np.abs(g - w).max())
            assert err <= TOLERANCE[precision], (name, device, err)
            assert err > 0.0, "the weights were rounded: fp32 outputs cannot come out exactly"


def test_the_error_against_fp32_is_measured_recorded_and_verified_on_the_device(stub, small_model, llvm_workers):
    """The manifest's options hold the measured error; the test vectors (fp32's outputs) accept 4x it, and
    `svodrt verify` on the (stand-in) device passes them."""
    from svodrt_tools.verify import verify

    model, _ = small_model
    said = []
    bundle = svodc.compile(model, target="sm_90", precision="f16", test_vectors=True, progress=said.append)
    m = manifest_of(bundle)
    err = m["options"]["precision_max_error"]
    assert m["options"]["precision"] == "f16" and 0.0 < err < TOLERANCE["f16"]
    assert any(line.startswith(f"precision f16: max error against fp32 {err:.3g}") for line in said), said
    assert all(t >= 4 * err for t in vectors_of(bundle)[0]["tolerance"])
    assert "precision" not in manifest_of(svodc.compile(model, target="sm_90"))["options"]
    emu = emulate(model, CompileOptions(precision="f16"), workers=llvm_workers)
    stub.set_launcher(emu.launcher(stub))
    report = verify(bundle, device="cuda:0")
    assert report.ok and not emu.errors, report.text()


def test_cpu_targets_refuse_a_reduced_precision(small_model):
    model, _ = small_model
    with pytest.raises(PrecisionError, match=r"--precision bf16: the CPU variants \(x86_64"):
        svodc.compile(model, target="x86_64-linux-gnu:x86-64,sm_90", precision="bf16")
    with pytest.raises(PrecisionError, match="precision 'fp8': expected one of fp32, f16, bf16"):
        svodc.compile(model, target="sm_90", precision="fp8")


def test_cli_flag_prints_the_error(small_model, tmp_path):
    from click.testing import CliRunner

    from svodc.cli import main

    model, _ = small_model
    path = tmp_path / "m.onnx"
    path.write_bytes(model.SerializeToString())
    r = CliRunner().invoke(main, ["compile", str(path), "--target", "sm_90", "--precision", "f16"])
    assert r.exit_code == 0, r.output
    assert "precision f16: max error against fp32" in r.output
    r = CliRunner().invoke(main, ["compile", str(path), "--precision", "f16"])
    assert r.exit_code != 0 and "take float32 GEMM weights only" in r.output
    choices = next(p for p in main.commands["compile"].params if p.name == "precision").type.choices
    assert list(choices) == list(PRECISIONS)
