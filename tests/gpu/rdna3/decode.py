"""RDNA3 (gfx11) machine code -> instructions: the encodings of AMD's RDNA3 ISA manual, only the
opcodes Svod's kernels contain (the tables list them; tests/gpu/rdna3/objdump.py cross-checks every
instruction of our code objects against llvm-objdump). An encoding or opcode not in the tables is an
UnknownInstruction naming it and its PC.

VALU opcodes are keyed by their VOP3 number: VOPC n is VOP3 n, VOP2 n is VOP3 0x100 + n, VOP1 n is
VOP3 0x180 + n (the manual's promotion rule), so one semantic table serves every encoding.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

LITERAL = 255
VOP2_BASE, VOP1_BASE = 0x100, 0x180

SOP1 = {0x0: "s_mov_b32", 0x1: "s_mov_b64", 0x20: "s_and_saveexec_b32"}
SOP2 = {0x0: "s_add_u32", 0x2: "s_add_i32", 0x3: "s_sub_i32", 0x4: "s_addc_u32", 0x8: "s_lshl_b32",
        0x9: "s_lshl_b64", 0xa: "s_lshr_b32", 0xb: "s_lshr_b64", 0xc: "s_ashr_i32", 0x16: "s_and_b32", 0x18: "s_or_b32",
        0x19: "s_or_b64", 0x22: "s_and_not1_b32", 0x26: "s_bfe_u32", 0x2c: "s_mul_i32", 0x2d: "s_mul_hi_u32", 0x30: "s_cselect_b32"}
SOPC = {0x10: "s_cmp_eq_u64", 0x11: "s_cmp_lg_u64"}
SOPK = {0x10: "s_mulk_i32"}
SOPP = {0x0: "s_nop", 0x4: "s_set_inst_prefetch_distance", 0x5: "s_clause", 0x7: "s_delay_alu",
        0x8: "s_waitcnt_depctr", 0x9: "s_waitcnt", 0x20: "s_branch", 0x21: "s_cbranch_scc0",
        0x22: "s_cbranch_scc1", 0x23: "s_cbranch_vccz", 0x24: "s_cbranch_vccnz", 0x25: "s_cbranch_execz",
        0x26: "s_cbranch_execnz", 0x30: "s_endpgm", 0x3d: "s_barrier"}
SMEM = {0x0: "s_load_b32", 0x1: "s_load_b64", 0x2: "s_load_b128", 0x3: "s_load_b256", 0x4: "s_load_b512"}
VOP1 = {0x1: "v_mov_b32", 0x2: "v_readfirstlane_b32", 0x8: "v_cvt_i32_f32", 0xa: "v_cvt_f16_f32", 0xb: "v_cvt_f32_f16", 0x1c: "v_mov_b16",
        0x2a: "v_rcp_f32", 0x33: "v_sqrt_f32"}
VOP2 = {0x1: "v_cndmask_b32", 0x3: "v_add_f32", 0x4: "v_sub_f32", 0x5: "v_subrev_f32", 0x8: "v_mul_f32", 0x9: "v_mul_i32_i24",
        0xa: "v_mul_hi_i32_i24", 0xb: "v_mul_u32_u24", 0xc: "v_mul_hi_u32_u24", 0x10: "v_max_f32", 0x18: "v_lshlrev_b32",
        0x19: "v_lshrrev_b32", 0x1a: "v_ashrrev_i32", 0x1b: "v_and_b32", 0x1c: "v_or_b32", 0x20: "v_add_co_ci_u32", 0x21: "v_sub_co_ci_u32", 0x22: "v_subrev_co_ci_u32",
        0x25: "v_add_nc_u32", 0x26: "v_sub_nc_u32", 0x2b: "v_fmac_f32",
        0x2c: "v_fmamk_f32", 0x2d: "v_fmaak_f32"}
VOPC = {0x11: "v_cmp_lt_f32", 0x12: "v_cmp_eq_f32", 0x13: "v_cmp_le_f32", 0x14: "v_cmp_gt_f32",
        0x16: "v_cmp_ge_f32", 0x17: "v_cmp_o_f32", 0x18: "v_cmp_u_f32", 0x19: "v_cmp_nge_f32", 0x1b: "v_cmp_ngt_f32",
        0x1c: "v_cmp_nle_f32", 0x1e: "v_cmp_nlt_f32",
        0x3a: "v_cmp_eq_u16", 0x3c: "v_cmp_gt_u16", 0x3d: "v_cmp_ne_u16", 0x49: "v_cmp_lt_u32", 0x4c: "v_cmp_gt_u32", 0x4d: "v_cmp_ne_u32",
        0x51: "v_cmp_lt_i64", 0x53: "v_cmp_le_i64", 0x54: "v_cmp_gt_i64", 0x59: "v_cmp_lt_u64", 0x5a: "v_cmp_eq_u64", 0x5b: "v_cmp_le_u64", 0x5c: "v_cmp_gt_u64",
        0x5d: "v_cmp_ne_u64", 0x7e: "v_cmp_class_f32", 0xca: "v_cmpx_eq_u32", 0xcc: "v_cmpx_gt_u32", 0xd4: "v_cmpx_gt_i64",
        0xdc: "v_cmpx_gt_u64"}
VOP3_ONLY = {0x20b: "v_mad_u32_u24", 0x210: "v_bfe_u32", 0x213: "v_fma_f32", 0x216: "v_alignbit_b32",
             0x221: "v_med3_u32", 0x227: "v_div_fixup_f32", 0x237: "v_div_fmas_f32", 0x241: "v_mad_u16", 0x246: "v_lshl_add_u32", 0x247: "v_add_lshl_u32",
             0x251: "v_med3_u16", 0x255: "v_add3_u32", 0x256: "v_lshl_or_b32", 0x257: "v_and_or_b32", 0x2fc: "v_div_scale_f32",
             0x2fe: "v_mad_u64_u32", 0x300: "v_add_co_u32", 0x301: "v_sub_co_u32", 0x303: "v_add_nc_u16", 0x304: "v_sub_nc_u16",
             0x305: "v_mul_lo_u16", 0x309: "v_max_u16", 0x32c: "v_mul_lo_u32", 0x32d: "v_mul_hi_u32",
             0x338: "v_lshlrev_b16", 0x339: "v_lshrrev_b16", 0x33c: "v_lshlrev_b64", 0x33d: "v_lshrrev_b64",
             0x362: "v_and_b16", 0x363: "v_or_b16"}
VALU = VOPC | {VOP2_BASE + k: v for k, v in VOP2.items()} | {VOP1_BASE + k: v for k, v in VOP1.items()} | VOP3_ONLY
VOP3SD = {"v_add_co_u32", "v_add_co_ci_u32", "v_sub_co_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32", "v_mad_u64_u32", "v_div_scale_f32"}  # sdst in bits 14:8
VOP3P = {0x1: "v_pk_mul_lo_u16", 0x40: "v_wmma_f32_16x16x16_f16", 0x41: "v_wmma_f32_16x16x16_bf16"}
VOPD = {0x0: "v_fmac_f32", 0x1: "v_fmaak_f32", 0x2: "v_fmamk_f32", 0x3: "v_mul_f32", 0x4: "v_add_f32",
        0x5: "v_sub_f32", 0x8: "v_mov_b32", 0x9: "v_cndmask_b32", 0xa: "v_max_f32", 0x10: "v_add_nc_u32", 0x11: "v_lshlrev_b32",
        0x12: "v_and_b32"}
DS = {0xf: "ds_store_2addr_stride64_b32", 0x36: "ds_load_b32", 0x37: "ds_load_2addr_b32", 0xff: "ds_load_b128", 0x78: "ds_load_2addr_stride64_b64"}
GLOBAL = {0x12: "global_load_u16", 0x14: "global_load_b32", 0x15: "global_load_b64", 0x16: "global_load_b96", 0x17: "global_load_b128",
          0x1a: "global_store_b32", 0x1e: "global_load_d16_u8", 0x20: "global_load_d16_b16",
          0x23: "global_load_d16_hi_b16"}
MUBUF = {0x2b: "buffer_gl0_inv"}
FLAT_SEGMENT_GLOBAL = 2


class UnknownInstruction(Exception):
    """An encoding or opcode the emulator does not implement."""


@dataclass(slots=True)
class Instr:
    """One decoded instruction. `f` holds the encoding's fields by the manual's names (src0, vdst, ...);
    `literal` is the trailing 32-bit constant, None when there is none."""

    pc: int
    size: int
    enc: str
    op: int
    name: str
    f: dict[str, int]
    literal: int | None = None
    words: tuple[int, ...] = field(default=())

    def where(self) -> str:
        hexwords = " ".join(f"{w:08X}" for w in self.words)
        return f"{self.name} ({self.enc} opcode {self.op:#x}, {hexwords}) at PC {self.pc:#x}"


def _bits(w: int, hi: int, lo: int) -> int:
    return (w >> lo) & ((1 << (hi - lo + 1)) - 1)


def _unknown(enc: str, op: int, words: tuple[int, ...], pc: int) -> UnknownInstruction:
    hexwords = " ".join(f"{w:08X}" for w in words)
    return UnknownInstruction(f"RDNA3 emulator: unknown {enc} opcode {op:#x} ({hexwords}) at PC {pc:#x}; "
                              "implement it in tests/gpu/rdna3/")


def _classify(w: int) -> tuple[str, int]:
    if w >> 31 == 0:
        if w >> 25 == 0x3E:
            return "VOPC", _bits(w, 24, 17)
        if w >> 25 == 0x3F:
            return "VOP1", _bits(w, 16, 9)
        return "VOP2", _bits(w, 30, 25)
    if w >> 30 == 2:
        top9 = w >> 23
        if top9 == 0x17D:
            return "SOP1", _bits(w, 15, 8)
        if top9 == 0x17E:
            return "SOPC", _bits(w, 22, 16)
        if top9 == 0x17F:
            return "SOPP", _bits(w, 22, 16)
        if w >> 28 == 0xB:
            return "SOPK", _bits(w, 27, 23)
        return "SOP2", _bits(w, 29, 23)
    top6 = w >> 26
    encs = {0x3D: ("SMEM", 25, 18), 0x35: ("VOP3", 25, 16), 0x33: ("VOP3P", 22, 16), 0x32: ("VOPD", 25, 22),
            0x36: ("DS", 25, 18), 0x37: ("FLAT", 24, 18), 0x38: ("MUBUF", 25, 18)}
    if top6 not in encs:
        return f"encoding {top6:#x}", 0
    enc, hi, lo = encs[top6]
    return enc, _bits(w, hi, lo)


# field: (dword, high bit, low bit), for the encodings whose fields are plain bit ranges
_LAYOUTS = {
    "SOP1": {"sdst": (0, 22, 16), "ssrc0": (0, 7, 0)},
    "SOP2": {"sdst": (0, 22, 16), "ssrc1": (0, 15, 8), "ssrc0": (0, 7, 0)},
    "SOPC": {"ssrc1": (0, 15, 8), "ssrc0": (0, 7, 0)},
    "SOPK": {"sdst": (0, 22, 16), "simm16": (0, 15, 0)},
    "SOPP": {"simm16": (0, 15, 0)},
    "VOP1": {"vdst": (0, 24, 17), "src0": (0, 8, 0)},
    "VOP2": {"vdst": (0, 24, 17), "vsrc1": (0, 16, 9), "src0": (0, 8, 0)},
    "VOPC": {"vsrc1": (0, 16, 9), "src0": (0, 8, 0)},
    "DS": {"offset0": (0, 7, 0), "offset1": (0, 15, 8), "gds": (0, 17, 17), "addr": (1, 7, 0), "data0": (1, 15, 8),
           "data1": (1, 23, 16), "vdst": (1, 31, 24)},
}


def _fields(enc: str, w: int, w1: int) -> dict[str, int]:
    if enc in _LAYOUTS:
        words = (w, w1)
        return {name: _bits(words[i], hi, lo) for name, (i, hi, lo) in _LAYOUTS[enc].items()}
    if enc == "SMEM":
        off = _bits(w1, 20, 0)
        return {"sdata": _bits(w, 12, 6), "sbase": _bits(w, 5, 0) * 2, "offset": off - (1 << 21) * (off >> 20),
                "soffset": _bits(w1, 31, 25)}
    if enc in ("VOP3", "VOP3P"):  # VOP3P: op_sel is bits 13:11, bit 14 the third op_sel_hi bit
        return {"vdst": _bits(w, 7, 0), "abs": _bits(w, 10, 8), "sdst": _bits(w, 14, 8),
                "opsel": _bits(w, 14 if enc == "VOP3" else 13, 11),
                "clamp": _bits(w, 15, 15), "src0": _bits(w1, 8, 0), "src1": _bits(w1, 17, 9),
                "src2": _bits(w1, 26, 18), "omod": _bits(w1, 28, 27), "neg": _bits(w1, 31, 29),
                "opsel_hi": _bits(w1, 28, 27) | (_bits(w, 14, 14) << 2), "neg_hi": _bits(w, 10, 8)}
    if enc == "VOPD":
        vdstx = _bits(w1, 31, 24)
        return {"opx": _bits(w, 25, 22), "opy": _bits(w, 21, 17), "vsrcx1": _bits(w, 16, 9), "src0x": _bits(w, 8, 0),
                "vdstx": vdstx, "vdsty": (_bits(w1, 23, 17) << 1) | ((vdstx & 1) ^ 1), "vsrcy1": _bits(w1, 16, 9),
                "src0y": _bits(w1, 8, 0)}
    if enc == "FLAT":
        off = _bits(w, 12, 0)
        return {"seg": _bits(w, 17, 16), "offset": off - (1 << 13) * (off >> 12), "addr": _bits(w1, 7, 0),
                "data": _bits(w1, 15, 8), "saddr": _bits(w1, 22, 16), "vdst": _bits(w1, 31, 24)}
    return {}


_TABLES = {"SOP1": SOP1, "SOP2": SOP2, "SOPC": SOPC, "SOPK": SOPK, "SOPP": SOPP, "SMEM": SMEM, "VOP1": VOP1,
           "VOP2": VOP2, "VOPC": VOPC, "VOP3": VALU, "VOP3P": VOP3P, "DS": DS, "MUBUF": MUBUF}
_LONG = {"SMEM", "VOP3", "VOP3P", "VOPD", "DS", "FLAT", "MUBUF"}
_SRC_FIELDS = {"SOP1": ("ssrc0",), "SOP2": ("ssrc0", "ssrc1"), "SOPC": ("ssrc0", "ssrc1"), "VOP1": ("src0",),
               "VOP2": ("src0",), "VOPC": ("src0",), "VOP3": ("src0", "src1", "src2"),
               "VOP3P": ("src0", "src1", "src2"), "VOPD": ("src0x", "src0y")}
DPP_OR_SDWA = {233, 234, 249, 250}


def _name(enc: str, op: int, f: dict[str, int]) -> str | None:
    if enc == "VOPD":
        x, y = VOPD.get(f["opx"]), VOPD.get(f["opy"])
        return f"{x}::{y}" if x and y else None
    if enc == "FLAT":
        return GLOBAL.get(op) if f["seg"] == FLAT_SEGMENT_GLOBAL else None
    table = _TABLES.get(enc)
    return table.get(op) if table else None


def decode(code: bytes | memoryview, pc: int) -> Instr:
    """The instruction at byte offset `pc` of `code`."""
    w, = struct.unpack_from("<I", code, pc)
    enc, op = _classify(w)
    w1 = struct.unpack_from("<I", code, pc + 4)[0] if enc in _LONG else 0
    f = _fields(enc, w, w1)
    name = _name(enc, op, f)
    words = (w, w1) if enc in _LONG else (w,)
    if name is None:
        raise _unknown(enc, op, words, pc)
    size = 8 if enc in _LONG else 4
    needs_literal = any(f[k] == LITERAL for k in _SRC_FIELDS.get(enc, ()))
    if enc == "VOPD":
        needs_literal |= bool({f["opx"], f["opy"]} & {1, 2})  # fmaak / fmamk carry a constant
    needs_literal |= enc == "VOP2" and name in ("v_fmamk_f32", "v_fmaak_f32")
    literal = None
    if needs_literal:
        literal, = struct.unpack_from("<I", code, pc + size)
        words += (literal,)
        size += 4
    if enc.startswith("VOP") and any(f.get(k) in DPP_OR_SDWA for k in _SRC_FIELDS[enc]):
        raise UnknownInstruction(f"RDNA3 emulator: DPP/SDWA operand in {name} at PC {pc:#x} is not implemented")
    return Instr(pc, size, enc, op, name, f, literal, words)
