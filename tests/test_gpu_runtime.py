"""svodrt's GPU path (svodrt_gpu/model.py) on a stand-in driver whose kernels run as
their CPU emulation (tests/gpu/harness.py): real outputs compared with onnxruntime, the call
sequence the driver sees, variant choice per device, and every error path that needs no GPU."""

from __future__ import annotations

import numpy as np
import pytest

import svodc
import svodrt
import svodrt_gpu.device
from svodrt.errors import BundleFormatError, DeviceError, UnsupportedHostError
from tests.gpu.harness import assert_close, emulate
from tests.onnx_util import reference


@pytest.fixture(scope="session")
def small_gpu(small_model, llvm_workers):
    """small_model's bundle for sm_90 and gfx942 (GPU only), and the emulation of its kernels."""
    model, feeds = small_model
    return svodc.compile(model, target="sm_90,gfx942"), emulate(model, workers=llvm_workers), model, feeds


@pytest.mark.parametrize("device", ["cuda:0", "hip:0"])
@pytest.mark.parametrize("graph", [True, False])
def test_gpu_path_computes_the_model(stub, small_gpu, device, graph):
    bundle, emu, model, feeds = small_gpu
    emu.errors.clear()
    stub.set_launcher(emu.launcher(stub))
    with svodrt.load(bundle, device=device, graph=graph) as m:
        assert m.variant.kind == device.split(":")[0]
        first = m.run(feeds)
        second = m.run(feeds)
    assert not emu.errors, emu.errors
    assert_close(first, reference(model, feeds))
    for k in first:
        np.testing.assert_array_equal(first[k], second[k])
    assert stub.live_allocations() == 0, "close() frees every device buffer"


def _manifest_launches(bundle: bytes, kind: str) -> list[str]:
    from svodrt.bundle import parse_bundle
    from svodrt_gpu.plan import gpu_variant

    b = parse_bundle(bundle)
    return [x.symbol for x in gpu_variant(b, next(v for v in b.variants if v.kind == kind)).launches]


def test_cuda_call_sequence(stub, small_gpu):
    """Weights go up once at load; a run copies the inputs in, replays the captured launch list in the
    manifest's order, copies the outputs back and waits for the stream."""
    bundle, emu, _, feeds = small_gpu
    stub.set_launcher(emu.launcher(stub))
    m = svodrt.load(bundle, device="cuda:0")
    loaded = stub.log()
    weights = m.bundle.weights_size
    symbols = _manifest_launches(bundle, "cuda")
    assert loaded[:3] == ["cuInit 0", "retain context 0", "load cubin"]
    assert loaded.count(f"htod {weights}") == 1
    assert [line.split()[1] for line in loaded if line.startswith("captured")] == symbols
    stub.clear()
    m.run(feeds)
    ran = stub.log()
    n_in = sum(x.nbytes for x in feeds.values())
    assert ran[0] == f"htod {n_in}" and ran[1] == f"graph launch {len(symbols)}"
    assert [line.split()[1] for line in ran if line.startswith("launch")] == symbols
    assert ran[-2:] == [f"dtoh {m.bundle.outputs[0].nbytes}", "sync"]
    m.close()
    assert stub.log()[-1] == "release context 0"
    assert stub.live_allocations() == 0


@pytest.mark.parametrize(("cc", "loads"), [(90, "load cubin"), (120, "load ptx sm_90"), (89, "load cubin"),
                                           (86, "load cubin"), (100, "load ptx sm_90")])
def test_cuda_variant_choice(stub, small_model, cc, loads, monkeypatch):
    """The cubin on its own architecture family, else the PTX (JIT) for newer GPUs; sm_80's cubin for
    8.x devices that sm_90 cannot serve."""
    model, _ = small_model
    bundle = _fat_cuda(model)
    monkeypatch.setenv("SVOD_STUB_CC", str(cc))
    with svodrt.load(bundle, device="cuda") as m:
        assert m.variant.cpu == ("sm_80" if cc < 90 else "sm_90")
    assert loads in stub.log()


_FAT: dict = {}


def _fat_cuda(model) -> bytes:
    if "b" not in _FAT:
        _FAT["b"] = svodc.compile(model, target="sm_90,sm_80")
    return _FAT["b"]


def test_cuda_device_too_old(stub, small_gpu, monkeypatch):
    monkeypatch.setenv("SVOD_STUB_CC", "75")
    with pytest.raises(UnsupportedHostError, match=r"cuda:0 \(stub device 0, compute capability 7\.5\): cuda:sm_90 "
                                                   r"\(needs compute capability 9\.0\); hip:gfx942 \(not a cuda"):
        svodrt.load(small_gpu[0], device="cuda:0")


def test_hip_takes_the_code_object_the_driver_accepts(stub, small_model, monkeypatch, llvm_workers):
    model, feeds = small_model
    bundle = svodc.compile(model, target="gfx942,gfx1100")
    monkeypatch.setenv("SVOD_STUB_MACH", "0x41")  # a gfx1100
    emu = emulate(model, workers=llvm_workers)
    stub.set_launcher(emu.launcher(stub))
    with svodrt.load(bundle, device="hip:0") as m:
        assert m.variant.cpu == "gfx1100"
        assert_close(m.run(feeds), reference(model, feeds))
    assert not emu.errors
    monkeypatch.setenv("SVOD_STUB_MACH", "0x30")
    with pytest.raises(UnsupportedHostError, match=r"hip:gfx942 \(hipModuleLoadData failed on hip:0: "
                                                   r"hipErrorNoBinaryForGpu \(209\)\); hip:gfx1100 \("):
        svodrt.load(bundle, device="hip:0")


@pytest.mark.parametrize("device", ["cuda:0", "hip:0"])
def test_driver_library_missing(small_gpu, device):
    """Without the driver library the error names the library and what to install."""
    import ctypes

    kind = device.split(":")[0]
    for name in svodrt_gpu.device.LIBRARIES[kind]:
        try:
            ctypes.CDLL(name)
            pytest.skip(f"this machine has the {kind} driver library {name}")
        except OSError:
            pass
    lib = "libcuda.so.1" if kind == "cuda" else "libamdhip64.so"
    with pytest.raises(DeviceError, match=rf"no (CUDA|HIP) driver: {lib}.* not found; install"):
        svodrt.load(small_gpu[0], device=device)


@pytest.mark.parametrize(("env", "device", "message"), [
    ({"SVOD_STUB_DEVICES": "0"}, "cuda:0", r"cuda:0 does not exist: the CUDA driver reports 0 devices"),
    ({}, "hip:2", r"hip:2 does not exist: the HIP driver reports 1 device$"),
    ({"SVOD_STUB_FAIL": "cuInit"}, "cuda:0", r"cuInit failed on cuda:0: CUDA_ERROR_UNKNOWN \(999\)"),
    ({"SVOD_STUB_FAIL": "hipMalloc"}, "hip:0", r"hipMalloc failed on hip:0: hipErrorUnknown \(999\)"),
])
def test_device_errors(stub, small_gpu, monkeypatch, env, device, message):
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    with pytest.raises(DeviceError, match=message):
        svodrt.load(small_gpu[0], device=device)
    assert stub.live_allocations() == 0, "a failed load frees what it allocated"


def test_driver_refuses_the_code_object(stub, small_gpu, monkeypatch):
    monkeypatch.setenv("SVOD_STUB_FAIL", "cuModuleLoadData")
    with pytest.raises(UnsupportedHostError, match=r"cuda:sm_90 \(cuModuleLoadData failed on cuda:0: "):
        svodrt.load(small_gpu[0], device="cuda:0")


@pytest.mark.parametrize("section", ["gpu.cuda.sm_90.cubin", "gpu.hip.gfx942"])
def test_damaged_code_object_is_never_loaded(stub, small_gpu, section):
    from svodrt.bundle import parse_bundle

    bundle = bytearray(small_gpu[0])
    sec = next(s for s in parse_bundle(bytes(bundle)).sections if s.name == section)
    bundle[sec.offset + sec.length // 2] ^= 0x40
    with pytest.raises(BundleFormatError, match=rf"section '{section}' at offset {sec.offset} .*fails its sha256"):
        svodrt.load(bytes(bundle), device=section.split(".")[1])
    assert not any(line.startswith("load") for line in stub.log())


def test_without_graphs_where_capture_fails(stub, small_gpu, monkeypatch):
    bundle, emu, model, feeds = small_gpu
    monkeypatch.setenv("SVOD_STUB_FAIL", "cuStreamBeginCapture_v2")
    stub.set_launcher(emu.launcher(stub))
    with svodrt.load(bundle, device="cuda:0") as m:
        stub.clear()
        assert_close(m.run(feeds), reference(model, feeds))
        assert not any("graph" in line for line in stub.log())


def test_launch_failure_and_closed_model(stub, small_gpu, monkeypatch):
    from svodrt.errors import ModelClosedError

    bundle, _, _, feeds = small_gpu
    m = svodrt.load(bundle, device="hip:0", graph=False)
    monkeypatch.setenv("SVOD_STUB_FAIL", "hipModuleLaunchKernel")
    with pytest.raises(DeviceError, match=r"hipModuleLaunchKernel failed on hip:0"):
        m.run(feeds)
    m.close()
    with pytest.raises(ModelClosedError):
        m.run(feeds)


def test_cpu_load_of_a_gpu_only_bundle_says_which_device(small_gpu):
    with pytest.raises(UnsupportedHostError, match=r"cuda:sm_90 \(a cuda GPU variant: load with device='cuda:0'\)"):
        svodrt.load(small_gpu[0])


def _edit(bundle: bytes, fn) -> bytes:
    import copy

    from tests.bundle_tools import manifest_of, repack

    m = copy.deepcopy(manifest_of(bundle))
    fn(next(v for v in m["variants"] if v.get("kind") == "cuda"), m)
    return repack(bundle, m)


@pytest.mark.parametrize("edit,message", [
    (lambda v, m: v["launches"][0].update(kernel=99), r"variants\[0\]\.launches\[0\]: kernel 99 of \d+"),
    (lambda v, m: v["launches"][0].update(block=[2048, 1, 1]), r"launches\[0\]\.block\[0\]: = 2048 is out of range"),
    (lambda v, m: v["launches"][0].update(block=[64, 64, 1]), r"launches\[0\]: .* at most 1024 threads in all"),
    (lambda v, m: v["launches"][0].update(grid=[0, 1, 1]), r"3 positive grid sizes"),
    (lambda v, m: v["launches"][0].update(symbol="svod_k1_0"), r"variants\[0\]\.gpu_binding: does not match"),
    (lambda v, m: v["launches"].pop(), r"variants\[0\]\.gpu_binding: does not match"),
    (lambda v, m: v.update(cubin=0), r"variants\[0\]\.cubin: 0 is not a code section"),
    (lambda v, m: v.pop("gpu_binding"), r"variants\[0\]\.gpu_binding: is missing"),
    # the offsets are bound: the binding refuses the edit first (a rebound one: tests/test_weights_record.py)
    (lambda v, m: v.update(kernels=[0]), r"variants\[0\]\.binding: does not match"),
])
def test_gpu_manifest_edits_are_refused_by_name(small_gpu, edit, message):
    with pytest.raises(BundleFormatError, match=message):
        svodrt.load(_edit(small_gpu[0], edit), device="cuda:0")


def test_unknown_variant_kind_is_skipped_not_refused(small_model):
    """A kind from a later format (say "vulkan") does not stop a runtime from using the other variants."""
    model, feeds = small_model
    bundle = svodc.compile(model, target="x86_64,sm_90")
    newer = _edit(bundle, lambda v, m: v.update(kind="vulkan"))
    with svodrt.load(newer) as m:
        assert m.run(feeds)["y"].shape == (2, 10)
    with pytest.raises(UnsupportedHostError, match=r"variant kind 'vulkan' is unknown to this runtime"):
        svodrt.load(newer, variant=1)


FORMAT_1_0_COMMIT = "96fc5d7"  # main just before format 1.2: its svodrt is a format 1.0 runtime


def test_a_format_1_0_runtime_runs_the_cpu_variant_and_refuses_gpu_ones(small_model, tmp_path):
    """Compatibility promise of 1.2 (docs/bundle-format.md): an older runtime reads a fat CPU + GPU bundle
    and runs its CPU variant; a GPU-only bundle it refuses by architecture, with its usual message."""
    from tests.bundle_tools import run_old_runtime

    model, feeds = small_model
    (tmp_path / "fat.svod").write_bytes(svodc.compile(model, target="x86_64,sm_90,gfx942"))
    (tmp_path / "gpu.svod").write_bytes(svodc.compile(model, target="sm_90"))
    np.save(tmp_path / "x.npy", feeds["x"])
    out = run_old_runtime(FORMAT_1_0_COMMIT, 0, """
import numpy as np
with svodrt.load(sys.argv[1] + "/fat.svod") as m:
    np.save(sys.argv[1] + "/y.npy", m.run({"x": np.load(sys.argv[1] + "/x.npy")})["y"])
try:
    svodrt.load(sys.argv[1] + "/gpu.svod")
except svodrt.UnsupportedHostError as e:
    print(e)
""", tmp_path)
    assert "nvptx64:sm_90 (architecture nvptx64)" in out
    with svodrt.load(tmp_path / "fat.svod") as m:
        np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), m.run(feeds)["y"])


def test_verify_runs_the_test_vectors_on_the_device(stub, small_gpu):
    from svodrt_tools.verify import verify

    bundle, emu, _, _ = small_gpu
    emu.errors.clear()
    stub.set_launcher(emu.launcher(stub))
    report = verify(bundle, device="cuda:0")
    assert report.ok, report.text()
    lines = report.text().splitlines()
    assert any(line.startswith("ok    test vector 0 on cuda:sm_90: output 'y' max error") for line in lines)
    assert "skip  variant 1 hip:gfx942: cannot run on this host (not a cuda:0 variant)" in lines
    assert not emu.errors


def test_cli_finds_the_driver_by_its_library_name(stub_library, small_gpu, tmp_path):
    """`svodrt run --device cuda:0` in a fresh process that finds libcuda.so.1 on LD_LIBRARY_PATH (the
    stand-in, whose launches compute nothing here: this checks the lookup and the CLI, not numbers)."""
    import os
    import subprocess
    import sys

    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libcuda.so.1").symlink_to(stub_library.path)
    (tmp_path / "m.svod").write_bytes(small_gpu[0])
    np.save(tmp_path / "x.npy", small_gpu[3]["x"])
    cli = [os.path.join(os.path.dirname(sys.executable), "svodrt"), "run", str(tmp_path / "m.svod"),
           "--input", f"x={tmp_path / 'x.npy'}", "--device", "cuda:0"]
    env = {**os.environ, "LD_LIBRARY_PATH": str(tmp_path / "lib")}
    out = subprocess.run(cli, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "(cuda:0, cuda:sm_90)" in out.stderr and out.stdout.startswith("y: float32[2, 10]")
    env["LD_LIBRARY_PATH"] = str(tmp_path)
    out = subprocess.run([*cli[:-1], "hip:0"], capture_output=True, text=True, env=env, timeout=120)
    if out.returncode == 0:
        pytest.skip("this machine has a HIP driver")
    assert out.stderr.strip().startswith("svodrt: error: no HIP driver: libamdhip64.so"), out.stderr


@pytest.fixture(scope="module")
def bounded_gpu(llvm_workers):
    """A model with a bounded batch (tests/test_dynamic.py's: a conv GEMM with a run-time batch, pooling,
    a small Gemm, Softmax; two inputs sharing N) for sm_90 and gfx942, and its kernels' emulation."""
    from svodc.options import CompileOptions
    from tests.test_dynamic import _cnn

    model, options = _cnn(), CompileOptions(dims={"N": (1, 9)})
    return model, svodc.compile(model, target="sm_90,gfx942", options=options), emulate(model, options, workers=llvm_workers)


@pytest.mark.parametrize("device", ["cuda:0", "hip:0"])
def test_one_gpu_bundle_runs_two_batch_sizes(stub, bounded_gpu, device):
    """Against onnxruntime at N=2 and N=9 (the bound), one load; the launches that scale with N run fewer
    blocks at N=2 (the emulation checks each launch's block count against its dims)."""
    from tests.test_dynamic import _feeds

    model, bundle, emu = bounded_gpu
    emu.errors.clear()
    stub.set_launcher(emu.launcher(stub))
    blocks = {}
    with svodrt.load(bundle, device=device) as m:
        assert [str(t) for t in m.inputs] == ["x: float32[N=1..9, 3, 16, 16]", "b: float32[N=1..9, 10]"]
        for n in (2, 9):
            feeds = _feeds(n)
            stub.clear()
            got = m.run(feeds)
            want = reference(model, feeds)
            assert [g.shape for g in got.values()] == [w.shape for w in want]
            assert_close(got, want)
            blocks[n] = [int(line.split()[3]) for line in stub.log() if line.startswith("launch")]
    assert not emu.errors, emu.errors
    assert len(blocks[2]) == len(blocks[9]) and all(a <= b for a, b in zip(blocks[2], blocks[9], strict=True))
    assert sum(blocks[2]) < sum(blocks[9])
    assert stub.live_allocations() == 0
