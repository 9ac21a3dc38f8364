"""aarch64 relocations (ELF for the Arm 64-bit Architecture, AAELF64).

ADRP computes a 4 KiB page difference: Page(S+A) - Page(P). It is resolved here, which is valid
because the image is loaded 4 KiB-aligned (see link.py). The LO12 halves are the low 12 bits of the
target, scaled by the access size for loads and stores.
"""

from __future__ import annotations

from svodc.codegen.link import Place
from svodc.codegen.relocs import RelocArch, data_word

R_ABS64, R_PREL64, R_PREL32 = 257, 260, 261
R_LD_PREL_LO19, R_ADR_PREL_LO21, R_ADR_PREL_PG_HI21, R_ADD_ABS_LO12_NC = 273, 274, 275, 277
R_TSTBR14, R_CONDBR19, R_JUMP26, R_CALL26 = 279, 280, 282, 283
R_ADR_GOT_PAGE, R_LD64_GOT_LO12_NC = 311, 312
# LDSTn_ABS_LO12_NC -> log2 of the access size in bytes (the scale of the 12-bit immediate)
_LDST_SHIFT = {278: 0, 284: 1, 285: 2, 286: 3, 299: 4}


def _page(x: int) -> int:
    return x & ~0xFFF


def _adr(p: Place, value: int, what: str) -> None:
    """ADR/ADRP immediate: immlo in bits 29-30, immhi in bits 5-23."""
    p.check(value, 21, what)
    p.patch32(((value & 3) << 29) | (((value >> 2) & 0x7FFFF) << 5), (3 << 29) | (0x7FFFF << 5))


def _imm12(p: Place, target: int, shift: int, what: str) -> None:
    lo = target & 0xFFF
    if lo & ((1 << shift) - 1):
        p.check(lo, 32, what, align=1 << shift)
    p.patch32((lo >> shift) << 10, 0xFFF << 10)


def _branch(p: Place, value: int, bits: int, lsb: int, what: str) -> None:
    p.check(value, bits + 2, what, align=4)
    mask = ((1 << bits) - 1) << lsb
    p.patch32(((value >> 2) << lsb) & mask, mask)


def _apply(rtype: int, p: Place) -> None:
    s_a = p.symbol + p.addend
    if rtype == R_ADR_PREL_PG_HI21:
        _adr(p, (_page(s_a) - _page(p.offset)) >> 12, "aarch64 ADR_PREL_PG_HI21")
    elif rtype == R_ADR_GOT_PAGE:
        _adr(p, (_page(p.got + p.addend) - _page(p.offset)) >> 12, "aarch64 ADR_GOT_PAGE")
    elif rtype == R_ADR_PREL_LO21:
        _adr(p, s_a - p.offset, "aarch64 ADR_PREL_LO21")
    elif rtype == R_ADD_ABS_LO12_NC:
        _imm12(p, s_a, 0, "aarch64 ADD_ABS_LO12_NC")
    elif rtype in _LDST_SHIFT:
        _imm12(p, s_a, _LDST_SHIFT[rtype], "aarch64 LDST_ABS_LO12_NC")
    elif rtype == R_LD64_GOT_LO12_NC:
        _imm12(p, p.got + p.addend, 3, "aarch64 LD64_GOT_LO12_NC")
    elif rtype in (R_CALL26, R_JUMP26):
        _branch(p, s_a - p.offset, 26, 0, "aarch64 CALL26/JUMP26")
    elif rtype in (R_CONDBR19, R_LD_PREL_LO19):
        _branch(p, s_a - p.offset, 19, 5, "aarch64 CONDBR19/LD_PREL_LO19")
    elif rtype == R_TSTBR14:
        _branch(p, s_a - p.offset, 14, 5, "aarch64 TSTBR14")
    else:
        data_word(p, rtype, (R_PREL32, "PREL32"), R_PREL64, R_ABS64, "aarch64")


ARCH = RelocArch("aarch64", _apply, got_types=frozenset({R_ADR_GOT_PAGE, R_LD64_GOT_LO12_NC}))
