"""The CPU feature table, defined once here and frozen (a feature keeps its bit forever; new ones are appended):
each feature as LLVM spells it (svodc) and as Linux reports it (host.py), per architecture, never per CPU model."""

import functools
from typing import NamedTuple


class Feature(NamedTuple):
    name: str  # our name, used in bundles and messages
    llvm: str  # LLVM's target feature
    linux: str  # /proc/cpuinfo flag (x86) or HWCAP name (others)


def _table(spec: str) -> tuple[Feature, ...]:
    """Features from "name" or "name/llvm/linux" words (an empty part repeats the name), in bit order."""
    out = []
    for word in spec.split():
        name, llvm, linux = (word.split("/") + ["", ""])[:3]
        out.append(Feature(name, llvm or name, linux or name))
    return tuple(out)


# Each table's order is the bit index: append only.
X86_64 = _table("""
    sse3//pni ssse3 sse4.1//sse4_1 sse4.2//sse4_2 popcnt cx16 sahf//lahf_lm avx avx2 bmi1/bmi/ bmi2 f16c fma
    lzcnt//abm movbe xsave avx512f avx512bw avx512cd avx512dq avx512vl avx512vnni//avx512_vnni
    avx512bf16//avx512_bf16 avx512ifma avx512vbmi avx512vbmi2//avx512_vbmi2 avx512bitalg//avx512_bitalg
    avx512vpopcntdq//avx512_vpopcntdq avx512fp16//avx512_fp16 gfni vaes vpclmulqdq avxvnni//avx_vnni""")
# aarch64 (Linux requires FP and Advanced SIMD, so "neon" is in every variant).
AARCH64 = _table("""
    neon//asimd fp16/fullfp16/asimdhp dotprod//asimddp rdm//asimdrdm lse//atomics fhm/fp16fml/asimdfhm i8mm bf16
    sve sve2""")
# riscv64 (the lp64d ABI needs rv64gc: m, a, f, d, c are in every variant).
RISCV64 = _table("m a f d c v zba zbb zbs zfh zvfh zihintpause")
# ppc64le (ELFv2 little-endian needs POWER8: "power8" is in every variant).
PPC64LE = _table("power8/power8-vector/arch_2_07 power9/power9-vector/arch_3_00 power10/power10-vector/arch_3_1 mma")
# s390x (big-endian; z13's vector facility is the floor we compile for).
S390X = _table("vector//vx vxe/vector-enhancements-1/ vxe2/vector-enhancements-2/ nnpa/nnp-assist/")

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
X86_64_LEVELS: dict[str, tuple[str, ...]] = {"x86-64": (), "x86-64-v2": _V2, "x86-64-v3": _V3, "x86-64-v4": _V4}


def feature_names(arch: str) -> list[str]:
    return [f.name for f in FEATURES.get(arch, ())]


@functools.cache  # read at every load (schema.py _variant)
def bit_of(arch: str) -> dict[str, int]:
    return {f.name: i for i, f in enumerate(FEATURES[arch])}


def to_bits(arch: str, names: list[str] | tuple[str, ...]) -> int:
    index = bit_of(arch)
    if unknown := [n for n in names if n not in index]:
        raise ValueError(f"unknown {arch} feature {unknown[0]!r}")
    return sum(1 << index[n] for n in set(names))
