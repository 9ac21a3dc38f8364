"""Scalar instructions: SOP1, SOP2, SOPC, SOPK, SOPP (branches, waits, barriers, end) and SMEM loads.
Each handler runs one instruction on a Wave; wave.pc already points past it (branches overwrite it).
SCC follows the manual per opcode (carry, overflow, or "result is non-zero")."""

from __future__ import annotations

import struct

from tests.gpu.rdna3.decode import Instr
from tests.gpu.rdna3.wave import EXEC, MASK32, MASK64, NULL, Wave


def _signed32(x: int) -> int:
    return x - (1 << 32) if x & 0x80000000 else x


def _sop2(w: Wave, ins: Instr) -> None:
    f, name = ins.f, ins.name
    wide = name.endswith("_b64") and name != "s_lshl_b64"
    a = w.sread(f["ssrc0"], ins.literal, 64 if name.endswith("_b64") else 32)
    b = w.sread(f["ssrc1"], ins.literal, 64 if wide else 32)
    scc = None
    if name == "s_add_u32":
        r = a + b
        scc = r >> 32
    elif name == "s_addc_u32":
        r = a + b + w.scc
        scc = r >> 32
    elif name in ("s_add_i32", "s_sub_i32"):
        sa, sb = _signed32(a), _signed32(b)
        exact = sa + sb if name == "s_add_i32" else sa - sb
        r = exact & MASK32
        scc = int(_signed32(r) != exact)
    elif name == "s_lshl_b32":
        r = (a << (b & 31)) & MASK32
    elif name == "s_lshl_b64":
        r = (a << (b & 63)) & MASK64
    elif name == "s_lshr_b32":
        r = a >> (b & 31)
    elif name == "s_ashr_i32":
        r = (_signed32(a) >> (b & 31)) & MASK32
    elif name == "s_and_b32":
        r = a & b
    elif name in ("s_or_b32", "s_or_b64"):
        r = a | b
    elif name == "s_bfe_u32":
        offset, width = b & 31, (b >> 16) & 0x7F
        r = (a >> offset) & ((1 << width) - 1)
    elif name == "s_mul_i32":
        w.swrite(f["sdst"], a * b)
        return
    elif name == "s_mul_hi_u32":
        w.swrite(f["sdst"], (a * b) >> 32)
        return
    elif name == "s_cselect_b32":
        w.swrite(f["sdst"], a if w.scc else b)
        return
    else:  # pragma: no cover - the decoder only names opcodes listed here
        raise AssertionError(name)
    w.swrite(f["sdst"], r, 64 if name.endswith("_b64") else 32)
    w.scc = int(scc) if scc is not None else int(r != 0)


def _sop1(w: Wave, ins: Instr) -> None:
    f, name = ins.f, ins.name
    if name == "s_mov_b32":
        w.swrite(f["sdst"], w.sread(f["ssrc0"], ins.literal))
    elif name == "s_mov_b64":
        w.swrite(f["sdst"], w.sread(f["ssrc0"], ins.literal, 64), 64)
    elif name == "s_and_saveexec_b32":
        src = w.sread(f["ssrc0"], ins.literal)
        old = w.s[EXEC]
        w.s[EXEC] = src & old
        w.swrite(f["sdst"], old)
        w.scc = int(w.s[EXEC] != 0)


def _sopc(w: Wave, ins: Instr) -> None:
    a = w.sread(ins.f["ssrc0"], ins.literal, 64)
    b = w.sread(ins.f["ssrc1"], ins.literal, 64)
    w.scc = int(a == b) if ins.name == "s_cmp_eq_u64" else int(a != b)


def _sopk(w: Wave, ins: Instr) -> None:  # s_mulk_i32: D = D * sign-extended simm16
    imm = ins.f["simm16"]
    imm -= (imm >> 15) << 16
    w.swrite(ins.f["sdst"], w.s[ins.f["sdst"]] * imm)


class Barrier(Exception):
    """Raised by s_barrier: the runner switches to the next wave of the workgroup."""


NO_EFFECT = {"s_nop", "s_set_inst_prefetch_distance", "s_clause", "s_delay_alu", "s_waitcnt_depctr", "s_waitcnt"}


def _sopp(w: Wave, ins: Instr) -> None:
    name = ins.name
    if name in NO_EFFECT:  # scheduling hints and waits: every access completes at once here
        return
    if name == "s_endpgm":
        w.done = True
        return
    if name == "s_barrier":
        raise Barrier
    imm = ins.f["simm16"]
    target = ins.pc + 4 + 4 * (imm - ((imm >> 15) << 16))
    taken = {"s_branch": True, "s_cbranch_scc0": w.scc == 0, "s_cbranch_scc1": w.scc == 1,
             "s_cbranch_execz": w.s[EXEC] == 0}[name]
    if taken:
        w.pc = target


def _smem(w: Wave, ins: Instr) -> None:
    f = ins.f
    ndw = {"s_load_b32": 1, "s_load_b64": 2, "s_load_b128": 4, "s_load_b256": 8, "s_load_b512": 16}[ins.name]
    base = w.s[f["sbase"]] | (w.s[f["sbase"] + 1] << 32)
    address = base + f["offset"] + (w.s[f["soffset"]] if f["soffset"] != NULL else 0)
    data = struct.unpack(f"<{ndw}I", w.memory.read(address, 4 * ndw, ins.where()))
    for i, d in enumerate(data):
        w.s[f["sdata"] + i] = d


HANDLERS = {"SOP1": _sop1, "SOP2": _sop2, "SOPC": _sopc, "SOPK": _sopk, "SOPP": _sopp, "SMEM": _smem}
