"""The HIP runtime (libamdhip64, ROCm): what differs from CUDA (svodrt_gpu/device.py holds what both share). A
device is made current by its ordinal; a variant's image is its code object (HSA, for one gfx target)."""

from __future__ import annotations

from ctypes import c_char_p, c_int
from typing import TYPE_CHECKING

from svodrt.bundle import Section

if TYPE_CHECKING:
    from svodrt_gpu.device import Device
    from svodrt_gpu.plan import GpuVariant

API = "HIP"
LIBRARIES = ("libamdhip64.so", "libamdhip64.so.7", "libamdhip64.so.6", "/opt/rocm/lib/libamdhip64.so")
INSTALL = "install ROCm's HIP runtime (libamdhip64.so), e.g. the rocm-hip-runtime package"
COLUMN = 1  # this driver's names in device.OPS
OWN = {"hipSetDevice": [c_int], "hipGetErrorName": [c_int]}
RESTYPES = {"hipGetErrorName": c_char_p}  # the one function that returns no status


def open_device(d: Device, ordinal: int) -> None:
    d.handle_id = ordinal


def activate(d: Device) -> None:
    d.call("hipSetDevice", d.ordinal)


def release(d: Device) -> None:
    return None


def error_name(fn: dict, status: int) -> bytes | None:
    return fn["hipGetErrorName"](status)


def image(g: GpuVariant, d: Device) -> tuple[Section | None, str]:
    return g.variant.section, "code object"


def describe(d: Device) -> str:
    return ""
