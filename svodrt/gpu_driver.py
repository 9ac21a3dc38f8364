"""GPU drivers through ctypes, no toolkit at run time: the CUDA driver API (libcuda.so.1) and HIP's
module API (libamdhip64.so), which mirror each other: one table names each operation in both. Every
status is checked: a failure is a DeviceError naming the function and the driver's error name."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

from svodrt.errors import DeviceError

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
