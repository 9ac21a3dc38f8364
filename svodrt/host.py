"""What this machine is: its architecture and the CPU features it has, named as in features.py.

x86_64: the flags line of /proc/cpuinfo (the kernel only reports features the OS has enabled,
e.g. AVX-512 only with its register state saved on context switch).
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

from svodrt.features import FEATURES

_ARCH = {"x86_64": "x86_64", "amd64": "x86_64"}


@dataclass(frozen=True)
class Host:
    arch: str
    features: frozenset[str]


def host_arch() -> str:
    m = platform.machine().lower()
    return _ARCH.get(m, m)


def _cpuinfo_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def detect_host() -> Host:
    arch = host_arch()
    table = FEATURES.get(arch, ())
    if arch == "x86_64":
        flags = _cpuinfo_flags()
        return Host(arch, frozenset(f.name for f in table if f.linux in flags))
    return Host(arch, frozenset())
