"""GpuModel: the CUDA and HIP executor on a Program, through the drivers' ctypes APIs (docs/architecture.md "GPU
targets"). The two APIs mirror each other: one table names each operation in both, only the image choice differs
(cuda_image). Every status is checked: a failure is a DeviceError naming the function and the driver's error name."""

from __future__ import annotations

import ctypes
import math
import os
import threading
from collections.abc import Mapping as MappingT
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

import numpy as np

from svodrt.abi import DIM_SIZE
from svodrt.bundle import Program, Section, Variant
from svodrt.errors import DeviceError, ModelClosedError, UnsupportedHostError
from svodrt.runner import Runner, real_output
from svodrt.trust import TrustSpec
from svodrt_gpu.abi import launch_blocks

LIBRARIES = {"cuda": ("libcuda.so.1", "libcuda.so"),
             "hip": ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so")}
_INSTALL = {"cuda": "install the NVIDIA driver (it provides libcuda.so.1)",
            "hip": "install ROCm's HIP runtime (libamdhip64.so), e.g. the rocm-hip-runtime package"}
_API = {"cuda": "CUDA", "hip": "HIP"}
# operation: (CUDA name, HIP name, argument types); every function returns a status (0: success)
_OPS = {
    "init": ("cuInit", "hipInit", [c_uint]),
    "count": ("cuDeviceGetCount", "hipGetDeviceCount", [POINTER(c_int)]),
    "name": ("cuDeviceGetName", "hipDeviceGetName", [c_char_p, c_int, c_int]),
    "malloc": ("cuMemAlloc_v2", "hipMalloc", [POINTER(c_uint64), c_size_t]),
    "free": ("cuMemFree_v2", "hipFree", [c_uint64]),
    "h2d": ("cuMemcpyHtoDAsync_v2", "hipMemcpyHtoDAsync", [c_uint64, c_void_p, c_size_t, c_void_p]),
    "d2h": ("cuMemcpyDtoHAsync_v2", "hipMemcpyDtoHAsync", [c_void_p, c_uint64, c_size_t, c_void_p]),
    "load": ("cuModuleLoadData", "hipModuleLoadData", [POINTER(c_void_p), c_char_p]),
    "unload": ("cuModuleUnload", "hipModuleUnload", [c_void_p]),
    "function": ("cuModuleGetFunction", "hipModuleGetFunction", [POINTER(c_void_p), c_void_p, c_char_p]),
    "launch": ("cuLaunchKernel", "hipModuleLaunchKernel", [c_void_p, *[c_uint] * 7, c_void_p, c_void_p, c_void_p]),
    "stream": ("cuStreamCreate", "hipStreamCreateWithFlags", [POINTER(c_void_p), c_uint]),
    "sync": ("cuStreamSynchronize", "hipStreamSynchronize", [c_void_p]),
    "stream_free": ("cuStreamDestroy_v2", "hipStreamDestroy", [c_void_p]),
    "capture": ("cuStreamBeginCapture_v2", "hipStreamBeginCapture", [c_void_p, c_int]),
    "end_capture": ("cuStreamEndCapture", "hipStreamEndCapture", [c_void_p, POINTER(c_void_p)]),
    "instantiate": ("cuGraphInstantiateWithFlags", "hipGraphInstantiateWithFlags",
                    [POINTER(c_void_p), c_void_p, c_ulonglong]),
    "graph_launch": ("cuGraphLaunch", "hipGraphLaunch", [c_void_p, c_void_p]),
    "graph_free": ("cuGraphDestroy", "hipGraphDestroy", [c_void_p]),
    "exec_free": ("cuGraphExecDestroy", "hipGraphExecDestroy", [c_void_p]),
}
_CUDA_ONLY = {"cuDeviceGet": [POINTER(c_int), c_int], "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int],
              "cuDevicePrimaryCtxRelease_v2": [c_int], "cuCtxSetCurrent": [c_void_p],
              "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int],
              "cuGetErrorName": [c_int, POINTER(c_char_p)]}
_HIP_ONLY = {"hipSetDevice": [c_int], "hipGetErrorName": [c_int]}
CU_COMPUTE_CAPABILITY_MAJOR, CU_COMPUTE_CAPABILITY_MINOR = 75, 76
CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal / hipStreamCaptureModeThreadLocal


def parse_device(device: str) -> tuple[str, int]:
    """"cuda:0", "hip:1", "cuda" (= cuda:0) -> (kind, ordinal)."""
    kind, _, num = device.partition(":")
    if kind not in LIBRARIES or not (num or "0").isdigit():
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda[:N]' or 'hip[:N]'")
    return kind, int(num or "0")


def _open(kind: str) -> ctypes.CDLL:
    for name in LIBRARIES[kind]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise DeviceError(f"no {_API[kind]} driver: {' / '.join(LIBRARIES[kind])} not found; {_INSTALL[kind]}")


class Device:
    """One GPU, opened through its driver library."""

    def __init__(self, kind: str, ordinal: int):
        self.kind, self.ordinal = kind, ordinal
        self.capability = 0  # CUDA compute capability as major*10 + minor
        self._ctx: c_void_p | None = None
        lib, api = _open(kind), 0 if kind == "cuda" else 1
        own = _CUDA_ONLY if kind == "cuda" else _HIP_ONLY
        self._names = {op: spec[api] for op, spec in _OPS.items()} | {n: n for n in own}
        try:
            self._fn = {op: getattr(lib, name) for op, name in self._names.items()}
        except AttributeError as e:
            raise DeviceError(f"the {_API[kind]} driver library lacks {e.args[0].split(': ')[-1]}: it is too old; "
                              "update it") from None
        for op, f in self._fn.items():
            f.argtypes, f.restype = _OPS[op][2] if op in _OPS else own[op], c_int
        if kind == "hip":
            self._fn["hipGetErrorName"].restype = c_char_p
        n = c_int()
        self.call("init", 0)
        self.call("count", ctypes.byref(n))
        if not 0 <= ordinal < n.value:
            raise DeviceError(f"{kind}:{ordinal} does not exist: the {_API[kind]} driver reports {n.value} device"
                              f"{'s' if n.value != 1 else ''}")
        self._dev = ordinal  # HIP: the ordinal; CUDA: the handle cuDeviceGet gives
        if kind == "cuda":
            dev, major, minor = c_int(), c_int(), c_int()
            self.call("cuDeviceGet", ctypes.byref(dev), ordinal)
            self._dev = dev.value
            self._ctx = self.handle("cuDevicePrimaryCtxRetain", self._dev)
            self.call("cuDeviceGetAttribute", ctypes.byref(major), CU_COMPUTE_CAPABILITY_MAJOR, self._dev)
            self.call("cuDeviceGetAttribute", ctypes.byref(minor), CU_COMPUTE_CAPABILITY_MINOR, self._dev)
            self.capability = major.value * 10 + minor.value
        self.activate()
        buf = ctypes.create_string_buffer(256)
        self.call("name", buf, 256, self._dev)
        self.name = buf.value.decode(errors="replace")

    def _error(self, status: int) -> str:
        if self.kind == "hip":
            name = self._fn["hipGetErrorName"](status)
        else:
            p = c_char_p()
            name = p.value if self._fn["cuGetErrorName"](status, ctypes.byref(p)) == 0 else None
        return f"{name.decode(errors='replace') if name else 'unknown error'} ({status})"

    def call(self, op: str, *args) -> None:
        status = self._fn[op](*args)
        if status != 0:
            raise DeviceError(f"{self._names[op]} failed on {self.kind}:{self.ordinal}: {self._error(status)}")

    def handle(self, op: str, *args) -> c_void_p:
        """Call an operation whose first argument receives a handle (module, function, stream, graph)."""
        h = c_void_p()
        self.call(op, ctypes.byref(h), *args)
        return h

    def activate(self) -> None:
        """Make this device current in the calling thread."""
        if self.kind == "cuda":
            self.call("cuCtxSetCurrent", self._ctx)
        else:
            self.call("hipSetDevice", self.ordinal)

    def alloc(self, nbytes: int) -> int:
        p = c_uint64()
        self.call("malloc", ctypes.byref(p), max(nbytes, 1))
        return p.value

    def release(self) -> None:
        if self._ctx is not None:
            self.call("cuDevicePrimaryCtxRelease_v2", self._dev)
            self._ctx = None


def cuda_image(v: Variant, capability: int) -> tuple[Section | None, str]:
    """(the section a CUDA device of this compute capability loads, or None; why / what it is). A cubin
    runs on its architecture's major version with an equal or higher minor; PTX on any newer device."""
    if not (v.cpu.startswith("sm_") and v.cpu[3:].isdigit()):
        return None, f"unknown architecture {v.cpu!r}"
    want = int(v.cpu[3:])
    if v.cubin is not None and capability // 10 == want // 10 and capability >= want:
        return v.cubin, "cubin"
    if capability >= want:
        return v.section, "PTX, compiled by the driver"
    return None, f"needs compute capability {want // 10}.{want % 10}"


class GpuModel(Runner):
    def __init__(self, source: str | os.PathLike | bytes, device: str, verify_weights: bool | None = None,
                 variant: int | None = None, graph: bool = True, trust: TrustSpec | None = None):
        kind, ordinal = parse_device(device)
        self._closed = False
        self._lock = threading.Lock()
        self._buffers: list[int] = []
        self._module = self._graph = self._exec = self._stream = None
        program = Program(source, verify_weights, trust, variant)
        try:
            self.bundle, self.signer, self.weights_verified = program.bundle, program.signer, program.check_weights
            self.device = Device(kind, ordinal)
            self._load(program, variant, graph)
        except BaseException:
            self.close()
            raise
        finally:
            program.close()
        self._set_io()

    def _choose(self, program: Program, index: int | None) -> tuple[Variant, str]:
        d, reasons = self.device, []
        for v in self.bundle.variants if index is None else [self.bundle.variants[index]]:
            if v.kind != d.kind:
                reasons.append(f"{v.describe()} (not a {d.kind} variant)")
                continue
            sec, what = cuda_image(v, d.capability) if d.kind == "cuda" else (v.section, "code object")
            if sec is None:
                reasons.append(f"{v.describe()} ({what})")
                continue
            image = bytes(program.image(sec))  # the bytes loaded are the bytes checked
            try:
                self._module = d.handle("load", image)
            except DeviceError as e:
                reasons.append(f"{v.describe()} ({e})")
                continue
            return v, what
        cap = f", compute capability {d.capability // 10}.{d.capability % 10}" if d.kind == "cuda" else ""
        raise UnsupportedHostError(f"no variant of this bundle runs on {d.kind}:{d.ordinal} ({d.name}{cap}): "
                                   f"{'; '.join(reasons) or 'the bundle has no variants'}. Recompile with a "
                                   f"--target for this GPU")

    def _load(self, program: Program, index: int | None, graph: bool) -> None:
        d, b = self.device, self.bundle
        self.variant, self.code_kind = self._choose(program, index)
        host_weights, weights_address = program.weights()
        self._stream = d.handle("stream", 0)
        io_sizes = (t.nbytes for t in (*b.inputs, *b.outputs))
        for nbytes in (b.weights_size, b.arena_size, DIM_SIZE * len(b.dims), *io_sizes):
            self._buffers.append(d.alloc(nbytes))  # one at a time: close() frees them if one fails
        weights, arena, self._dims, *io = self._buffers
        if b.weights_size:
            d.call("h2d", weights, weights_address, b.weights_size, self._stream)
        base = {"weight": weights, "scratch": arena}
        where = {"input": 0, "output": len(b.inputs)}

        def address(buffer_id: int) -> int:
            kind, pos = b.placement[buffer_id]
            return base[kind] + pos if kind in base else io[where[kind] + pos]

        self._io = io
        self._launches, self._scales = [], []
        for x in self.variant.launches:
            ptrs = [address(p) for p in b.kernels[x.kernel].params] + ([self._dims] if b.dims else [])
            values = (ctypes.c_uint64 * len(ptrs))(*ptrs)
            args = (ctypes.c_void_p * len(ptrs))(*(ctypes.addressof(values) + 8 * i for i in range(len(ptrs))))
            fn = d.handle("function", self._module, x.symbol.encode())
            self._launches.append((fn, *x.grid, *x.block, 0, self._stream, args, None, values))
            self._scales.append((x.dims, math.prod(b.dims[i].hi for i in x.dims)))
        d.call("sync", self._stream)  # the upload is done: host_weights may go
        del host_weights
        if graph and self._launches and not b.dims:  # a graph fixes the grids, which bounded dims scale
            self._capture()

    def _launch_all(self, dims: ctypes.Array | None = None) -> None:
        for launch, (slots, bounds) in zip(self._launches, self._scales, strict=True):
            if slots and dims is not None:
                blocks = launch_blocks(launch[1], math.prod(dims[i] for i in slots), bounds)
                launch = (launch[0], blocks, *launch[2:])
            self.device.call("launch", *launch[:-1])

    def _capture(self) -> None:
        """Record the launch list as a graph; where the driver cannot, run() launches one by one."""
        d = self.device
        try:
            d.call("capture", self._stream, CAPTURE_THREAD_LOCAL)
        except DeviceError:
            return
        self._graph = ctypes.c_void_p()
        try:
            self._launch_all()
        finally:
            d.call("end_capture", self._stream, ctypes.byref(self._graph))
        self._exec = d.handle("instantiate", self._graph, 0)

    def run(self, feeds: MappingT[str, object]) -> dict[str, np.ndarray]:
        """{input name: array} -> {output name: array}, like Model.run. Safe from many threads (they take turns)."""
        feeds = self.edge_feeds(feeds)
        arrays, dims = self._prepare(feeds)  # dims: bounded dims' values, inputs in the bounds' layout
        outs = [np.empty(shape, dtype) for shape, dtype in self._output_specs]
        d, s = self.device, self._stream
        with self._lock:
            if self._closed:
                raise ModelClosedError("this model was closed; load the bundle again to run it")
            d.activate()
            for buf, a in zip(self._io[:len(arrays)], arrays, strict=True):
                if a.nbytes:
                    d.call("h2d", buf, a.ctypes.data, a.nbytes, s)
            if dims is not None:
                d.call("h2d", self._dims, ctypes.addressof(dims), DIM_SIZE * len(self.bundle.dims), s)
            if self._exec is not None:
                d.call("graph_launch", self._exec, s)
            else:
                self._launch_all(dims)
            for buf, o in zip(self._io[len(arrays):], outs, strict=True):
                if o.nbytes:
                    d.call("d2h", o.ctypes.data, buf, o.nbytes, s)
            d.call("sync", s)
        if dims is not None:
            outs = [real_output(t, o, dims, self._dim_slots) for t, o in zip(self.bundle.outputs, outs, strict=True)]
        return self._results(outs, feeds)

    def close(self) -> None:
        """Wait for a running call, then free the device memory, the graph, the module and the stream."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            d = getattr(self, "device", None)
            if d is None:
                return
            d.activate()
            for op, h in (("exec_free", self._exec), ("graph_free", self._graph), ("unload", self._module),
                          ("stream_free", self._stream)):
                if h is not None:
                    d.call(op, h)
            for p in self._buffers:
                d.call("free", p)
            self._buffers.clear()
            d.release()
