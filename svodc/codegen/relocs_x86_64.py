"""x86_64 relocations (System V psABI numbers)."""

from __future__ import annotations

from svodc.codegen.link import Place
from svodc.codegen.relocs import RelocArch, absolute64, unsupported

R_X86_64_64, R_X86_64_PC32, R_X86_64_PLT32, R_X86_64_GOTPCREL = 1, 2, 4, 9
R_X86_64_PC64, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX = 24, 41, 42


def _apply(rtype: int, p: Place) -> None:
    if rtype in (R_X86_64_PC32, R_X86_64_PLT32):
        p.write("i", p.check(p.symbol + p.addend - p.offset, 32, "x86_64 PC32"))
    elif rtype in (R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX):
        p.write("i", p.check(p.got + p.addend - p.offset, 32, "x86_64 GOTPCREL"))
    elif rtype == R_X86_64_PC64:
        p.write("q", p.symbol + p.addend - p.offset)
    elif rtype == R_X86_64_64:
        absolute64(p)
    else:
        raise unsupported("x86_64", rtype, p)


ARCH = RelocArch("x86_64", _apply, got_types=frozenset({R_X86_64_GOTPCREL, R_X86_64_GOTPCRELX, R_X86_64_REX_GOTPCRELX}))
