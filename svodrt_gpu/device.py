"""Device: one GPU through its driver's ctypes API. CUDA and HIP mirror each other: one table names each
operation in both (OPS), and each driver's own module (svodrt_gpu/cuda.py, hip.py) holds what differs: its
library, context handling, error names and which image a variant loads. Every status is checked: a failure is
a DeviceError naming the function and the driver's error name."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_size_t, c_uint, c_uint64, c_ulonglong, c_void_p

from svodrt.errors import DeviceError
from svodrt_gpu import cuda, hip

DRIVERS = {"cuda": cuda, "hip": hip}
LIBRARIES = {kind: drv.LIBRARIES for kind, drv in DRIVERS.items()}  # where each driver is looked for, in order
# operation: (CUDA name, HIP name, argument types); every function returns a status (0: success)
OPS = {
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
CAPTURE_THREAD_LOCAL = 1  # cudaStreamCaptureModeThreadLocal / hipStreamCaptureModeThreadLocal


def parse_device(device: str) -> tuple[str, int]:
    """"cuda:0", "hip:1", "cuda" (= cuda:0) -> (kind, ordinal)."""
    kind, _, num = device.partition(":")
    if kind not in DRIVERS or not (num or "0").isdigit():
        raise ValueError(f"device {device!r}: expected 'cpu', 'cuda[:N]' or 'hip[:N]'")
    return kind, int(num or "0")


def _open(kind: str) -> ctypes.CDLL:
    for name in LIBRARIES[kind]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    drv = DRIVERS[kind]
    raise DeviceError(f"no {drv.API} driver: {' / '.join(LIBRARIES[kind])} not found; {drv.INSTALL}")


class Device:
    """One GPU, opened through its driver library."""

    def __init__(self, kind: str, ordinal: int):
        self.kind, self.ordinal, self.driver = kind, ordinal, DRIVERS[kind]
        self.capability = 0  # CUDA compute capability as major*10 + minor (0 on HIP)
        self.context: c_void_p | None = None  # CUDA's primary context
        self.handle_id = ordinal  # what the driver's device calls take (CUDA: cuDeviceGet's handle)
        lib, own = _open(kind), self.driver.OWN
        self._names = {op: spec[self.driver.COLUMN] for op, spec in OPS.items()} | {n: n for n in own}
        try:
            self._fn = {op: getattr(lib, name) for op, name in self._names.items()}
        except AttributeError as e:
            raise DeviceError(f"the {self.driver.API} driver library lacks {e.args[0].split(': ')[-1]}: it is too "
                              "old; update it") from None
        for op, f in self._fn.items():
            f.argtypes = OPS[op][2] if op in OPS else own[op]
            f.restype = self.driver.RESTYPES.get(op, c_int)
        n = c_int()
        self.call("init", 0)
        self.call("count", ctypes.byref(n))
        if not 0 <= ordinal < n.value:
            raise DeviceError(f"{kind}:{ordinal} does not exist: the {self.driver.API} driver reports {n.value} "
                              f"device{'s' if n.value != 1 else ''}")
        self.driver.open_device(self, ordinal)
        self.activate()
        buf = ctypes.create_string_buffer(256)
        self.call("name", buf, 256, self.handle_id)
        self.name = buf.value.decode(errors="replace")

    def call(self, op: str, *args) -> None:
        status = self._fn[op](*args)
        if status != 0:
            name = self.driver.error_name(self._fn, status)
            raise DeviceError(f"{self._names[op]} failed on {self.kind}:{self.ordinal}: "
                              f"{name.decode(errors='replace') if name else 'unknown error'} ({status})")

    def handle(self, op: str, *args) -> c_void_p:
        """Call an operation whose first argument receives a handle (module, function, stream, graph)."""
        h = c_void_p()
        self.call(op, ctypes.byref(h), *args)
        return h

    def activate(self) -> None:
        """Make this device current in the calling thread."""
        self.driver.activate(self)

    def alloc(self, nbytes: int) -> int:
        p = c_uint64()
        self.call("malloc", ctypes.byref(p), max(nbytes, 1))
        return p.value

    def release(self) -> None:
        self.driver.release(self)
