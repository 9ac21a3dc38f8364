"""s390x relocations (z/Architecture ELF ABI), big-endian. "DBL" relocations count halfwords:
PC-relative targets (larl, brasl, lgrl) are stored shifted right by one."""

from __future__ import annotations

from svodc.codegen.link import Place
from svodc.codegen.relocs import RelocArch, absolute64, unsupported

R_PC32, R_PC16DBL, R_PC32DBL, R_PLT32DBL, R_64, R_PC64, R_PLT64, R_GOTENT = 5, 17, 19, 20, 22, 23, 25, 26


def _apply(rtype: int, p: Place) -> None:
    s_a = p.symbol + p.addend
    if rtype in (R_PC32DBL, R_PLT32DBL):
        p.write("i", p.check(s_a - p.offset, 33, "s390x PC32DBL", align=2) >> 1)
    elif rtype == R_PC16DBL:
        p.write("h", p.check(s_a - p.offset, 17, "s390x PC16DBL", align=2) >> 1)
    elif rtype == R_GOTENT:
        p.write("i", p.check(p.got + p.addend - p.offset, 33, "s390x GOTENT", align=2) >> 1)
    elif rtype == R_PC32:
        p.write("i", p.check(s_a - p.offset, 32, "s390x PC32"))
    elif rtype in (R_PC64, R_PLT64):
        p.write("q", s_a - p.offset)
    elif rtype == R_64:
        absolute64(p)
    else:
        raise unsupported("s390x", rtype, p)


ARCH = RelocArch("s390x", _apply, got_types=frozenset({R_GOTENT}))
