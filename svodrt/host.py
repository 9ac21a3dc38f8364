"""What this machine is: its architecture and CPU features, named as in features.py (sources per architecture:
docs/architecture.md "Cross targets"). A source that cannot be read means no optional feature: unknown is "no"."""

import contextlib
import ctypes
import functools
import os
from typing import NamedTuple

from svodrt.features import FEATURES, X86_64_LEVELS

_ARCH = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "aarch64", "arm64": "aarch64", "riscv64": "riscv64",
         "ppc64le": "ppc64le", "s390x": "s390x"}
AT_HWCAP, AT_HWCAP2 = 16, 26

# HWCAP name (features.py's `linux`) -> (0: AT_HWCAP, 1: AT_HWCAP2; bit), from the kernel's uapi headers:
# arch/arm64/include/uapi/asm/hwcap.h, arch/powerpc/include/uapi/asm/cputable.h, arch/s390/include/asm/elf.h.
HWCAP_BITS: dict[str, dict[str, tuple[int, int]]] = {
    "aarch64": {"asimd": (0, 1), "atomics": (0, 8), "asimdhp": (0, 10), "asimdrdm": (0, 12), "asimddp": (0, 20),
                "sve": (0, 22), "asimdfhm": (0, 23), "sve2": (1, 1), "i8mm": (1, 13), "bf16": (1, 14)},
    "ppc64le": {"arch_2_07": (1, 31), "arch_3_00": (1, 23), "arch_3_1": (1, 18), "mma": (1, 17)},
    "s390x": {"vx": (0, 11), "vxe": (0, 13), "vxe2": (0, 15), "nnpa": (0, 20)},
}


class Host(NamedTuple):
    arch: str
    features: frozenset[str]

    def limited_to(self, cpu: str) -> "Host":
        """This host as if it were only a `cpu` (an x86-64 level): its features that the level has.
        For trying a fat bundle's smaller variants on a bigger machine; it can only remove features."""
        if self.arch != "x86_64" or cpu not in X86_64_LEVELS:
            raise ValueError(f"cannot limit a {self.arch} host to {cpu!r}; known: {', '.join(X86_64_LEVELS)}")
        return Host(self.arch, self.features & frozenset(X86_64_LEVELS[cpu]))


def host_arch() -> str:
    m = os.uname().machine.lower()  # what platform.machine() reads, without importing it
    return _ARCH.get(m, m)


def _cpuinfo_values(key: str) -> list[str]:
    """The value of every `key : value` line of /proc/cpuinfo (one per CPU for most keys)."""
    out = []
    with contextlib.suppress(OSError), open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
        for line in f:
            name, sep, value = line.partition(":")
            if sep and name.strip() == key:
                out.append(value.strip())
    return out


def _getauxval(kind: int) -> int:
    try:
        fn = ctypes.CDLL(None).getauxval
    except (OSError, AttributeError):  # not glibc/musl: no auxiliary vector to read
        return 0
    fn.restype, fn.argtypes = ctypes.c_ulong, [ctypes.c_ulong]
    return int(fn(kind))


def features_from_hwcap(arch: str, hwcap: int, hwcap2: int) -> frozenset[str]:
    """The table's features of `arch` that HWCAP/HWCAP2 report."""
    found = {name for name, (word, bit) in HWCAP_BITS[arch].items() if (hwcap, hwcap2)[word] >> bit & 1}
    return frozenset(f.name for f in FEATURES[arch] if f.linux in found)


def riscv_extensions(isa: str) -> set[str]:
    """`rv64imafdcv_zba_zbb_zicsr` -> {"i", "m", "a", "f", "d", "c", "v", "zba", "zbb", "zicsr"}."""
    isa = isa.strip().lower()
    if not isa.startswith(("rv64", "rv32")):
        return set()
    base, *multi = isa[4:].split("_")
    letters = set(base.replace("g", "imafd"))
    return letters | {m for m in multi if m}


def features_from_riscv_isa(isa_lines: list[str]) -> frozenset[str]:
    """Features every hart has (the intersection of the harts' ISA strings)."""
    sets = [riscv_extensions(line) for line in isa_lines]
    common = set.intersection(*sets) if sets else set()
    return frozenset(f.name for f in FEATURES["riscv64"] if f.linux in common)


@functools.cache
def detect_host() -> Host:
    arch = host_arch()
    table = FEATURES.get(arch, ())
    if arch == "x86_64":
        flags = set(next(iter(_cpuinfo_values("flags")), "").split())
        return Host(arch, frozenset(f.name for f in table if f.linux in flags))
    if arch in HWCAP_BITS:
        return Host(arch, features_from_hwcap(arch, _getauxval(AT_HWCAP), _getauxval(AT_HWCAP2)))
    if arch == "riscv64":
        letters = "".join(chr(ord("a") + i) for i in range(26) if _getauxval(AT_HWCAP) >> i & 1)  # no /proc
        return Host(arch, features_from_riscv_isa(_cpuinfo_values("isa") or ["rv64" + letters]))
    return Host(arch, frozenset())
