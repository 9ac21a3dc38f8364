"""Cross code, executed: bundles for aarch64, riscv64, ppc64le and s390x run under qemu-user through
tests/cross/harness.c, which loads the code image exactly as svodrt does (tests/cross/emulate.py).

Models: the onnx package's squeezenet, shufflenet and resnet50 with their shipped inputs and
references (rtol 1e-3, atol 1e-5), their random-weight variants against onnxruntime run here on
x86_64 (logits too; atol 1e-4 * max|ref|), the transformer of ../shared/models (gpt2_small_random,
against its outputs.npz) and a small synthetic one (tests/cross/transformer.py).
Every architecture runs at its floor and with its vector extension (SVE, RVV, POWER10, z15).

Slow (minutes: emulated generic kernels), so it is its own tier: `make test-cross`, which installs
qemu-user and the cross compilers first. Without them these tests are skipped with the reason.
"""

from __future__ import annotations

import functools
import re
import subprocess
import tempfile

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import svodc
import svodrt
from svodc.target import parse_target
from svodrt.bundle import parse_bundle
from tests.cross.emulate import missing_tools, run_emulated
from tests.cross.transformer import transformer_model
from tests.light_models import dummy_inputs, model_path, random_weight_variant, reference_output
from tests.onnx_util import make_model, reference
from tests.test_models import MODELS as SHARED_MODELS

# (target, qemu -cpu): each emulated CPU has at least the variant's features.
FLOOR = [("aarch64", "cortex-a53"), ("riscv64", "rv64"), ("ppc64le:pwr9", "power9"), ("s390x:z14", "max")]
VECTOR = [("aarch64:neoverse-v1", "max"), ("riscv64:rva23u64", "rv64,v=true,vlen=256,vext_spec=v1.0,zba=true,"
                                                               "zbb=true,zbs=true"),
          ("ppc64le:pwr10", "power10"), ("s390x:z15", "max")]
LIGHT = ["squeezenet", "shufflenet", "resnet50"]


def _ids(cases: list[tuple[str, str]]) -> list[str]:
    return [t for t, _ in cases]


def _need(arch: str) -> None:
    missing = missing_tools(arch)
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: run `make test-cross` (installs qemu-user and the cross "
                    "compilers with apt)")


def emulate(bundle: bytes, spec: str, cpu: str, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    (t,) = parse_target(spec)
    _need(t.arch)
    return run_emulated(bundle, t.arch, set(t.features), feeds, cpu)


@functools.lru_cache(maxsize=4)  # resnet50 bundles are 100 MB
def _compiled(model_key: str, spec: str) -> bytes:
    model, feeds, _ = _models(model_key)
    return svodc.compile(model, target=spec, input_shapes={k: v.shape for k, v in feeds.items()})


@functools.lru_cache(maxsize=4)
def _models(key: str) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[np.ndarray]]:
    """(model, feeds, reference outputs) for "light:NAME", "random:NAME", "shared:NAME" (a model of
    ../shared/models with its inputs.npz and onnxruntime's outputs.npz) or "transformer"."""
    kind, _, name = key.partition(":")
    if kind == "shared":
        folder = SHARED_MODELS / name
        model = onnx.load(str(folder / "model.onnx"))
        with np.load(folder / "inputs.npz") as i, np.load(folder / "outputs.npz") as o:
            return model, {k: i[k] for k in i.files}, [o[out.name] for out in model.graph.output]
    if kind == "light":
        model = onnx.load(str(model_path(name)))
        return model, dummy_inputs(model), [reference_output(name)]
    model, feeds = transformer_model() if kind == "transformer" else (random_weight_variant(name), None)
    feeds = feeds if feeds is not None else dummy_inputs(model)
    return model, feeds, reference(model, feeds)


def _check(key: str, spec: str, cpu: str, light_tolerance: bool) -> None:
    _, feeds, want = _models(key)
    got = emulate(_compiled(key, spec), spec, cpu, feeds)
    for (name, g), w in zip(got.items(), want, strict=True):
        scale = float(np.abs(w).max())
        atol = 1e-5 if light_tolerance else 1e-4 * scale
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=atol, err_msg=f"{key} {spec} output {name}")


@pytest.mark.parametrize("spec,cpu", FLOOR, ids=_ids(FLOOR))
@pytest.mark.parametrize("name", LIGHT)
def test_light_model_shipped_reference(name, spec, cpu):
    _check(f"light:{name}", spec, cpu, light_tolerance=True)


@pytest.mark.parametrize("spec,cpu", FLOOR + VECTOR, ids=_ids(FLOOR + VECTOR))
@pytest.mark.parametrize("name", LIGHT)
def test_light_model_random_weights(name, spec, cpu):
    _check(f"random:{name}", spec, cpu, light_tolerance=False)


@pytest.mark.parametrize("spec,cpu", FLOOR + VECTOR, ids=_ids(FLOOR + VECTOR))
def test_transformer(spec, cpu):
    _check("transformer", spec, cpu, light_tolerance=False)


@pytest.mark.skipif(not (SHARED_MODELS / "gpt2_small_random" / "model.onnx").is_file(),
                    reason=f"no gpt2_small_random in {SHARED_MODELS}")
@pytest.mark.parametrize("spec,cpu", FLOOR + VECTOR, ids=_ids(FLOOR + VECTOR))
def test_gpt2_from_shared_models(spec, cpu):
    """The transformer of ../shared/models (GPT-2 architecture, random weights) against onnxruntime's
    outputs.npz, atol 1e-4 * max|ref|."""
    _check("shared:gpt2_small_random", spec, cpu, light_tolerance=False)


def test_fat_bundle_runs_natively_and_its_aarch64_variant_under_emulation():
    model, feeds, want = _models("random:squeezenet")
    fat = svodc.compile(model, target="x86_64,aarch64")
    with svodrt.load(fat) as m:
        native = m.run(feeds)
    emulated = emulate(fat, "aarch64", "cortex-a53", feeds)
    for (name, n), e, w in zip(native.items(), emulated.values(), want, strict=True):
        np.testing.assert_allclose(n, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()), err_msg=name)
        np.testing.assert_allclose(e, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()), err_msg=name)


@pytest.mark.parametrize("spec,cpu", [("riscv64", "rv64"), ("ppc64le:pwr8", "power8"), ("s390x:z13", "max")])
def test_float16_without_conversion_instructions(spec, cpu):
    """Integer-op float16 conversions (svodc/codegen/emulate.py), bit-exact, big-endian included."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    h2 = np.random.default_rng(0).permutation(h)
    m = make_model([helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
                    helper.make_node("Mul", ["h", "h2"], ["p"])],
                   {"h": (np.float16, [h.size]), "h2": (np.float16, [h.size])}, ["hf", "p"])
    got = emulate(svodc.compile(m, target=spec), spec, cpu, {"h": h, "h2": h2})
    with np.errstate(all="ignore"):
        want = {"hf": h.astype(np.float32), "p": (h.astype(np.float32) * h2.astype(np.float32)).astype(np.float16)}
    for name, w in want.items():
        bits = np.uint16 if w.dtype == np.float16 else np.uint32
        same = (got[name].view(bits) == w.view(bits)) | (np.isnan(got[name]) & np.isnan(w))
        assert same.all(), (spec, name, np.flatnonzero(~same)[:5])


def _code(bundle: bytes) -> bytes:
    """The kernels' machine code: the code section up to the entry function, which is linked after every
    kernel's module (codegen/compile.py) and before the read-only data, whose constants a scan for instruction
    encodings would read as instructions (one of squeezenet's riscv64 constants looks like an OP-V word)."""
    v = parse_bundle(bundle).variants[0]
    return bundle[v.section.offset: v.section.offset + v.entry]


def test_vector_variants_use_their_vector_instructions():
    """SVE and RVV are not only enabled but used (else the vector runs above would prove nothing)."""
    sve, neon = _compiled("random:squeezenet", "aarch64:neoverse-v1"), _compiled("random:squeezenet", "aarch64")
    _need("aarch64")

    def sve_instructions(bundle: bytes) -> int:
        with tempfile.NamedTemporaryFile(suffix=".bin") as f:
            f.write(_code(bundle))
            f.flush()
            out = subprocess.run(["aarch64-linux-gnu-objdump", "-D", "-b", "binary", "-maarch64", f.name],
                                 capture_output=True, text=True, check=True).stdout
        return len(re.findall(r"\bz\d+\.[bhsd]\b", out))  # SVE vector register operands

    assert sve_instructions(sve) > 50 and sve_instructions(neon) == 0

    def rvv_instructions(bundle: bytes) -> int:  # 32-bit words with major opcode OP-V (0x57)
        code = _code(bundle)
        count, i = 0, 0
        while i + 4 <= len(code):
            if code[i] & 3 != 3:  # a 16-bit compressed instruction
                i += 2
                continue
            count += code[i] & 0x7F == 0x57
            i += 4
        return count

    rvv = _compiled("random:squeezenet", "riscv64:rva23u64")
    assert rvv_instructions(rvv) > 50 and rvv_instructions(_compiled("random:squeezenet", "riscv64")) == 0



def _max_min_model() -> onnx.ModelProto:
    return make_model([helper.make_node("ReduceMax", ["x"], ["y"], axes=[1], keepdims=0),
                       helper.make_node("ReduceMin", ["x"], ["z"], axes=[1], keepdims=0)],
                      {"x": (np.float32, [64, 508])}, ["y", "z"])


@pytest.mark.parametrize("spec,cpu", [("x86_64", None), ("aarch64", "max"), ("riscv64:rva23u64", "rv64,v=true,vlen=256"),
                                      ("ppc64le", "power9"), ("s390x", "max")])
def test_max_min_reductions_propagate_nan(spec, cpu):
    """Float max/min reductions are llvm.maximum/minimum (vectorizable); every backend must expand
    them inline (no libcall: the link would fail) with numpy's NaN propagation."""
    x = np.random.default_rng(0).standard_normal((64, 508)).astype(np.float32)
    x[3, 100] = x[5, 0] = x[7, 507] = np.nan
    bundle = svodc.compile(_max_min_model(), target=spec)
    if cpu is None:
        with svodrt.load(bundle) as m:
            got = m.run({"x": x})
    else:
        got = emulate(bundle, spec, cpu, {"x": x})
    np.testing.assert_array_equal(got["y"], np.max(x, axis=1))
    np.testing.assert_array_equal(got["z"], np.min(x, axis=1))
