"""The CUDA driver (libcuda): what differs from HIP (svodrt_gpu/device.py holds what both share). A device is
used through its primary context, made current per calling thread; a variant's image is its cubin when the
device runs that architecture, else its PTX (compiled by the driver)."""

from __future__ import annotations

import ctypes
from ctypes import POINTER, c_char_p, c_int, c_void_p
from typing import TYPE_CHECKING

from svodrt.bundle import Section

if TYPE_CHECKING:
    from svodrt_gpu.device import Device
    from svodrt_gpu.plan import GpuVariant

API = "CUDA"
LIBRARIES = ("libcuda.so.1", "libcuda.so")
INSTALL = "install the NVIDIA driver (it provides libcuda.so.1)"
COLUMN = 0  # this driver's names in device.OPS
OWN = {"cuDeviceGet": [POINTER(c_int), c_int], "cuDevicePrimaryCtxRetain": [POINTER(c_void_p), c_int],
       "cuDevicePrimaryCtxRelease_v2": [c_int], "cuCtxSetCurrent": [c_void_p],
       "cuDeviceGetAttribute": [POINTER(c_int), c_int, c_int], "cuGetErrorName": [c_int, POINTER(c_char_p)]}
RESTYPES: dict = {}  # every function returns its status as an int
CU_COMPUTE_CAPABILITY_MAJOR, CU_COMPUTE_CAPABILITY_MINOR = 75, 76


def open_device(d: Device, ordinal: int) -> None:
    """Sets d's handle (cuDeviceGet's), primary context and compute capability (major*10 + minor)."""
    dev, major, minor = c_int(), c_int(), c_int()
    d.call("cuDeviceGet", ctypes.byref(dev), ordinal)
    d.handle_id = dev.value
    d.context = d.handle("cuDevicePrimaryCtxRetain", d.handle_id)
    d.call("cuDeviceGetAttribute", ctypes.byref(major), CU_COMPUTE_CAPABILITY_MAJOR, d.handle_id)
    d.call("cuDeviceGetAttribute", ctypes.byref(minor), CU_COMPUTE_CAPABILITY_MINOR, d.handle_id)
    d.capability = major.value * 10 + minor.value


def activate(d: Device) -> None:
    d.call("cuCtxSetCurrent", d.context)


def release(d: Device) -> None:
    if d.context is not None:
        d.call("cuDevicePrimaryCtxRelease_v2", d.handle_id)
        d.context = None


def error_name(fn: dict, status: int) -> bytes | None:
    p = c_char_p()
    return p.value if fn["cuGetErrorName"](status, ctypes.byref(p)) == 0 else None


def image(g: GpuVariant, d: Device) -> tuple[Section | None, str]:
    """(the section a CUDA device of this compute capability loads, or None; why / what it is). A cubin
    runs on its architecture's major version with an equal or higher minor; PTX on any newer device."""
    v = g.variant
    if not (v.cpu.startswith("sm_") and v.cpu[3:].isdigit()):
        return None, f"unknown architecture {v.cpu!r}"
    want = int(v.cpu[3:])
    if g.cubin is not None and d.capability // 10 == want // 10 and d.capability >= want:
        return g.cubin, "cubin"
    if d.capability >= want:
        return v.section, "PTX, compiled by the driver"
    return None, f"needs compute capability {want // 10}.{want % 10}"


def describe(d: Device) -> str:
    return f", compute capability {d.capability // 10}.{d.capability % 10}"
