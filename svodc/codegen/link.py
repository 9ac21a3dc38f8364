"""Our own static linker: ELF relocatable objects -> one flat, position-independent code image.

Layout: executable sections, then read-only data, then a GOT (if any code asks for one), each
aligned as its section requires. Every PC-relative relocation is resolved here, at compile time;
what is left is a list of base fixups: 64-bit words (GOT entries, absolute pointers in data) to
which the runtime adds the image's load address before it makes the image executable. Code bytes
are never patched at run time.

Architecture-specific parts live in relocs_<arch>.py (registered in relocs.py): how each relocation
type is computed, which ones go through the GOT, which must be applied first (riscv64: the HI20
half of a PC-relative pair, whose value its LO12 half reads), and linker-defined symbols (ppc64:
`.TOC.`, the TOC base, placed inside the image so TOC-relative addressing is image-relative).

Invariant: the image is loaded at an address aligned to at least 4 KiB (the runtime maps it on a
page boundary), so page-relative relocations (aarch64 ADRP) resolved here stay valid after loading.

Refused, with a LinkError naming the symbol or section: an undefined symbol (a code image is
self-contained: no libm, no libc), a writable or zero-initialized data section (the image is
mapped read+execute, shared by all threads), and relocations this linker does not know.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from svodc.codegen.elf import (
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHF_WRITE,
    SHN_ABS,
    SHN_COMMON,
    SHN_UNDEF,
    SHT_NOBITS,
    STB_LOCAL,
    ObjectFile,
)
from svodc.errors import LinkError


@dataclass
class CodeImage:
    data: bytes
    symbols: dict[str, int]  # exported function -> offset in the image
    fixups: list[int] = field(default_factory=list)  # offsets of 64-bit words: add the load address
    text_size: int = 0


@dataclass
class Place:
    """Where a relocation writes and what it refers to, in image offsets."""
    image: bytearray
    offset: int  # P
    symbol: int  # S
    addend: int  # A
    got: int  # G: the image offset of the symbol's GOT entry (-1 when none)
    name: str  # for error messages
    fixups: list[int]
    little_endian: bool
    state: LinkState
    local_entry: int = 0  # ppc64 ELFv2: bytes from the symbol's global to its local entry point

    def write(self, fmt: str, value: int, at: int = 0) -> None:
        struct.pack_into(("<" if self.little_endian else ">") + fmt, self.image, self.offset + at, value)

    def read(self, fmt: str, at: int = 0) -> int:
        return struct.unpack_from(("<" if self.little_endian else ">") + fmt, self.image, self.offset + at)[0]

    def patch32(self, value: int, mask: int, at: int = 0) -> None:
        """Replace the bits `mask` of the 32-bit instruction word at the place (+at) with `value`'s."""
        word = self.read("I", at)
        self.write("I", (word & ~mask & 0xFFFFFFFF) | (value & mask), at)

    def check(self, value: int, bits: int, what: str, align: int = 1) -> int:
        """`value` must fit a signed `bits`-bit field and be a multiple of `align`."""
        if not -(1 << (bits - 1)) <= value < (1 << (bits - 1)):
            raise LinkError(f"{what} relocation at image offset {self.offset:#x} to {self.name}: value {value} does "
                            f"not fit {bits} bits")
        if value % align:
            raise LinkError(f"{what} relocation at image offset {self.offset:#x} to {self.name}: value {value} is not "
                            f"a multiple of {align}")
        return value


@dataclass
class LinkState:
    """What relocations of one link share: the TOC base (ppc64) and the values of the HI20 halves of
    riscv64 PC-relative pairs, by the image offset of their auipc."""
    toc: int = 0
    pcrel_hi: dict[int, int] = field(default_factory=dict)


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _skip(name: str) -> bool:
    return name.startswith((".eh_frame", ".note", ".comment", ".debug", ".llvm"))


def link(objects: list[ObjectFile], exports: list[str]) -> CodeImage:
    from svodc.codegen import relocs

    if not objects:
        raise LinkError("nothing to link")
    machine = objects[0].machine
    arch = relocs.for_machine(machine)
    got_types = arch.got_types

    # 1. layout
    base: dict[tuple[int, int], int] = {}  # (object index, section index) -> image offset
    size = 0
    text_end = 0
    for phase in ("text", "rodata"):
        for oi, obj in enumerate(objects):
            for s in obj.sections:
                if not s.flags & SHF_ALLOC or _skip(s.name) or s.size == 0:
                    continue
                if s.flags & SHF_WRITE or s.type == SHT_NOBITS:
                    raise LinkError(f"{obj.name}: section {s.name} holds writable data ({s.size} bytes); a code "
                                    "image must be read-only (no mutable globals in generated code)")
                if (phase == "text") != bool(s.flags & SHF_EXECINSTR):
                    continue
                size = _align(size, s.addralign)
                base[(oi, s.index)] = size
                size += s.size
        if phase == "text":
            text_end = size

    # 2. symbols (and linker-defined ones: the TOC base goes after the code and data, see relocs_ppc64)
    globals_: dict[str, int] = {}
    others: dict[str, int] = {}  # st_other of each global's definition
    state = LinkState()
    if arch.toc_symbol:
        state.toc = _align(size, 8) + arch.toc_bias
        globals_[arch.toc_symbol] = state.toc
    for oi, obj in enumerate(objects):
        for sym in obj.symbols:
            if sym.bind == STB_LOCAL or sym.shndx in (SHN_UNDEF,) or not sym.name:
                continue
            if sym.shndx in (SHN_ABS, SHN_COMMON) or (oi, sym.shndx) not in base:
                raise LinkError(f"{obj.name}: symbol {sym.name} is not in a code or read-only data section")
            if sym.name in globals_:
                raise LinkError(f"symbol {sym.name} is defined twice")
            globals_[sym.name] = base[(oi, sym.shndx)] + sym.value
            others[sym.name] = sym.other

    def resolve(oi: int, si: int) -> tuple[int, str]:
        obj = objects[oi]
        sym = obj.symbols[si]
        if sym.shndx == SHN_UNDEF:
            if sym.name not in globals_:
                users = sorted({s.name for s in obj.symbols if s.type == 2 and s.bind != STB_LOCAL})[:3]
                raise LinkError(f"undefined symbol {sym.name!r} referenced from {obj.name} (functions {users}); "
                                "a code image cannot call external functions (libm, libc): every function must be "
                                "generated into the image")
            return globals_[sym.name], sym.name
        if (oi, sym.shndx) not in base:
            raise LinkError(f"{obj.name}: symbol {sym.name or '<section>'} points into a section that is not "
                            "part of the image")
        return base[(oi, sym.shndx)] + sym.value, sym.name

    # 3. GOT entries for the symbols code reaches through the GOT
    got: dict[int, int] = {}  # target image offset -> GOT entry offset
    wanted = sorted({resolve(oi, r.symbol)[0] for oi, obj in enumerate(objects) for si, rs in obj.relocs.items()
                     if (oi, si) in base for r in rs if r.type in got_types})
    size = _align(size, 8)
    for target in wanted:
        got[target] = size
        size += 8

    image = bytearray(size)
    for (oi, si), off in base.items():
        data = objects[oi].sections[si].data
        image[off: off + len(data)] = data
    fixups: list[int] = []
    le = objects[0].little_endian
    for target, entry in got.items():
        struct.pack_into("<Q" if le else ">Q", image, entry, target)
        fixups.append(entry)

    # 4. relocations; those in arch.first_pass before the rest (their results are read by others)
    for first in (True, False):
        for oi, obj in enumerate(objects):
            for si, rs in obj.relocs.items():
                if (oi, si) not in base:
                    continue
                for r in rs:
                    if (r.type in arch.first_pass) != first:
                        continue
                    s, name = resolve(oi, r.symbol)
                    sym = obj.symbols[r.symbol]
                    other = others.get(name, 0) if sym.shndx == SHN_UNDEF else sym.other
                    place = Place(image, base[(oi, si)] + r.offset, s, r.addend, got.get(s, -1), name, fixups, le,
                                  state, arch.local_entry(other))
                    arch.apply(r.type, place)

    missing = [e for e in exports if e not in globals_]
    if missing:
        raise LinkError(f"exported symbols not defined: {missing}")
    return CodeImage(bytes(image), {e: globals_[e] for e in exports}, sorted(fixups), text_end)
