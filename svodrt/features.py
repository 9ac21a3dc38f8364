"""The CPU feature table: named feature bits per architecture, defined once, here.

The compiler records in a bundle which of these features a code image needs; the runtime checks
that the host has all of them before it maps the code. The table is frozen: a feature keeps its
bit forever, new features are appended. Each entry names the feature as LLVM spells it (what the
compiler enables) and as Linux reports it (what the runtime detects: a /proc/cpuinfo flag on x86_64,
a HWCAP name on aarch64, ppc64le and s390x, an ISA-string extension on riscv64; svodrt/host.py maps
each to where the kernel reports it).

Features are named per architecture, never by CPU model (a model name is ambiguous on arm and
riscv, where vendors pick extensions freely). On ppc64le and s390x an ISA level is unambiguous, so
a level is one feature there ("power9" = Power ISA 3.0, "vxe" = z14's vector enhancements 1, which
only z14 and later have): the code for a level may use the whole level.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Feature:
    name: str  # our name, used in bundles and messages
    llvm: str  # LLVM's target feature
    linux: str  # /proc/cpuinfo flag (x86) or HWCAP name (others)


# x86_64. Order is the bit index; append only.
X86_64 = (
    Feature("sse3", "sse3", "pni"),
    Feature("ssse3", "ssse3", "ssse3"),
    Feature("sse4.1", "sse4.1", "sse4_1"),
    Feature("sse4.2", "sse4.2", "sse4_2"),
    Feature("popcnt", "popcnt", "popcnt"),
    Feature("cx16", "cx16", "cx16"),
    Feature("sahf", "sahf", "lahf_lm"),
    Feature("avx", "avx", "avx"),
    Feature("avx2", "avx2", "avx2"),
    Feature("bmi1", "bmi", "bmi1"),
    Feature("bmi2", "bmi2", "bmi2"),
    Feature("f16c", "f16c", "f16c"),
    Feature("fma", "fma", "fma"),
    Feature("lzcnt", "lzcnt", "abm"),
    Feature("movbe", "movbe", "movbe"),
    Feature("xsave", "xsave", "xsave"),
    Feature("avx512f", "avx512f", "avx512f"),
    Feature("avx512bw", "avx512bw", "avx512bw"),
    Feature("avx512cd", "avx512cd", "avx512cd"),
    Feature("avx512dq", "avx512dq", "avx512dq"),
    Feature("avx512vl", "avx512vl", "avx512vl"),
    Feature("avx512vnni", "avx512vnni", "avx512_vnni"),
    Feature("avx512bf16", "avx512bf16", "avx512_bf16"),
    Feature("avx512ifma", "avx512ifma", "avx512ifma"),
    Feature("avx512vbmi", "avx512vbmi", "avx512vbmi"),
    Feature("avx512vbmi2", "avx512vbmi2", "avx512_vbmi2"),
    Feature("avx512bitalg", "avx512bitalg", "avx512_bitalg"),
    Feature("avx512vpopcntdq", "avx512vpopcntdq", "avx512_vpopcntdq"),
    Feature("avx512fp16", "avx512fp16", "avx512_fp16"),
    Feature("gfni", "gfni", "gfni"),
    Feature("vaes", "vaes", "vaes"),
    Feature("vpclmulqdq", "vpclmulqdq", "vpclmulqdq"),
    Feature("avxvnni", "avxvnni", "avx_vnni"),
)

# aarch64 (Linux requires FP and Advanced SIMD, so "neon" is in every variant). Append only.
AARCH64 = (
    Feature("neon", "neon", "asimd"),
    Feature("fp16", "fullfp16", "asimdhp"),
    Feature("dotprod", "dotprod", "asimddp"),
    Feature("rdm", "rdm", "asimdrdm"),
    Feature("lse", "lse", "atomics"),
    Feature("fhm", "fp16fml", "asimdfhm"),
    Feature("i8mm", "i8mm", "i8mm"),
    Feature("bf16", "bf16", "bf16"),
    Feature("sve", "sve", "sve"),
    Feature("sve2", "sve2", "sve2"),
)

# riscv64 (the lp64d ABI needs rv64gc: m, a, f, d, c are in every variant). Append only.
RISCV64 = (
    Feature("m", "m", "m"),
    Feature("a", "a", "a"),
    Feature("f", "f", "f"),
    Feature("d", "d", "d"),
    Feature("c", "c", "c"),
    Feature("v", "v", "v"),
    Feature("zba", "zba", "zba"),
    Feature("zbb", "zbb", "zbb"),
    Feature("zbs", "zbs", "zbs"),
    Feature("zfh", "zfh", "zfh"),
    Feature("zvfh", "zvfh", "zvfh"),
    Feature("zihintpause", "zihintpause", "zihintpause"),
)

# ppc64le (ELFv2 little-endian needs POWER8: "power8" is in every variant). Append only.
PPC64LE = (
    Feature("power8", "power8-vector", "arch_2_07"),
    Feature("power9", "power9-vector", "arch_3_00"),
    Feature("power10", "power10-vector", "arch_3_1"),
    Feature("mma", "mma", "mma"),
)

# s390x (big-endian; z13's vector facility is the floor we compile for). Append only.
S390X = (
    Feature("vector", "vector", "vx"),
    Feature("vxe", "vector-enhancements-1", "vxe"),
    Feature("vxe2", "vector-enhancements-2", "vxe2"),
    Feature("nnpa", "nnp-assist", "nnpa"),
)

FEATURES: dict[str, tuple[Feature, ...]] = {
    "x86_64": X86_64, "aarch64": AARCH64, "riscv64": RISCV64, "ppc64le": PPC64LE, "s390x": S390X,
}

# The byte order of each architecture's data (weights, inputs, outputs, fixup words).
BYTE_ORDER: dict[str, str] = {
    "x86_64": "little", "aarch64": "little", "riscv64": "little", "ppc64le": "little", "s390x": "big",
}

# The x86-64 micro-architecture levels (psABI), as sets of our feature names.
_V2 = ("sse3", "ssse3", "sse4.1", "sse4.2", "popcnt", "cx16", "sahf")
_V3 = (*_V2, "avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "lzcnt", "movbe", "xsave")
_V4 = (*_V3, "avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl")
X86_64_LEVELS: dict[str, tuple[str, ...]] = {
    "x86-64": (),
    "x86-64-v2": _V2,
    "x86-64-v3": _V3,
    "x86-64-v4": _V4,
}


def feature_names(arch: str) -> list[str]:
    return [f.name for f in FEATURES.get(arch, ())]


def to_bits(arch: str, names: list[str] | tuple[str, ...]) -> int:
    index = {f.name: i for i, f in enumerate(FEATURES[arch])}
    bits = 0
    for n in names:
        if n not in index:
            raise ValueError(f"unknown {arch} feature {n!r}")
        bits |= 1 << index[n]
    return bits


def from_bits(arch: str, bits: int) -> list[str]:
    table = FEATURES[arch]
    if bits >> len(table):
        raise ValueError(f"feature bits {bits:#x} name features this runtime does not know for {arch}")
    return [f.name for i, f in enumerate(table) if bits >> i & 1]
