"""Relocation types per architecture: how each one is resolved into a flat image.

S = symbol's image offset, A = addend, P = place's image offset, G = the symbol's GOT entry offset.
PC-relative results are final (the image moves as a whole). Absolute 64-bit values are written as
image offsets and recorded as fixups (the runtime adds the load address).
"""

from __future__ import annotations

from collections.abc import Callable

from svodc.codegen.elf import EM_X86_64
from svodc.codegen.link import Place
from svodc.errors import LinkError

# x86_64 (System V psABI numbers)
R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_GOTPCREL = 1, 2, 4, 9
R_X86_64_PC64, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX = 24, 41, 42


def _pc32(p: Place, value: int) -> None:
    if not -(1 << 31) <= value < (1 << 31):
        raise LinkError(f"relocation to {p.name} out of 32-bit range ({value})")
    p.write("i", value)


def _x86_64(rtype: int, p: Place) -> None:
    if rtype in (R_X86_64_PC32, R_X86_64_PLT32):
        _pc32(p, p.symbol + p.addend - p.offset)
    elif rtype in (R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX):
        _pc32(p, p.got + p.addend - p.offset)
    elif rtype == R_X86_64_PC64:
        p.write("q", p.symbol + p.addend - p.offset)
    elif rtype == R_X86_64_64:
        p.write("Q", p.symbol + p.addend)
        p.fixups.append(p.offset)
    else:
        raise LinkError(f"x86_64 relocation type {rtype} (against {p.name}) is not supported")


_APPLIERS: dict[int, Callable[[int, Place], None]] = {EM_X86_64: _x86_64}
_GOT_TYPES: dict[int, frozenset[int]] = {
    EM_X86_64: frozenset({R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX}),
}


def applier(machine: int) -> Callable[[int, Place], None]:
    try:
        return _APPLIERS[machine]
    except KeyError:
        raise LinkError(f"ELF machine {machine} is not supported by the linker") from None


def got_types(machine: int) -> frozenset[int]:
    return _GOT_TYPES.get(machine, frozenset())
