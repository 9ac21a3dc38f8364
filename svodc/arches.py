"""What the compiler knows about each CPU architecture: LLVM triple, code model, ABI, the CPU names a
user may write, and how a set of our feature names becomes an LLVM CPU and feature string.

Verified recipes (llvmlite 0.50 / LLVM 22; see docs/architecture.md "Cross targets"): every target
is `reloc="pic"`; the code model is the smallest one whose relocations our linker resolves without
a TOC or PLT:
- x86_64, aarch64, s390x: small.
- riscv64: medium (small is absolute addressing, lui+addi), ABI lp64d, `-relax` (linker relaxation
  would make the object's offsets depend on our linker shrinking code).
- ppc64le: medium (ELFv2): data is addressed TOC-relative (`addis r, r2, x@toc@ha`); the linker
  places the TOC base `.TOC.` in the image, so these are image-relative and final at link time.
  POWER10 code uses PC-relative prefixed instructions (PCREL34), which the linker resolves too.
- aarch64: `-outline-atomics` (else atomics call __aarch64_* helpers from libgcc).

The feature set of a target is closed under `implies` before it is written as an explicit +/- list:
LLVM applies the list in order, and a "-x" after "+y" where y needs x would silently turn y off.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from svodrt.features import FEATURES, X86_64_LEVELS


@dataclass(frozen=True)
class ArchSpec:
    name: str
    triple: str
    codemodel: str
    default_cpu: str
    # CPU names a user may write -> our feature names. Levels and named CPUs alike.
    cpus: dict[str, tuple[str, ...]]
    # The LLVM CPU for a feature set: a generic CPU plus explicit features, or the ISA level on
    # ppc64le/s390x, where a level is one feature (see svodrt/features.py).
    llvm_cpu: Callable[[frozenset[str]], str]
    # Named CPUs LLVM knows, used as "tune-cpu" (scheduling only; never changes the instructions used).
    tune_cpus: frozenset[str] = frozenset()
    abiname: str = ""
    fixed_llvm_features: tuple[str, ...] = ()  # always set this way, outside the feature table
    implies: dict[str, tuple[str, ...]] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()  # other spellings of the architecture in a target string

    def closure(self, names: set[str] | frozenset[str]) -> tuple[str, ...]:
        """`names` plus everything they imply, in table order."""
        out, todo = set(), list(names)
        while todo:
            n = todo.pop()
            if n not in out:
                out.add(n)
                todo.extend(self.implies.get(n, ()))
        return tuple(f.name for f in FEATURES[self.name] if f.name in out)


_X86_LEVEL_CPUS: dict[str, tuple[str, ...]] = dict(X86_64_LEVELS)
_X86_NAMED = {
    "haswell": X86_64_LEVELS["x86-64-v3"],
    "skylake": X86_64_LEVELS["x86-64-v3"],
    "skylake-avx512": X86_64_LEVELS["x86-64-v4"],
    "cascadelake": (*X86_64_LEVELS["x86-64-v4"], "avx512vnni"),
    "icelake-server": (*X86_64_LEVELS["x86-64-v4"], "avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2",
                       "avx512bitalg", "avx512vpopcntdq", "gfni", "vaes", "vpclmulqdq"),
    "sapphirerapids": (*X86_64_LEVELS["x86-64-v4"], "avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2",
                       "avx512bitalg", "avx512vpopcntdq", "gfni", "vaes", "vpclmulqdq", "avx512bf16",
                       "avx512fp16", "avxvnni"),
    "znver1": X86_64_LEVELS["x86-64-v3"],
    "znver2": X86_64_LEVELS["x86-64-v3"],
    "znver3": (*X86_64_LEVELS["x86-64-v3"], "vaes", "vpclmulqdq"),
    "znver4": (*X86_64_LEVELS["x86-64-v4"], "avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
               "avx512vpopcntdq", "avx512bf16", "gfni", "vaes", "vpclmulqdq"),
    "znver5": (*X86_64_LEVELS["x86-64-v4"], "avx512vnni", "avx512ifma", "avx512vbmi", "avx512vbmi2", "avx512bitalg",
               "avx512vpopcntdq", "avx512bf16", "gfni", "vaes", "vpclmulqdq", "avxvnni"),
}

# aarch64: Linux mandates FP + Advanced SIMD. Cores by what they implement (Arm TRMs):
# RK3588 = Cortex-A76 + A55 (Armv8.2 + dotprod), Ampere Altra = Neoverse N1, Graviton3 = Neoverse V1,
# AmpereOne = ampere1 (Armv8.6, no SVE), Snapdragon X = Oryon (Armv8.7, no SVE).
_A64_V82 = ("neon", "fp16", "dotprod", "rdm", "lse")
_A64_CPUS = {
    "generic": ("neon",),
    "armv8-a": ("neon",),
    "armv8.2-a": ("neon", "rdm", "lse"),
    "cortex-a55": _A64_V82,
    "cortex-a76": _A64_V82,
    "neoverse-n1": _A64_V82,
    "neoverse-v1": (*_A64_V82, "fhm", "i8mm", "bf16", "sve"),
    "neoverse-n2": (*_A64_V82, "fhm", "i8mm", "bf16", "sve", "sve2"),
    "ampere1": (*_A64_V82, "fhm", "i8mm", "bf16"),
    "oryon-1": (*_A64_V82, "fhm", "i8mm", "bf16"),
    "apple-m1": (*_A64_V82, "fhm"),
}

# riscv64: the RVA profiles name extension sets; spacemit-x60 (Banana Pi F3 / K1) = RVA22 + V.
_RV64GC = ("m", "a", "f", "d", "c")
_RVA22 = (*_RV64GC, "zba", "zbb", "zbs", "zihintpause")
_RV_CPUS = {
    "rv64gc": _RV64GC,
    "generic": _RV64GC,
    "sifive-u74": _RV64GC,
    "rva22u64": _RVA22,
    "rva23u64": (*_RVA22, "v"),
    "spacemit-x60": (*_RVA22, "v", "zfh", "zvfh"),
}

_PPC_CPUS = {
    "pwr8": ("power8",), "power8": ("power8",),
    "pwr9": ("power8", "power9"), "power9": ("power8", "power9"),
    "pwr10": ("power8", "power9", "power10", "mma"), "power10": ("power8", "power9", "power10", "mma"),
}

_Z_CPUS = {
    "z13": ("vector",), "arch11": ("vector",),
    "z14": ("vector", "vxe"), "arch12": ("vector", "vxe"),
    "z15": ("vector", "vxe", "vxe2"), "arch13": ("vector", "vxe", "vxe2"),
    "z16": ("vector", "vxe", "vxe2", "nnpa"), "arch14": ("vector", "vxe", "vxe2", "nnpa"),
}


def _ppc_cpu(f: frozenset[str]) -> str:
    return "pwr10" if "power10" in f else "pwr9" if "power9" in f else "pwr8"


def _z_cpu(f: frozenset[str]) -> str:
    return "z16" if "nnpa" in f else "z15" if "vxe2" in f else "z14" if "vxe" in f else "z13"


ARCHES: dict[str, ArchSpec] = {
    "x86_64": ArchSpec(
        "x86_64", "x86_64-unknown-linux-gnu", "small", "x86-64", {**_X86_LEVEL_CPUS, **_X86_NAMED},
        lambda f: "x86-64", tune_cpus=frozenset(_X86_NAMED), aliases=("amd64", "x86-64"),
        # No vectorized gathers or scatters: slow on AMD Zen and, since the Downfall microcode, on Intel.
        # The loop vectorizer otherwise vectorizes a depthwise convolution across channels with gathers
        # (Zen 5: 576 channels at 14x14, stride 2, 0.067 -> 0.027 ms; mobilenetv2 kernel sum -15 %). It
        # also turns the transposed GEMM's own masked scatter of C into scalar stores (llvm_gemm.py),
        # which measured no slower there.
        fixed_llvm_features=("+prefer-no-gather", "+prefer-no-scatter")),
    "aarch64": ArchSpec(
        "aarch64", "aarch64-unknown-linux-gnu", "small", "generic", _A64_CPUS, lambda f: "generic",
        tune_cpus=frozenset(_A64_CPUS) - {"generic", "armv8-a", "armv8.2-a"},
        fixed_llvm_features=("+fp-armv8", "-outline-atomics"),
        implies={"fp16": ("neon",), "fhm": ("fp16",), "dotprod": ("neon",), "rdm": ("neon",), "i8mm": ("neon",),
                 "bf16": ("neon",), "sve": ("fp16",), "sve2": ("sve",)},
        aliases=("arm64",)),
    "riscv64": ArchSpec(
        "riscv64", "riscv64-unknown-linux-gnu", "medium", "rv64gc", _RV_CPUS, lambda f: "generic-rv64",
        tune_cpus=frozenset({"sifive-u74", "spacemit-x60"}), abiname="lp64d",
        fixed_llvm_features=("-relax", "-save-restore"),
        implies={"d": ("f",), "v": ("d",), "zfh": ("f",), "zvfh": ("zfh", "v")}),
    "ppc64le": ArchSpec(
        "ppc64le", "powerpc64le-unknown-linux-gnu", "medium", "pwr8", _PPC_CPUS, _ppc_cpu,
        implies={"mma": ("power10",), "power10": ("power9",), "power9": ("power8",)},
        aliases=("powerpc64le",)),
    "s390x": ArchSpec(
        "s390x", "s390x-unknown-linux-gnu", "small", "z13", _Z_CPUS, _z_cpu,
        implies={"nnpa": ("vxe2",), "vxe2": ("vxe",), "vxe": ("vector",)},
        aliases=("systemz",)),
}

# The features every variant of an architecture has (the ABI's floor), added to any CPU.
BASELINE: dict[str, tuple[str, ...]] = {
    "x86_64": (), "aarch64": ("neon",), "riscv64": _RV64GC, "ppc64le": ("power8",), "s390x": ("vector",),
}
