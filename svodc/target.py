"""Targets: what a code image is compiled for.

A target string names one or more code variants (a fat bundle has several):

    TARGETS := ITEM ("," ITEM)*
    ITEM    := "host" | ARCH["-linux-gnu"][":" CPU] | CPU      (a bare CPU continues the previous ARCH)
    CPU     := NAME ("+" FEATURE)*

e.g. `x86_64-linux-gnu:x86-64-v3,x86-64`, `x86_64,aarch64`, `aarch64:neoverse-v1,generic+dotprod`,
`riscv64:rv64gc+v`, `s390x:z15`. ARCH is x86_64, aarch64, riscv64, ppc64le or s390x (svodc/arches.py
lists aliases and CPU names); without a CPU, the architecture's most portable one. Each variant is
resolved to an explicit set of named feature bits from svodrt's table (closed under implication),
and code is generated for exactly those features: an explicit +/- list for every feature in the
table on a generic LLVM CPU (on ppc64le/s390x the CPU of the ISA level), tuned for a named CPU. So
the features a bundle records are the features its code can use, never "native".

A bundle's data has one byte order (docs/bundle-format.md), so its variants are all little-endian
or all big-endian (s390x).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from svodc.arches import ARCHES, BASELINE, ArchSpec
from svodc.errors import TargetError
from svodrt.features import BYTE_ORDER, FEATURES

_OS_SUFFIXES = ("linux-gnu", "unknown-linux-gnu", "linux", "pc-linux-gnu")


@dataclass(frozen=True)
class Target:
    arch: str  # "x86_64", "aarch64", "riscv64", "ppc64le", "s390x"
    triple: str  # LLVM triple
    cpu: str  # what the user asked for, resolved ("znver4", "x86-64-v3", "generic+dotprod")
    features: tuple[str, ...]  # our feature names, in table order: exactly what the code may use
    # (L1d, L2) bytes per core as this machine reports them, for a `host` target (host_caches); 0 where
    # unknown: the tuned CPU's table entry then. A hypervisor may show the guest a CPU model that names
    # another CPU (an Intel server core seen as "rocketlake"), while the cache sizes it reports are the
    # ones the code will meet.
    caches: tuple[int, int] = (0, 0)

    @property
    def spec(self) -> ArchSpec:
        return ARCHES[self.arch]

    @property
    def llvm_cpu(self) -> str:
        return self.spec.llvm_cpu(frozenset(self.features))

    @property
    def tune_cpu(self) -> str:
        name = self.cpu.split("+", 1)[0]
        return name if name in self.spec.tune_cpus else "generic"

    @property
    def llvm_features(self) -> str:
        on = set(self.features)
        table = [("+" if f.name in on else "-") + f.llvm for f in FEATURES[self.arch]]
        return ",".join([*table, *self.spec.fixed_llvm_features])

    @property
    def abiname(self) -> str:
        return self.spec.abiname

    @property
    def codemodel(self) -> str:
        return self.spec.codemodel

    @property
    def byte_order(self) -> str:
        return BYTE_ORDER[self.arch]

    @property
    def native_f16(self) -> bool:
        """Whether the CPU converts float16<->float32 in hardware (else svodc/codegen/emulate.py does it
        with integer ops: LLVM would call compiler-rt). s390x has no such instruction at any level."""
        return {"x86_64": "f16c" in self.features, "aarch64": True, "riscv64": "zfh" in self.features,
                "ppc64le": "power9" in self.features, "s390x": False}[self.arch]

    @property
    def native_roundeven(self) -> bool:
        """Whether the CPU rounds to nearest even in one instruction (SSE4.1 roundps/pd, aarch64 frintn),
        which llvm.roundeven becomes; elsewhere it would call libm, so codegen/transcendental.py rewrites ROUND."""
        return self.arch == "aarch64" or (self.arch == "x86_64" and "sse4.1" in self.features)

    @property
    def vector_bits(self) -> int:
        """The vector register width kernels can count on (SVE and RVV: their 128-bit minimum)."""
        if "avx512f" in self.features:
            return 512
        if "avx" in self.features:
            return 256
        return 128

    @property
    def fma_bits(self) -> int:
        """The width one FMA executes at, as far as the target names the CPU: vector_bits, except on Zen 4
        (znver4), which runs a 512-bit operation as two 256-bit halves. A generic x86-64-v4 counts as 512
        (Zen 5 desktop and server, Intel server cores); Zen 4, Zen 5 mobile and Intel client parts running
        such a variant get 512-bit choices they may not gain from (svodc/policy.py's GEMM accumulators)."""
        return 256 if self.tune_cpu == "znver4" else self.vector_bits

    @property
    def vector_regs(self) -> int:
        """Vector registers (x86-64 AVX2: 16, AVX-512: 32; NEON/SVE, RVV, z/Arch vector: 32; VSX: 64).
        rv64gc has no vector unit: its 32 FP registers hold fixed vectors as scalars, so 16."""
        if self.arch == "x86_64":
            return 32 if "avx512f" in self.features else 16
        if self.arch == "riscv64" and "v" not in self.features:
            return 16
        return 64 if self.arch == "ppc64le" else 32

    @property
    def l1d_bytes(self) -> int:
        """L1 data cache per core: the host's own for a `host` target, else the tuned CPU's where L1D_BYTES
        knows it, else the architecture's common size (for blocking only: a wrong guess costs speed, never
        correctness)."""
        return self.caches[0] or L1D_BYTES.get(self.tune_cpu, L1D_BYTES[self.arch])

    @property
    def l2_bytes(self) -> int:
        """L2 cache per core: the host's own for a `host` target, else the tuned CPU's where L2_BYTES knows
        it, else the architecture's common size (for blocking only, like l1d_bytes)."""
        return self.caches[1] or L2_BYTES.get(self.tune_cpu, L2_BYTES[self.arch])

    def describe(self) -> str:
        return f"{self.arch}:{self.cpu}"


# L1 data cache bytes per core by tuned CPU name (Target.tune_cpu), and by architecture for the rest
# (x86-64 and POWER cores: 32 KiB; Arm Neoverse: 64 KiB; z/Arch: 128 KiB).
L1D_BYTES = {"x86_64": 32 << 10, "aarch64": 64 << 10, "riscv64": 32 << 10, "ppc64le": 32 << 10, "s390x": 128 << 10,
             "icelake-server": 48 << 10, "sapphirerapids": 48 << 10, "znver5": 48 << 10, "cortex-a55": 32 << 10,
             "apple-m1": 128 << 10}

# L2 bytes per core likewise (the architectures' sizes are the small end of their common cores).
L2_BYTES = {"x86_64": 256 << 10, "aarch64": 512 << 10, "riscv64": 256 << 10, "ppc64le": 256 << 10, "s390x": 1 << 20,
            "haswell": 256 << 10, "skylake": 256 << 10, "skylake-avx512": 1 << 20, "cascadelake": 1 << 20,
            "icelake-server": 1280 << 10, "sapphirerapids": 2 << 20, "znver2": 512 << 10, "znver3": 512 << 10,
            "znver4": 1 << 20, "znver5": 1 << 20, "cortex-a55": 128 << 10, "cortex-a76": 512 << 10,
            "neoverse-n1": 1 << 20, "neoverse-n2": 1 << 20, "neoverse-v1": 1 << 20}


def host_target() -> Target:
    """This machine, as LLVM sees it, restricted to the features in our table."""
    import llvmlite.binding as llvm

    arch = _host_arch()
    if arch not in ARCHES:
        raise TargetError(f"host architecture {arch} is not supported; supported: {sorted(ARCHES)}")
    host = llvm.get_host_cpu_features()
    names = {f.name for f in FEATURES[arch] if host.get(f.llvm, False)} | set(BASELINE[arch])
    spec = ARCHES[arch]
    return Target(arch, spec.triple, llvm.get_host_cpu_name(), spec.closure(names), host_caches())


def host_caches(root: str = "/sys/devices/system/cpu/cpu0/cache") -> tuple[int, int]:
    """(L1d, L2) bytes of this machine's first CPU from Linux's sysfs (0 for a level it does not report:
    no sysfs, or an unreadable entry). Read by `host` only: a named CPU is compiled for whatever machine
    the bundle will run on."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    found = {}
    for entry in Path(root).glob("index*"):
        try:
            level, kind, size = ((entry / name).read_text().strip() for name in ("level", "type", "size"))
            found[(int(level), kind)] = int(size[:-1]) * units[size[-1]] if size[-1:] in units else int(size)
        except (OSError, ValueError):
            continue
    return found.get((1, "Data"), 0), found.get((2, "Unified"), 0)


def _host_arch() -> str:
    import platform

    return _arch_name(platform.machine().lower()) or platform.machine().lower()


def _arch_name(word: str) -> str | None:
    for name, spec in ARCHES.items():
        if word == name or word in spec.aliases:
            return name
    return None


def _resolve_cpu(arch: str, cpu: str) -> Target:
    spec = ARCHES[arch]
    if cpu == "host":
        t = host_target()
        if t.arch != arch:
            raise TargetError(f"'host' CPU requested for {arch}, but this machine is {t.arch}")
        return t
    name, *extra = cpu.split("+")
    if name not in spec.cpus:
        raise TargetError(f"unknown {arch} CPU {name!r}; known: {', '.join(sorted([*spec.cpus, 'host']))}")
    known = {f.name for f in FEATURES[arch]}
    bad = [e for e in extra if e not in known]
    if bad:
        raise TargetError(f"unknown {arch} feature{'s' if len(bad) > 1 else ''} {bad} in {cpu!r}; "
                          f"known: {', '.join(f.name for f in FEATURES[arch])}")
    names = {*BASELINE[arch], *spec.cpus[name], *extra}
    return Target(arch, spec.triple, cpu, spec.closure(names))


def _split_arch(item: str) -> tuple[str, str] | None:
    """(arch, cpu or "") if `item` names an architecture (`aarch64`, `aarch64-linux-gnu:generic`)."""
    head, _, cpu = item.partition(":")
    for name, spec in ARCHES.items():
        for word in (name, *spec.aliases):
            if head == word:
                return name, cpu
            if head.startswith(word + "-"):
                rest = head[len(word) + 1:]
                if rest not in _OS_SUFFIXES:
                    raise TargetError(f"target {item!r}: only Linux targets are supported, not {rest!r}")
                return name, cpu
    return None


def parse_target(spec: str) -> list[Target]:
    """A target string (see the module doc) -> one Target per variant, in the given order (the runtime
    picks the first that fits its host: list the most capable first)."""
    targets: list[Target] = []
    arch: str | None = None
    for raw in spec.split(","):
        item = raw.strip()
        if not item:
            raise TargetError(f"target {spec!r} has an empty item")
        if item == "host":
            t = host_target()
            targets.append(t)
            arch = t.arch
            continue
        # A CPU of the current architecture wins over an architecture alias ("x86-64" is both).
        if arch is not None and item.split("+", 1)[0] in ARCHES[arch].cpus:
            targets.append(_resolve_cpu(arch, item))
            continue
        split = _split_arch(item)
        if split is None:
            if arch is None:
                raise TargetError(f"unknown target {item!r} in {spec!r}; an item is host, ARCH[-linux-gnu][:CPU] "
                                  f"or a CPU of the previous ARCH; architectures: {', '.join(ARCHES)}")
            targets.append(_resolve_cpu(arch, item))  # raises, naming the known CPUs
            continue
        arch, cpu = split
        targets.append(_resolve_cpu(arch, cpu or ARCHES[arch].default_cpu))
    orders = {t.byte_order: t for t in targets}
    if len(orders) > 1:
        raise TargetError(f"target {spec!r} mixes little-endian ({orders['little'].arch}) and big-endian "
                          f"({orders['big'].arch}) variants; a bundle holds its weights in one byte order: "
                          "compile one bundle per byte order")
    seen = set()
    for t in targets:
        if t.describe() in seen:
            raise TargetError(f"target {spec!r} names the variant {t.describe()} twice")
        seen.add(t.describe())
    return targets
