"""ppc64le relocations (64-bit ELF V2 ABI for Power), for the medium code model.

POWER8/9 code addresses data relative to the TOC pointer r2: `addis r, r2, x@toc@ha` +
`lfs f, x@toc@l(r)`. A function that uses r2 computes it in its *global entry* prologue from r12 (its
own address, which every indirect caller, ctypes included, puts there): `addis r2, r12,
(.TOC.-f)@ha; addi r2, r2, (.TOC.-f)@l`. We define `.TOC.` as an image offset (just past code and
data), so every TOC-relative value is an image-relative constant: nothing to fix up at load time. A
direct call (`bl`) goes to the callee's *local* entry (st_other bits 5-7), skipping that prologue:
one image has one TOC, so r2 is already right, and the `nop` after the `bl` stays a nop.

POWER10 code is PC-relative (prefixed instructions, PCREL34; calls REL24_NOTOC) and needs no TOC.
"""

from __future__ import annotations

from svodc.codegen.link import Place
from svodc.codegen.relocs import RelocArch, data_word
from svodc.errors import LinkError

R_REL24, R_REL32, R_ADDR64, R_REL64 = 10, 26, 38, 44
R_TOC16_LO, R_TOC16_HI, R_TOC16_HA, R_TOC16_DS, R_TOC16_LO_DS = 48, 49, 50, 63, 64
R_REL24_NOTOC, R_ENTRY, R_PCREL_OPT, R_PCREL34, R_GOT_PCREL34 = 116, 118, 123, 132, 133
R_REL16_LO, R_REL16_HI, R_REL16_HA = 250, 251, 252


def local_entry(st_other: int) -> int:
    """ELFv2: bytes from the global to the local entry point, encoded in st_other bits 5-7."""
    return ((1 << ((st_other >> 5) & 7)) >> 2) << 2


def _lo(v: int) -> int:
    return v & 0xFFFF


def _hi(v: int) -> int:
    return (v >> 16) & 0xFFFF


def _ha(v: int) -> int:
    return ((v + 0x8000) >> 16) & 0xFFFF


def _half16(p: Place, value: int) -> None:
    p.write("H", value)


def _half16_ds(p: Place, value: int, what: str) -> None:
    """DS-form: the low 2 bits of the field belong to the opcode; the value must be a multiple of 4."""
    if value & 3:
        raise LinkError(f"{what} at image offset {p.offset:#x} to {p.name}: {value:#x} is not a multiple of 4")
    p.write("H", (p.read("H") & 3) | (value & 0xFFFC))


def _pcrel34(p: Place, value: int, what: str) -> None:
    """A prefixed instruction: the prefix word holds bits 33-16 of the value, the suffix bits 15-0."""
    p.check(value, 34, what)
    p.patch32(value >> 16, 0x3FFFF)
    p.patch32(value, 0xFFFF, at=4)


def _apply(rtype: int, p: Place) -> None:
    s_a = p.symbol + p.addend
    toc_rel = s_a - p.state.toc
    if rtype in (R_TOC16_HA, R_TOC16_LO, R_TOC16_HI):
        p.check(toc_rel, 32, "ppc64 TOC16")
        _half16(p, {R_TOC16_HA: _ha, R_TOC16_LO: _lo, R_TOC16_HI: _hi}[rtype](toc_rel))
    elif rtype == R_TOC16_LO_DS:
        _half16_ds(p, _lo(toc_rel), "ppc64 TOC16_LO_DS")
    elif rtype == R_TOC16_DS:
        _half16_ds(p, p.check(toc_rel, 16, "ppc64 TOC16_DS") & 0xFFFF, "ppc64 TOC16_DS")
    elif rtype in (R_REL16_HA, R_REL16_LO, R_REL16_HI):
        v = p.check(s_a - p.offset, 32, "ppc64 REL16")
        _half16(p, {R_REL16_HA: _ha, R_REL16_LO: _lo, R_REL16_HI: _hi}[rtype](v))
    elif rtype == R_REL24:  # bl to a function sharing our TOC: its local entry
        v = p.check(s_a + p.local_entry - p.offset, 26, "ppc64 REL24", align=4)
        p.patch32(v, 0x03FFFFFC)
    elif rtype == R_REL24_NOTOC:  # the caller does not keep r2: the callee must not need it
        if p.local_entry:
            raise LinkError(f"ppc64 REL24_NOTOC call at image offset {p.offset:#x} to {p.name}, which uses the TOC: "
                            "mixing POWER10 PC-relative and TOC code in one image needs call stubs we do not build")
        p.patch32(p.check(s_a - p.offset, 26, "ppc64 REL24_NOTOC", align=4), 0x03FFFFFC)
    elif rtype == R_PCREL34:
        _pcrel34(p, s_a - p.offset, "ppc64 PCREL34")
    elif rtype == R_GOT_PCREL34:
        _pcrel34(p, p.got + p.addend - p.offset, "ppc64 GOT_PCREL34")
    elif rtype in (R_PCREL_OPT, R_ENTRY):
        pass  # optimisation hints: the code is correct unchanged
    else:
        data_word(p, rtype, (R_REL32, "REL32"), R_REL64, R_ADDR64, "ppc64")


# The TOC base is conventionally 0x8000 past the start of the TOC so signed 16-bit offsets reach 64 KiB.
ARCH = RelocArch("ppc64le", _apply, got_types=frozenset({R_GOT_PCREL34}), toc_symbol=".TOC.", toc_bias=0x8000,
                 local_entry=local_entry)
