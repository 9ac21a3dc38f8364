"""svodrt_gpu: svodrt's CUDA and HIP executor (the drivers' ctypes APIs), outside the core runtime's line budget
(docs/architecture.md "Runtime"). `svodrt.load(path, device="cuda:0")` imports it; it imports svodrt, never the
reverse at module level, and only stdlib, numpy and ctypes besides."""

from svodrt_gpu.device import parse_device
from svodrt_gpu.model import GpuModel

__all__ = ["GpuModel", "parse_device"]
