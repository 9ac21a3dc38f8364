"""Cross targets without an emulator: target strings, feature sets, code for every architecture that
links with no undefined symbol, big-endian bundles, host feature detection, float16 without
hardware conversions, and the runtime's refusal of bundles for other architectures.

aarch64 and riscv64 code also runs here, in-process under unicorn (tests/cross/unicorn_run.py); all
architectures with their vector extensions run under qemu-user in tests/test_cross_emulated.py
(`make test-cross`)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import svodc
import svodrt
from svodc.arches import ARCHES
from svodc.errors import TargetError
from svodc.target import parse_target
from svodrt.bundle import parse_bundle
from svodrt.features import FEATURES
from svodrt.format import FORMAT_MINOR
from svodrt.host import detect_host, features_from_hwcap, features_from_riscv_isa
from tests.bundle_tools import manifest_of, repack
from tests.cross.transformer import transformer_model
from tests.cross.unicorn_run import run_unicorn
from tests.onnx_util import make_model, reference

# One variant per architecture at its floor and one with its vector extension, compiled and linked.
VARIANTS = ["x86_64", "aarch64", "aarch64:neoverse-v1", "aarch64:generic+sve2", "riscv64", "riscv64:rv64gc+v",
            "riscv64:rva23u64+zvfh", "ppc64le", "ppc64le:pwr9", "ppc64le:pwr10", "s390x", "s390x:z15", "s390x:z16"]


def test_target_strings():
    fat = parse_target("x86_64-linux-gnu:x86-64-v3,x86-64,aarch64:neoverse-n1,generic+dotprod")
    assert [t.describe() for t in fat] == ["x86_64:x86-64-v3", "x86_64:x86-64", "aarch64:neoverse-n1",
                                           "aarch64:generic+dotprod"]
    assert fat[3].features == ("neon", "dotprod")
    assert [t.describe() for t in parse_target("x86_64,aarch64")] == ["x86_64:x86-64", "aarch64:generic"]
    assert [t.describe() for t in parse_target("riscv64, ppc64le:pwr9")] == ["riscv64:rv64gc", "ppc64le:pwr9"]
    assert parse_target("riscv64:rv64gc+v")[0].features == ("m", "a", "f", "d", "c", "v")
    # a feature brings what it needs: otherwise LLVM's "-fullfp16" after "+sve" would turn SVE off again
    sve2 = parse_target("aarch64:generic+sve2")[0]
    assert set(sve2.features) == {"neon", "fp16", "sve", "sve2"}
    assert "+sve2" in sve2.llvm_features and "+fullfp16" in sve2.llvm_features
    assert "-outline-atomics" in sve2.llvm_features
    z = parse_target("s390x:z15")[0]
    assert (z.llvm_cpu, z.features, z.byte_order) == ("z15", ("vector", "vxe", "vxe2"), "big")
    assert parse_target("ppc64le:power10")[0].llvm_cpu == "pwr10"
    rv = parse_target("riscv64")[0]
    assert (rv.codemodel, rv.abiname) == ("medium", "lp64d") and "-relax" in rv.llvm_features


@pytest.mark.parametrize("spec,message", [
    ("aarch64:cortex-x9", "unknown aarch64 CPU 'cortex-x9'"),
    ("riscv64:rv64gc+q", r"unknown riscv64 feature \['q'\]"),
    ("x86_64,s390x", "mixes little-endian .* and big-endian"),
    ("mips64", "unknown target 'mips64'"),
    ("aarch64-apple-darwin", "only Linux targets"),
    ("aarch64,aarch64:generic", "names the variant aarch64:generic twice"),
])
def test_bad_target_strings(spec, message):
    with pytest.raises(TargetError, match=message):
        parse_target(spec)


def test_every_cpu_name_gives_a_closed_feature_set():
    for arch, spec in ARCHES.items():
        for cpu in spec.cpus:
            t = parse_target(f"{arch}:{cpu}")[0]
            assert set(spec.closure(set(t.features))) == set(t.features), (arch, cpu)
            assert set(t.features) <= {f.name for f in FEATURES[arch]}


@pytest.fixture(scope="module")
def tiny_model():
    r = np.random.default_rng(3)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Tanh", ["m"], ["t"]),
             helper.make_node("Softmax", ["t"], ["y"], axis=-1)]
    return make_model(nodes, {"x": (np.float32, [4, 16])}, ["y"], {"w": r.standard_normal((16, 8)).astype(np.float32)})


@pytest.mark.parametrize("spec", VARIANTS)
def test_code_for_every_architecture_links_self_contained(spec, tiny_model):
    """Compiling is linking: an undefined symbol (a libcall) or an unknown relocation fails here."""
    bundle = parse_bundle(svodc.compile(tiny_model, target=spec))
    (v,) = bundle.variants
    assert v.arch == spec.split(":")[0] and v.section.length > 0


def test_float16_everywhere_links():
    """f16<->f32 would be compiler-rt calls on x86-64, rv64gc, POWER8 and s390x: they are legalized, so
    every architecture links, and the code computes float16 results where this machine can run it
    (natively on x86-64, under unicorn for aarch64 and rv64gc)."""
    m = make_model([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                    helper.make_node("Mul", ["h", "h"], ["y"])], {"x": (np.float32, [8])}, ["y"])
    x = np.linspace(-300, 300, 8, dtype=np.float32)
    with np.errstate(over="ignore"):  # 300 ** 2 overflows float16: inf
        want = x.astype(np.float16) * x.astype(np.float16)
    for spec in ("x86_64:x86-64", "riscv64", "ppc64le", "s390x", "aarch64"):
        data = svodc.compile(m, target=spec)
        (v,) = parse_bundle(data).variants
        assert v.arch == spec.split(":")[0] and v.section.length > 0
        if spec.startswith("x86_64"):
            with svodrt.load(data) as model:
                got = model.run({"x": x})["y"]
        elif spec in ("riscv64", "aarch64"):
            t = parse_target(spec)[0]
            got = run_unicorn(data, t.arch, set(t.features), {"x": x})["y"]
        else:
            continue
        np.testing.assert_array_equal(got, want, err_msg=spec)


def test_float16_conversions_are_exact_without_hardware():
    """All 65536 float16 patterns widen exactly, and float32 values narrow with round-to-nearest-even,
    overflow to inf and NaN kept, on baseline x86-64 (no F16C: the integer-op path)."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    r = np.random.default_rng(0)
    with np.errstate(invalid="ignore"):  # NaN patterns
        near = h.astype(np.float32) * np.float32(1 + 2.0 ** -12)
    f = np.concatenate([near,
                        np.array([65504, 65519.99, 65520, 1e6, np.inf, np.nan, 2.0 ** -25, 1.5 * 2.0 ** -24, -0.0],
                                 np.float32),
                        (r.standard_normal(4000) * np.exp(r.uniform(-20, 12, 4000))).astype(np.float32)])
    m = make_model([helper.make_node("Cast", ["h"], ["hf"], to=TensorProto.FLOAT),
                    helper.make_node("Cast", ["f"], ["fh"], to=TensorProto.FLOAT16),
                    helper.make_node("Add", ["h", "h2"], ["s"])],
                   {"h": (np.float16, [h.size]), "f": (np.float32, [f.size]), "h2": (np.float16, [h.size])},
                   ["hf", "fh", "s"])
    h2 = r.permutation(h)
    with np.errstate(all="ignore"), svodrt.load(svodc.compile(m, target="x86_64:x86-64")) as model:
        got = model.run({"h": h, "f": f, "h2": h2})
        want = {"hf": h.astype(np.float32), "fh": f.astype(np.float16),
                "s": (h.astype(np.float32) + h2.astype(np.float32)).astype(np.float16)}
    for name, w in want.items():
        g = got[name]
        bits = np.uint16 if w.dtype == np.float16 else np.uint32
        same = (g.view(bits) == w.view(bits)) | (np.isnan(g) & np.isnan(w))
        assert same.all(), (name, np.flatnonzero(~same)[:5])


def test_big_endian_bundle_holds_big_endian_weights(tiny_model):
    w = np.frombuffer(tiny_model.graph.initializer[0].raw_data, "<f4")
    for spec, order in (("s390x:z14", "big"), ("aarch64", "little")):
        data = svodc.compile(tiny_model, target=spec)
        b = parse_bundle(data)
        assert b.manifest["byte_order"] == order and (b.header.major, b.header.minor) == (1, FORMAT_MINOR)
        (buf,) = [x for x in b.manifest["buffers"] if x["kind"] == "weight"]
        start = b.weights.offset + buf["offset"]
        stored = np.frombuffer(data[start: start + w.nbytes], ">f4" if order == "big" else "<f4")
        np.testing.assert_array_equal(stored, w)


def _with_manifest(data: bytes, change) -> bytes:
    """The bundle with its manifest changed by `change(manifest)`, header and digest made consistent."""
    m = manifest_of(data)
    change(m)
    return repack(data, m)


def test_runtime_refuses_data_in_the_wrong_byte_order(tiny_model):
    data = svodc.compile(tiny_model, target="aarch64")
    with pytest.raises(svodrt.BundleFormatError, match="variants.0. is for aarch64, whose data is little-endian"):
        svodrt.load(_with_manifest(data, lambda m: m.update(byte_order="big")))
    with pytest.raises(svodrt.BundleFormatError, match="byte_order 'pdp' must be 'little' or 'big'"):
        svodrt.load(_with_manifest(data, lambda m: m.update(byte_order="pdp")))


def test_runtime_refuses_a_bundle_without_code_for_its_architecture(tiny_model):
    data = svodc.compile(tiny_model, target="aarch64:neoverse-n1,generic,riscv64")
    with pytest.raises(svodrt.UnsupportedHostError,
                       match="no code for this x86_64 host; it has aarch64:neoverse-n1, aarch64:generic, "
                             "riscv64:rv64gc"):
        svodrt.load(data)


def test_fat_bundle_runs_natively(tiny_model):
    x = np.random.default_rng(0).standard_normal((4, 16)).astype(np.float32)
    with svodrt.load(svodc.compile(tiny_model, target="x86_64")) as m:
        want = m.run({"x": x})["y"]
    with svodrt.load(svodc.compile(tiny_model, target="aarch64,x86_64")) as m:
        assert m.variant.arch == "x86_64"
        np.testing.assert_array_equal(m.run({"x": x})["y"], want)


def test_host_features_from_hwcap_and_isa_strings():
    hwcap = 1 << 1 | 1 << 8 | 1 << 10 | 1 << 20 | 1 << 22  # asimd atomics asimdhp asimddp sve
    assert features_from_hwcap("aarch64", hwcap, 1 << 1 | 1 << 13) == {"neon", "lse", "fp16", "dotprod", "sve",
                                                                       "sve2", "i8mm"}
    assert features_from_hwcap("ppc64le", 0, 0x80000000 | 0x00800000) == {"power8", "power9"}
    assert features_from_hwcap("s390x", 2048 | 8192 | 32768, 0) == {"vector", "vxe", "vxe2"}
    harts = ["rv64imafdcv_zicsr_zifencei_zihintpause_zba_zbb_zbs_zfh_zvfh", "rv64imafdc_zicsr_zba_zbb"]
    assert features_from_riscv_isa(harts) == {"m", "a", "f", "d", "c", "zba", "zbb"}
    assert features_from_riscv_isa(["rv64gcv"]) == {"m", "a", "f", "d", "c", "v"}
    host = detect_host()
    assert host.arch == "x86_64" and host.features <= {f.name for f in FEATURES["x86_64"]}


@pytest.mark.parametrize("spec", ["aarch64", "riscv64"])
def test_a_bundle_with_bounded_dims_runs_under_unicorn_at_two_sizes(spec):
    """Bounded dims (format 1.5) on another architecture: the `dims` array in the entry ABI, run-time
    loop bounds and GEMM tiles, the same bundle at two batch sizes."""
    from tests.test_dynamic import _cnn, _feeds

    t = parse_target(spec)[0]
    model = _cnn()
    bundle = svodc.compile(model, target=spec, dims={"N": (1, 9)})
    for n in (2, 9):
        feeds = _feeds(n)
        got = run_unicorn(bundle, t.arch, set(t.features), feeds)
        for (name, g), w in zip(got.items(), reference(model, feeds), strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()), err_msg=f"{spec} {name} {n}")


@pytest.mark.parametrize("spec", ["aarch64", "aarch64:cortex-a76", "riscv64"])  # unicorn lacks Zba/Zbb, SVE, RVV
def test_cross_code_runs_under_unicorn(spec, small_model):
    """The real bundle bytes, laid out as svodrt does, executed on an emulated aarch64/riscv64 CPU."""
    t = parse_target(spec)[0]
    for model, feeds in (small_model, transformer_model()):
        want = reference(model, feeds)
        got = run_unicorn(svodc.compile(model, target=spec), t.arch, set(t.features), feeds)
        for (name, g), w in zip(got.items(), want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-4 * float(np.abs(w).max()), err_msg=f"{spec} {name}")
