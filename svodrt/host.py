"""What this machine is: its architecture and the CPU features it has, named as in features.py.

x86_64: the flags line of /proc/cpuinfo (the kernel only reports features the OS has enabled,
e.g. AVX-512 only with its register state saved on context switch). If it cannot be read, the host
is taken to have no optional feature, so only baseline code is chosen: unknown means "no".
"""

from __future__ import annotations

import functools
import platform
from dataclasses import dataclass

from svodrt.features import FEATURES, X86_64_LEVELS

_ARCH = {"x86_64": "x86_64", "amd64": "x86_64"}


@dataclass(frozen=True)
class Host:
    arch: str
    features: frozenset[str]

    def limited_to(self, cpu: str) -> Host:
        """This host as if it were only a `cpu` (an x86-64 level): its features that the level has.
        For trying a fat bundle's smaller variants on a bigger machine; it can only remove features."""
        if self.arch != "x86_64" or cpu not in X86_64_LEVELS:
            raise ValueError(f"cannot limit a {self.arch} host to {cpu!r}; known: {', '.join(X86_64_LEVELS)}")
        return Host(self.arch, self.features & frozenset(X86_64_LEVELS[cpu]))


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


@functools.cache
def detect_host() -> Host:
    arch = host_arch()
    table = FEATURES.get(arch, ())
    if arch == "x86_64":
        flags = _cpuinfo_flags()
        return Host(arch, frozenset(f.name for f in table if f.linux in flags))
    return Host(arch, frozenset())
