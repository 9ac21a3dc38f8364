"""GPU targets, and target strings that mix CPU and GPU variants.

A GPU item of a target string is a GPU architecture name, optionally prefixed by its kind or LLVM
architecture:

    gfx942 | hip:gfx942 | amdgcn:gfx942 | amdgcn-amd-amdhsa:gfx942        (AMD: code object v5)
    sm_90  | cuda:sm_90 | nvptx64:sm_90 | nvptx64-nvidia-cuda:sm_90      (NVIDIA: PTX + cubin)

Items are separated by commas; GPU items may stand anywhere among the CPU items, e.g.
`x86_64-linux-gnu:x86-64-v3,x86-64,sm_90,gfx942` is a fat bundle with two CPU and two GPU variants.
The CPU items keep their own syntax (svodc/target.py) and order; each variant kind keeps its order
(the runtime takes the first variant its device can run).
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.errors import TargetError
from svodc.target import Target, parse_target


@dataclass(frozen=True)
class GpuArch:
    kind: str  # "cuda" | "hip": the runtime API that loads it
    llvm_arch: str  # "nvptx64" | "amdgcn"
    triple: str
    features: str  # LLVM features (the PTX ISA version for NVPTX)
    wave: int  # threads per warp / wavefront
    what: str
    # matrix units for GEMMs with float16/bfloat16 weights (--precision): "mma" (mma.sync, codegen/gpu_mma.py),
    # "wmma" (gfx11, gpu_wmma.py), "mfma" (CDNA3, gpu_mfma.py); None: the vector ALUs (gfx12's WMMA differs)
    matrix: str | None


# PTX ISA: the oldest version the architecture allows, so the PTX JIT-compiles on the oldest drivers
# that know the architecture (7.0: CUDA 11.0; 7.8: CUDA 11.8).
GPU_ARCHS: dict[str, GpuArch] = {
    "sm_80": GpuArch("cuda", "nvptx64", "nvptx64-nvidia-cuda", "+ptx70", 32, "NVIDIA Ampere (A100)", "mma"),
    "sm_90": GpuArch("cuda", "nvptx64", "nvptx64-nvidia-cuda", "+ptx78", 32, "NVIDIA Hopper (H100, H200)", "mma"),
    "gfx942": GpuArch("hip", "amdgcn", "amdgcn-amd-amdhsa", "", 64, "AMD CDNA3 (MI300)", "mfma"),
    "gfx1100": GpuArch("hip", "amdgcn", "amdgcn-amd-amdhsa", "", 32, "AMD RDNA3 (RX 7900)", "wmma"),
    "gfx1151": GpuArch("hip", "amdgcn", "amdgcn-amd-amdhsa", "", 32, "AMD RDNA3.5 (Ryzen AI Max)", "wmma"),
    "gfx1200": GpuArch("hip", "amdgcn", "amdgcn-amd-amdhsa", "", 32, "AMD RDNA4 (RX 9060)", None),
}
_PREFIXES = {"cuda": "cuda", "nvptx64": "cuda", "nvptx64-nvidia-cuda": "cuda",
             "hip": "hip", "amdgcn": "hip", "amdgcn-amd-amdhsa": "hip"}


@dataclass(frozen=True)
class GpuTarget:
    cpu: str  # the GPU architecture: "sm_90", "gfx942"

    @property
    def spec(self) -> GpuArch:
        return GPU_ARCHS[self.cpu]

    @property
    def kind(self) -> str:
        return self.spec.kind

    @property
    def arch(self) -> str:
        return self.spec.llvm_arch

    @property
    def triple(self) -> str:
        return self.spec.triple

    @property
    def llvm_features(self) -> str:
        return self.spec.features

    def describe(self) -> str:
        return f"{self.kind}:{self.cpu}"


AnyTarget = Target | GpuTarget


def gpu_item(item: str) -> GpuTarget | None:
    """The GPU target an item names, None if it is not a GPU item."""
    prefix, sep, name = item.partition(":")
    if not sep:
        prefix, name = "", item
    if name not in GPU_ARCHS and (prefix in _PREFIXES or name.startswith(("sm_", "gfx"))):
        raise TargetError(f"unknown GPU {name!r} in {item!r}; known: {', '.join(GPU_ARCHS)}")
    if name not in GPU_ARCHS:
        return None
    if prefix and _PREFIXES.get(prefix) != GPU_ARCHS[name].kind:
        raise TargetError(f"{item!r}: {name} is a {GPU_ARCHS[name].kind} GPU, not {prefix}")
    return GpuTarget(name)


def parse_targets(spec: str) -> list[AnyTarget]:
    """A target string with CPU and/or GPU items -> one target per variant: the CPU variants first
    (in their order), then the GPU variants (in theirs)."""
    items = [s.strip() for s in spec.split(",")]
    gpus, cpu_items = [], []
    for item in items:
        g = gpu_item(item)
        if g is None:
            cpu_items.append(item)
        elif g in gpus:
            raise TargetError(f"target {spec!r} names the GPU {g.cpu} twice")
        else:
            gpus.append(g)
    cpus: list[AnyTarget] = list(parse_target(",".join(cpu_items))) if cpu_items else []
    return cpus + gpus
