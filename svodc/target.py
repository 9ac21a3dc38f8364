"""Targets: what a code image is compiled for.

A target string is `ARCH[-OS-ABI][:CPU[,CPU...]]`, or `host`. Each CPU gives one variant of a fat
bundle. A CPU is an x86-64 level (x86-64, x86-64-v2/v3/v4), a known CPU name, or `host`; it is
always resolved to an explicit set of named feature bits from svodrt's table, and code is generated
for exactly those features (LLVM cpu "x86-64" plus an explicit +/- feature list), tuned for the
named CPU. So the features a bundle records are the features its code can use, never "native".
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.errors import TargetError
from svodrt.features import FEATURES, X86_64_LEVELS

# Known CPU names -> (level, extra features). Tuning uses the name itself.
_X86_CPUS: dict[str, tuple[str, tuple[str, ...]]] = {
    "haswell": ("x86-64-v3", ()),
    "skylake": ("x86-64-v3", ()),
    "skylake-avx512": ("x86-64-v4", ()),
    "cascadelake": ("x86-64-v4", ("avx512vnni",)),
    "icelake-server": ("x86-64-v4", ("avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
                                     "avx512vpopcntdq", "gfni", "vaes", "vpclmulqdq")),
    "sapphirerapids": ("x86-64-v4", ("avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
                                     "avx512vpopcntdq", "gfni", "vaes", "vpclmulqdq", "avx512bf16",
                                     "avx512fp16", "avxvnni")),
    "znver2": ("x86-64-v3", ()),
    "znver3": ("x86-64-v3", ("vaes", "vpclmulqdq")),
    "znver4": ("x86-64-v4", ("avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
                             "avx512vpopcntdq", "avx512bf16", "gfni", "vaes", "vpclmulqdq")),
}

_ARCH_ALIASES = {"x86_64": "x86_64", "amd64": "x86_64", "x86-64": "x86_64"}
_TRIPLES = {"x86_64": "x86_64-unknown-linux-gnu"}


@dataclass(frozen=True)
class Target:
    arch: str  # "x86_64"
    triple: str  # LLVM triple
    cpu: str  # the CPU name the user asked for, resolved ("znver4", "x86-64-v3")
    features: tuple[str, ...]  # our feature names, in table order: exactly what the code may use

    @property
    def llvm_cpu(self) -> str:
        return "x86-64"

    @property
    def tune_cpu(self) -> str:
        return self.cpu if self.cpu in _X86_CPUS else "generic"

    @property
    def llvm_features(self) -> str:
        on = set(self.features)
        return ",".join(("+" if f.name in on else "-") + f.llvm for f in FEATURES[self.arch])

    @property
    def vector_bits(self) -> int:
        if "avx512f" in self.features:
            return 512
        if "avx" in self.features:
            return 256
        return 128

    @property
    def vector_regs(self) -> int:
        return 32 if "avx512f" in self.features else 16

    @property
    def codemodel(self) -> str:
        return "small"

    def describe(self) -> str:
        return f"{self.arch}:{self.cpu}"


def host_target() -> Target:
    import llvmlite.binding as llvm

    arch = _host_arch()
    if arch not in FEATURES:
        raise TargetError(f"host architecture {arch} is not supported yet; supported: {sorted(FEATURES)}")
    host = llvm.get_host_cpu_features()
    names = tuple(f.name for f in FEATURES[arch] if host.get(f.llvm, False))
    return Target(arch, _TRIPLES[arch], llvm.get_host_cpu_name(), names)


def _host_arch() -> str:
    import platform

    m = platform.machine().lower()
    return _ARCH_ALIASES.get(m, m)


def _resolve_cpu(arch: str, cpu: str) -> Target:
    if cpu == "host":
        t = host_target()
        if t.arch != arch:
            raise TargetError(f"'host' CPU requested for {arch}, but this machine is {t.arch}")
        return t
    if cpu in X86_64_LEVELS:
        return Target(arch, _TRIPLES[arch], cpu, _ordered(arch, X86_64_LEVELS[cpu]))
    if cpu in _X86_CPUS:
        level, extra = _X86_CPUS[cpu]
        return Target(arch, _TRIPLES[arch], cpu, _ordered(arch, X86_64_LEVELS[level] + extra))
    known = ", ".join(sorted([*X86_64_LEVELS, *_X86_CPUS, "host"]))
    raise TargetError(f"unknown {arch} CPU {cpu!r}; known: {known}")


def _ordered(arch: str, names: tuple[str, ...]) -> tuple[str, ...]:
    wanted = set(names)
    return tuple(f.name for f in FEATURES[arch] if f.name in wanted)


def parse_target(spec: str) -> list[Target]:
    """`host`, `x86_64`, `x86_64-linux-gnu:x86-64-v3,x86-64` -> one Target per variant."""
    spec = spec.strip()
    if spec == "host":
        return [host_target()]
    arch_part, _, cpus = spec.partition(":")
    arch = rest = None
    for alias in sorted(_ARCH_ALIASES, key=len, reverse=True):
        if arch_part == alias or arch_part.startswith(alias + "-"):
            arch, rest = _ARCH_ALIASES[alias], arch_part[len(alias) + 1:]
            break
    if arch is None or arch not in FEATURES:
        raise TargetError(f"unknown target {spec!r}; supported: host, x86_64-linux-gnu[:CPU[,CPU...]]")
    if rest and rest not in ("linux-gnu", "unknown-linux-gnu", "linux", "pc-linux-gnu"):
        raise TargetError(f"target {spec!r}: only Linux targets are supported, not {rest!r}")
    names = [c.strip() for c in cpus.split(",")] if cpus else ["x86-64"]
    if any(not c for c in names):
        raise TargetError(f"target {spec!r} has an empty CPU name")
    return [_resolve_cpu(arch, c) for c in names]
