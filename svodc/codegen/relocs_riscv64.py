"""riscv64 relocations (RISC-V ELF psABI), for code compiled with the medium code model and `-relax`
(no linker relaxation: instruction offsets are final when LLVM writes the object).

A PC-relative access is an `auipc` (HI20) plus an I- or S-type instruction (LO12) whose relocation
names the *auipc's label*, not the target: the LO12 value is the low part of the HI20's value, read
from the link state by the auipc's image offset. HI20 relocations are therefore applied first.
"""

from __future__ import annotations

from svodc.codegen.link import Place
from svodc.codegen.relocs import RelocArch, absolute64, unsupported
from svodc.errors import LinkError

R_64, R_BRANCH, R_JAL, R_CALL, R_CALL_PLT, R_GOT_HI20 = 2, 16, 17, 18, 19, 20
R_PCREL_HI20, R_PCREL_LO12_I, R_PCREL_LO12_S = 23, 24, 25
R_ADD32, R_ADD64, R_SUB32, R_SUB64 = 35, 36, 39, 40
R_ALIGN, R_RVC_BRANCH, R_RVC_JUMP, R_RELAX, R_32_PCREL = 43, 44, 45, 51, 57


def _hi_lo(value: int) -> tuple[int, int]:
    """Split a 32-bit PC-relative offset into auipc's 20 bits and a sign-extended 12-bit rest."""
    hi = (value + 0x800) >> 12
    return hi, value - (hi << 12)


def _i_imm(lo: int) -> int:
    return (lo & 0xFFF) << 20


def _s_imm(lo: int) -> int:
    return ((lo & 0xFE0) << 20) | ((lo & 0x1F) << 7)


def _b_imm(v: int) -> int:
    return (((v >> 12) & 1) << 31) | (((v >> 5) & 0x3F) << 25) | (((v >> 1) & 0xF) << 8) | (((v >> 11) & 1) << 7)


def _j_imm(v: int) -> int:
    return (((v >> 20) & 1) << 31) | (((v >> 1) & 0x3FF) << 21) | (((v >> 11) & 1) << 20) | (((v >> 12) & 0xFF) << 12)


def _hi20(p: Place, value: int, what: str) -> None:
    p.check(value, 32, what)
    p.state.pcrel_hi[p.offset] = value
    p.patch32(_hi_lo(value)[0] << 12, 0xFFFFF000)


def _lo12(p: Place, store: bool) -> None:
    if p.symbol not in p.state.pcrel_hi:
        raise LinkError(f"riscv64 PCREL_LO12 at image offset {p.offset:#x} names {p.name} at {p.symbol:#x}, which is "
                        "not the auipc of a PCREL_HI20/GOT_HI20 pair")
    lo = _hi_lo(p.state.pcrel_hi[p.symbol])[1]
    if store:
        p.patch32(_s_imm(lo), 0xFE000F80)
    else:
        p.patch32(_i_imm(lo), 0xFFF00000)


def _apply(rtype: int, p: Place) -> None:
    s_a = p.symbol + p.addend
    if rtype == R_PCREL_HI20:
        _hi20(p, s_a - p.offset, "riscv64 PCREL_HI20")
    elif rtype == R_GOT_HI20:
        _hi20(p, p.got + p.addend - p.offset, "riscv64 GOT_HI20")
    elif rtype in (R_PCREL_LO12_I, R_PCREL_LO12_S):
        _lo12(p, rtype == R_PCREL_LO12_S)
    elif rtype in (R_CALL, R_CALL_PLT):  # auipc ra, hi ; jalr ra, lo(ra)
        hi, lo = _hi_lo(p.check(s_a - p.offset, 32, "riscv64 CALL"))
        p.patch32(hi << 12, 0xFFFFF000)
        p.patch32(_i_imm(lo), 0xFFF00000, at=4)
    elif rtype == R_BRANCH:
        p.patch32(_b_imm(p.check(s_a - p.offset, 13, "riscv64 BRANCH", align=2)), 0xFE000F80)
    elif rtype == R_JAL:
        p.patch32(_j_imm(p.check(s_a - p.offset, 21, "riscv64 JAL", align=2)), 0xFFFFF000)
    elif rtype in (R_ADD32, R_SUB32, R_ADD64, R_SUB64):  # label differences in data (jump tables)
        fmt = "I" if rtype in (R_ADD32, R_SUB32) else "Q"
        mask = 0xFFFFFFFF if fmt == "I" else 0xFFFFFFFFFFFFFFFF
        sign = 1 if rtype in (R_ADD32, R_ADD64) else -1
        p.write(fmt, (p.read(fmt) + sign * s_a) & mask)
    elif rtype == R_32_PCREL:
        p.write("i", p.check(s_a - p.offset, 32, "riscv64 32_PCREL"))
    elif rtype == R_64:
        absolute64(p)
    elif rtype == R_RELAX:
        pass  # a hint that the previous relocation may be relaxed; we never relax
    else:  # R_ALIGN, RVC_*: only with linker relaxation, which svodc/arches.py turns off
        raise unsupported("riscv64", rtype, p)


ARCH = RelocArch("riscv64", _apply, got_types=frozenset({R_GOT_HI20}), first_pass=frozenset({R_PCREL_HI20, R_GOT_HI20}))
