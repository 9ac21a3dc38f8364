"""A reader for the ELF64 relocatable objects LLVM emits: sections, symbols and RELA relocations.
Little- and big-endian. Only what the linker needs."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from svodc.errors import LinkError

SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 2, 3, 4, 8, 9
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
EM_PPC64, EM_S390, EM_X86_64, EM_AARCH64, EM_RISCV = 21, 22, 62, 183, 243


@dataclass
class Section:
    index: int
    name: str
    type: int
    flags: int
    data: bytes
    size: int
    addralign: int
    link: int
    info: int


@dataclass
class Symbol:
    name: str
    value: int
    size: int
    bind: int
    type: int
    shndx: int
    other: int = 0  # st_other: visibility, and on ppc64 ELFv2 the local entry point offset (bits 5-7)


@dataclass
class Reloc:
    offset: int
    type: int
    symbol: int
    addend: int


@dataclass
class ObjectFile:
    name: str
    machine: int
    little_endian: bool
    sections: list[Section]
    symbols: list[Symbol]
    relocs: dict[int, list[Reloc]] = field(default_factory=dict)  # target section index -> relocations


def read_object(data: bytes, name: str = "<object>") -> ObjectFile:
    if data[:4] != b"\x7fELF":
        raise LinkError(f"{name}: not an ELF file")
    if data[4] != 2:
        raise LinkError(f"{name}: not a 64-bit ELF object")
    le = data[5] == 1
    e = "<" if le else ">"
    (e_type, machine, _, _, _, shoff, _, _, _, _, shentsize, shnum, shstrndx) = struct.unpack_from(
        e + "HHIQQQIHHHHHH", data, 16)
    if e_type != 1:
        raise LinkError(f"{name}: not a relocatable object (e_type {e_type})")
    raw = [struct.unpack_from(e + "IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    shstr = raw[shstrndx]
    strtab_data = data[shstr[4]: shstr[4] + shstr[5]]

    def cstr(table: bytes, off: int) -> str:
        return table[off: table.index(b"\0", off)].decode()

    sections = []
    for i, (nm, typ, flags, _addr, off, size, link, info, align, _ent) in enumerate(raw):
        body = b"" if typ == SHT_NOBITS else data[off: off + size]
        sections.append(Section(i, cstr(strtab_data, nm), typ, flags, body, size, max(align, 1), link, info))
    symbols: list[Symbol] = []
    for s in sections:
        if s.type == SHT_SYMTAB:
            strs = sections[s.link].data
            for j in range(len(s.data) // 24):
                nm, info, other, shndx, value, size = struct.unpack_from(e + "IBBHQQ", s.data, j * 24)
                symbols.append(Symbol(cstr(strs, nm), value, size, info >> 4, info & 0xF, shndx, other))
    obj = ObjectFile(name, machine, le, sections, symbols)
    for s in sections:
        if s.type == SHT_REL:
            raise LinkError(f"{name}: REL relocations (section {s.name}) are not supported; expected RELA")
        if s.type == SHT_RELA:
            rel = []
            for j in range(len(s.data) // 24):
                off, info, addend = struct.unpack_from(e + "QQq", s.data, j * 24)
                rel.append(Reloc(off, info & 0xFFFFFFFF, info >> 32, addend))
            obj.relocs.setdefault(s.info, []).extend(rel)
    return obj
