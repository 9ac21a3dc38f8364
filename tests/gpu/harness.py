"""Running svodrt's GPU path here, without a GPU.

- A stand-in driver library (stub_driver.c, built with the C compiler on the machine or zig cc)
  exports the CUDA driver API and HIP module API functions svodrt calls, on host memory; svodrt
  opens it instead of libcuda.so.1 / libamdhip64.so (the library list is patched).
- The kernels it is asked to launch run as their CPU emulation: svodc compiles the same kernel
  statements with the "emulate" backend (svodc/codegen/gpu_emit.py) for x86-64, and the launcher
  callback runs the emulated kernel named by the launch on the launch's own argument array.

So svodrt's real GPU code (variant choice, uploads, argument arrays, launch order, graph capture,
copies back) computes real outputs that tests compare with onnxruntime; what is not exercised is the
GPU backends' machine code (gfx1100's is, by the RDNA3 emulator: tests/gpu/rdna3/) and the real drivers.
"""

from __future__ import annotations

import ctypes
import hashlib
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent
LAUNCHER = ctypes.CFUNCTYPE(None, ctypes.c_char_p, *[ctypes.c_uint] * 6, ctypes.POINTER(ctypes.c_void_p))
EMULATED = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
EM_CUDA = 190


def c_compiler() -> list[str] | None:
    """A C compiler: cc/gcc/clang on PATH, else zig's (the ziglang package, in the gpu and dev extras)."""
    for name in ("cc", "gcc", "clang"):
        if shutil.which(name):
            return [name]
    try:
        import ziglang  # noqa: F401
    except ImportError:
        return None
    return [sys.executable, "-m", "ziglang", "cc"]


def build_stub(folder: Path) -> Path:
    cc = c_compiler()
    assert cc is not None, "no C compiler (cc, gcc, clang or the ziglang package)"
    out = folder / "libsvodstub.so"
    subprocess.run([*cc, "-O1", "-shared", "-fPIC", "-o", str(out), str(HERE / "stub_driver.c")], check=True,
                   capture_output=True, timeout=300)
    return out


class StubDriver:
    """The stub library, loaded once per test process, as svodrt will load it."""

    def __init__(self, path: Path):
        self.path = path
        self.lib = ctypes.CDLL(str(path))
        self.lib.svod_stub_log.restype = ctypes.c_char_p
        self.lib.svod_stub_owns.argtypes = [ctypes.c_uint64, ctypes.c_size_t]
        self._launcher = None

    def log(self) -> list[str]:
        return self.lib.svod_stub_log().decode().splitlines()

    def clear(self) -> None:
        self.lib.svod_stub_clear_log()

    def set_launcher(self, fn) -> None:
        self._launcher = LAUNCHER(fn) if fn is not None else None  # kept alive while registered
        self.lib.svod_stub_set_launcher(self._launcher)

    def live_allocations(self) -> int:
        return self.lib.svod_stub_live_allocations()


@dataclass
class Emulation:
    """The CPU emulation of a program's GPU kernels, mapped executable, and what its launches must be."""

    program: object  # svodc Program
    image: object  # svodc CodeImage
    launches: list
    errors: list[str] = field(default_factory=list)
    launched: list[str] = field(default_factory=list)

    def __post_init__(self):
        from svodrt.memory import map_code

        data = self.image.data
        self.mapping = map_code(data, tuple(self.image.fixups), hashlib.sha256(data).digest(), "emulated kernels")
        self.by_symbol = {x.symbol: x for x in self.launches}

    def blocks(self, x, params) -> int:
        """The blocks launch x must run: its grid, scaled by the dims it lists (read from the `dims` argument)."""
        from svodrt.abi import DIM_SIZE
        from svodrt_gpu.abi import launch_blocks

        if not x.dims:
            return x.grid
        dims = ctypes.c_uint64.from_address(params[len(self.program.kernels[x.kernel].params)]).value
        values = [ctypes.c_int64.from_address(dims + DIM_SIZE * slot).value for slot, _ in x.dims]
        return launch_blocks(x.grid, int(np.prod(values)), int(np.prod([hi for _, hi in x.dims])))

    def launcher(self, driver: StubDriver):
        def launch(symbol: bytes, gx, gy, gz, bx, by, bz, params) -> None:
            name = symbol.decode()
            self.launched.append(name)
            x = self.by_symbol.get(name)
            if x is None or (gx, gy, gz, bx, by, bz) != (self.blocks(x, params), 1, 1, x.block, 1, 1):
                self.errors.append(f"{name}: grid {gx, gy, gz} block {bx, by, bz} is not the launch {x}")
                return
            for i, buf in enumerate(self.program.kernels[x.kernel].params):
                ptr = ctypes.c_uint64.from_address(params[i]).value
                if not driver.lib.svod_stub_owns(ptr, max(buf.nbytes, 1)):
                    self.errors.append(f"{name}: argument {i} ({buf}) at {ptr:#x} is not inside device memory")
                    return
            EMULATED(self.mapping.address + self.image.symbols[name])(ctypes.cast(params, ctypes.c_void_p).value)

        return launch


def lower(model, options=None, policy=None):
    """The Program svodc.compile makes of an ONNX model for a bundle with GPU variants (its policy:
    svodc.api.bundle_policy; every GPU target gets the same one), or under `policy` instead."""
    from svodc.api import bundle_policy
    from svodc.frontend.importer import import_model, load_model
    from svodc.gpu_target import parse_targets
    from svodc.options import CompileOptions
    from svodc.passes.pipeline import build_program

    options = options or CompileOptions()
    policy = policy or bundle_policy(parse_targets("gfx1100"), options)
    return build_program(import_model(load_model(model), options), options, policy)


def emulate(model, options=None, program=None, workers=None) -> Emulation:
    """The CPU emulation of the GPU kernels of a model (or of its already lowered program); LLVM runs
    on `workers` (a WorkerPool) when given."""
    from svodc.codegen.gpu_compile import compile_gpu_emulation
    from svodc.options import CompileOptions
    from svodc.target import parse_target

    options = options or CompileOptions()
    program = program or lower(model, options)
    image, launches = compile_gpu_emulation(program, parse_target("x86_64-linux-gnu:x86-64")[0], options, workers)
    return Emulation(program, image, launches)


def gpu_bundle(program, images) -> bytes:
    """A GPU-only bundle of a lowered program and its compiled GPU images."""
    from svodc.bundle import write_bundle

    return write_bundle(program, [], "0" * 64, None, images)


def run_on_stub(stub: StubDriver, bundle: bytes, emu: Emulation, feeds: dict, device: str) -> dict[str, np.ndarray]:
    """Load a GPU bundle on the stand-in driver and run it, its kernels emulated."""
    import svodrt

    emu.errors.clear()
    stub.set_launcher(emu.launcher(stub))
    with svodrt.load(bundle, device=device) as m:
        out = m.run(feeds)
    assert not emu.errors, emu.errors
    assert emu.launched, "no kernel ran"
    return out


def assert_close(got: dict[str, np.ndarray], want: list[np.ndarray]) -> None:
    for (name, g), w in zip(got.items(), want, strict=True):
        scale = float(np.abs(w).max()) if w.size else 0.0
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5 * max(scale, 1.0), err_msg=name)


def _elf_header(data: bytes) -> tuple[int, int]:
    assert data[:4] == b"\x7fELF"
    return struct.unpack_from("<HH", data, 16)


def check_code_objects(program, images) -> None:
    """What acceptance asks of every image: PTX that ptxas assembles (a cubin) with an entry per launch;
    AMD code objects that are ET_DYN AMDGPU HSA v5 objects whose metadata note lists every kernel with
    its .kd symbol and one 8-byte pointer argument per buffer of its kernel."""
    from svodc.codegen import gpu_tools
    from svodc.codegen.gpu_compile import plan_statements
    from svodc.ir.ops import Ops

    statements = plan_statements(program)
    for img in images:
        assert [x.symbol for x in img.launches] == [s.launch.symbol for s in statements]
        if img.target.kind == "cuda":
            ptx = img.code.decode().rstrip("\0")
            assert img.code.endswith(b"\0") and f".target {img.target.cpu}" in ptx
            for s in statements:
                assert f".entry {s.launch.symbol}(" in ptx
            gemms = sum(1 for s in statements if s.stmt.op is Ops.GEMM)
            assert ptx.count("bar.sync") >= 2 * gemms, "two barriers per k step of every GEMM kernel"
            if gpu_tools.find_ptxas() is None:
                assert img.cubin is None
                continue
            assert _elf_header(img.cubin) == (2, EM_CUDA)  # ET_EXEC cubin for the GPU
            continue
        info = gpu_tools.amd_metadata(img.code)
        assert (info["type"], info["machine"], info["osabi"], info["abi_version"]) == (3, 224, 64, 3)
        md = info["metadata"]
        assert md["amdhsa.target"].endswith(f"--{img.target.cpu}")
        kernels = {k[".name"]: k for k in md["amdhsa.kernels"]}
        assert set(kernels) == {s.launch.symbol for s in statements}
        for s in statements:
            k = kernels[s.launch.symbol]
            assert k[".symbol"] == f"{s.launch.symbol}.kd"
            explicit = [a for a in k[".args"] if not a[".value_kind"].startswith("hidden_")]
            assert [(a[".offset"], a[".size"], a[".value_kind"]) for a in explicit] == \
                [(8 * i, 8, "global_buffer") for i in range(len(program.kernels[s.launch.kernel].params))]
            assert k[".max_flat_workgroup_size"] >= s.launch.block
            assert k[".private_segment_fixed_size"] == 0, "accumulators live in registers, not scratch"
