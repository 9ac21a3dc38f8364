"""Relocation types per architecture: how each one is resolved into a flat image.

S = symbol's image offset, A = addend, P = place's image offset, G = the symbol's GOT entry offset.
PC-relative results are final (the image moves as a whole). Absolute 64-bit values are written as
image offsets and recorded as fixups (the runtime adds the load address). One file per
architecture (relocs_<arch>.py) holds the types LLVM emits there with our code models
(svodc/arches.py); anything else is a LinkError naming the type, so a new one is noticed, not
mis-linked.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from svodc.codegen.elf import EM_AARCH64, EM_PPC64, EM_RISCV, EM_S390, EM_X86_64
from svodc.codegen.link import Place
from svodc.errors import LinkError


@dataclass(frozen=True)
class RelocArch:
    name: str
    apply: Callable[[int, Place], None]
    got_types: frozenset[int] = frozenset()
    first_pass: frozenset[int] = frozenset()  # applied before all others (their results are read by others)
    toc_symbol: str = ""  # a symbol the linker defines as the TOC base (ppc64: ".TOC.")
    toc_bias: int = 0  # the TOC base lies this far past the end of code and data
    local_entry: Callable[[int], int] = lambda st_other: 0  # ppc64 ELFv2 local entry offset from st_other


def absolute64(p: Place) -> None:
    """An absolute 64-bit address: written as an image offset, fixed up by the loader."""
    p.write("Q", p.symbol + p.addend)
    p.fixups.append(p.offset)


def data_word(p: Place, rtype: int, pc32: tuple[int, str], pc64: int, abs64: int, arch: str) -> None:
    """The data relocations the architectures share: a 32-bit PC-relative word (pc32: its type and
    name, for the range error), a 64-bit PC-relative word, an absolute 64-bit address; anything
    else is unsupported."""
    s_a = p.symbol + p.addend
    if rtype == pc32[0]:
        p.write("i", p.check(s_a - p.offset, 32, f"{arch} {pc32[1]}"))
    elif rtype == pc64:
        p.write("q", s_a - p.offset)
    elif rtype == abs64:
        absolute64(p)
    else:
        raise unsupported(arch, rtype, p)


def for_machine(machine: int) -> RelocArch:
    from svodc.codegen import relocs_aarch64, relocs_ppc64, relocs_riscv64, relocs_s390x, relocs_x86_64

    arches = {EM_X86_64: relocs_x86_64.ARCH, EM_AARCH64: relocs_aarch64.ARCH, EM_RISCV: relocs_riscv64.ARCH,
              EM_PPC64: relocs_ppc64.ARCH, EM_S390: relocs_s390x.ARCH}
    try:
        return arches[machine]
    except KeyError:
        raise LinkError(f"ELF machine {machine} is not supported by the linker") from None


def unsupported(arch: str, rtype: int, p: Place) -> LinkError:
    return LinkError(f"{arch} relocation type {rtype} (against {p.name}, image offset {p.offset:#x}) is not supported "
                     "by the linker; it would need a new entry in svodc/codegen/relocs_*.py")
