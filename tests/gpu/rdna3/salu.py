"""Scalar instructions: SOP1, SOP2, SOPC, SOPK, SOPP (branches, waits, barriers, end) and SMEM loads,
for every wave of a batch at once ((W,) uint64 arrays of 32-bit values). waves.pc already points past
the instruction; a branch sets it, or, when the waves disagree, marks the batch for a split. SCC
follows the manual per opcode (carry, overflow, or "result is non-zero")."""

from __future__ import annotations

import numpy as np

from tests.gpu.rdna3.decode import Instr
from tests.gpu.rdna3.wave import EXEC, MASK32, NULL, VCC, Waves

U64 = np.uint64
M32 = U64(MASK32)
NO_EFFECT = {"s_nop", "s_set_inst_prefetch_distance", "s_clause", "s_delay_alu", "s_waitcnt_depctr", "s_waitcnt"}


def _signed(x: np.ndarray) -> np.ndarray:
    return x.astype(np.int64) - ((x & U64(0x80000000)) != 0).astype(np.int64) * (1 << 32)


def _sop2(w: Waves, ins: Instr) -> None:
    f, name = ins.f, ins.name
    a = w.sread(f["ssrc0"], ins.literal, 64 if name.endswith("_b64") else 32)
    b = w.sread(f["ssrc1"], ins.literal, 64 if name == "s_or_b64" else 32)
    scc = None
    if name == "s_add_u32":
        r = a + b
        scc = r >> U64(32)
    elif name == "s_addc_u32":
        r = a + b + w.scc
        scc = r >> U64(32)
    elif name in ("s_add_i32", "s_sub_i32"):
        exact = _signed(a) + _signed(b) if name == "s_add_i32" else _signed(a) - _signed(b)
        r = exact.astype(U64) & M32
        scc = (_signed(r) != exact).astype(U64)
    elif name == "s_lshl_b32":
        r = (a << (b & U64(31))) & M32
    elif name == "s_lshl_b64":
        r = a << (b & U64(63))
    elif name == "s_lshr_b32":
        r = a >> (b & U64(31))
    elif name == "s_ashr_i32":
        r = (_signed(a) >> (b & U64(31)).astype(np.int64)).astype(U64) & M32
    elif name == "s_lshr_b64":
        r = a >> (b & U64(63))
    elif name == "s_and_b32":
        r = a & b
    elif name == "s_and_not1_b32":
        r = a & ~b & M32
    elif name in ("s_or_b32", "s_or_b64"):
        r = a | b
    elif name == "s_bfe_u32":
        r = (a >> (b & U64(31))) & ((U64(1) << ((b >> U64(16)) & U64(0x7F))) - U64(1))
    elif name == "s_mul_i32":
        w.swrite(f["sdst"], a * b)
        return
    elif name == "s_mul_hi_u32":
        w.swrite(f["sdst"], (a * b) >> U64(32))
        return
    elif name == "s_cselect_b32":
        w.swrite(f["sdst"], np.where(w.scc != 0, a, b))
        return
    else:  # pragma: no cover - the decoder only names opcodes listed here
        raise AssertionError(name)
    w.swrite(f["sdst"], r, 64 if name.endswith("_b64") else 32)
    w.scc = scc if scc is not None else (r != 0).astype(U64)


def _sop1(w: Waves, ins: Instr) -> None:
    f, name = ins.f, ins.name
    if name == "s_mov_b32":
        w.swrite(f["sdst"], w.sread(f["ssrc0"], ins.literal).copy())
    elif name == "s_mov_b64":
        w.swrite(f["sdst"], w.sread(f["ssrc0"], ins.literal, 64).copy(), 64)
    elif name == "s_and_saveexec_b32":
        src = w.sread(f["ssrc0"], ins.literal).copy()
        old = w.s[EXEC].copy()
        w.s[EXEC] = src & old
        w.swrite(f["sdst"], old)
        w.scc = (w.s[EXEC] != 0).astype(U64)


def _sopc(w: Waves, ins: Instr) -> None:
    a = w.sread(ins.f["ssrc0"], ins.literal, 64)
    b = w.sread(ins.f["ssrc1"], ins.literal, 64)
    w.scc = (a == b if ins.name == "s_cmp_eq_u64" else a != b).astype(U64)


def _sopk(w: Waves, ins: Instr) -> None:  # s_mulk_i32: D = D * sign-extended simm16
    imm = ins.f["simm16"]
    imm -= (imm >> 15) << 16
    w.swrite(ins.f["sdst"], w.s[ins.f["sdst"]] * U64(imm & 0xFFFFFFFFFFFFFFFF))


class Barrier(Exception):
    """Raised by s_barrier: the runner parks the batch until every wave of the dispatch is at one."""


def _sopp(w: Waves, ins: Instr) -> None:
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
    if name == "s_branch":
        w.pc = target
        return
    taken = {"s_cbranch_scc0": w.scc == 0, "s_cbranch_scc1": w.scc == 1, "s_cbranch_execz": w.s[EXEC] == 0,
             "s_cbranch_execnz": w.s[EXEC] != 0, "s_cbranch_vccnz": w.s[VCC] != 0,
             "s_cbranch_vccz": w.s[VCC] == 0}[name]
    if taken.all():
        w.pc = target
    elif taken.any():
        w.split, w.target = taken, target


def _smem(w: Waves, ins: Instr) -> None:
    f = ins.f
    ndw = {"s_load_b32": 1, "s_load_b64": 2, "s_load_b128": 4, "s_load_b256": 8, "s_load_b512": 16}[ins.name]
    base = w.s[f["sbase"]] | (w.s[f["sbase"] + 1] << U64(32))
    offset = w.s[f["soffset"]] if f["soffset"] != NULL else U64(0)
    address = base + U64(f["offset"] & 0xFFFFFFFFFFFFFFFF) + offset
    data = w.memory.gather(address, 4 * ndw, ins.where()).view("<u4").reshape(w.n, ndw)
    for i in range(ndw):
        w.s[f["sdata"] + i] = data[:, i]


HANDLERS = {"SOP1": _sop1, "SOP2": _sop2, "SOPC": _sopc, "SOPK": _sopk, "SOPP": _sopp, "SMEM": _smem}
