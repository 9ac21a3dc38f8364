"""v_wmma_f32_16x16x16_f16 and _bf16 (VOP3P): D = A x B + C on 16 x 16 tiles, one per wave, in the wave32
layout of AMD's RDNA3 ISA manual: lane l holds row l % 16 of A and column l % 16 of B as 16 packed
halves in 8 VGPRs (k = 2 * register + half), and lanes 16-31 must hold the same as lanes 0-15;
C and D are 8 VGPRs, VGPR v of lane l being element [2 v + l // 16][l % 16]. Products of halves are
exact in float32; the sum runs in float32 in NumPy's order (the hardware's order is unspecified)."""

from __future__ import annotations

import numpy as np

from tests.gpu.rdna3.decode import Instr
from tests.gpu.rdna3.wave import LANES, EmulationError, Waves

HALF = 16


def _halves(w: Waves, code: int, ins: Instr) -> np.ndarray:
    """(W, 16 rows, 16 k) float32 values of an A or B operand (float16, or bfloat16 for the _bf16 form),
    checked to be replicated across half-waves."""
    if code < 256:
        raise EmulationError(f"RDNA3 emulator: {ins.where()} with a constant A/B operand")
    regs = w.v[code - 256: code - 256 + 8].reshape(8, w.n, LANES)
    packed = np.ascontiguousarray(regs.transpose(1, 2, 0))  # (W, lane, register)
    lanes = packed.view(np.uint16).reshape(w.n, LANES, HALF)  # k = 2 * register + (high half)
    if not np.array_equal(lanes[:, :HALF], lanes[:, HALF:]):
        raise EmulationError(f"RDNA3 emulator: {ins.where()}: lanes 16-31 do not repeat lanes 0-15 of an operand")
    if ins.name.endswith("_bf16"):  # the high half of a float32
        return (lanes[:, :HALF].astype(np.uint32) << 16).view(np.float32)
    return lanes[:, :HALF].view(np.float16).astype(np.float32)


def execute_wmma(w: Waves, ins: Instr) -> None:
    fl = ins.f
    if fl["neg"] or fl["neg_hi"] or fl["opsel"] or fl["clamp"]:
        raise EmulationError(f"RDNA3 emulator: modifiers on {ins.where()} are not implemented")
    if not w.exec_full():
        raise EmulationError(f"RDNA3 emulator: {ins.where()} with lanes disabled (WMMA needs EXEC all ones)")
    a = _halves(w, fl["src0"], ins)  # (W, m, k)
    b = _halves(w, fl["src1"], ins)  # (W, n, k)
    c = np.stack([w.vread(fl["src2"] + i if fl["src2"] >= 256 else fl["src2"], ins.literal) for i in range(8)])
    lane = np.arange(LANES)
    rows = 2 * np.arange(8)[:, None] + lane[None, :] // HALF  # (register, lane) -> row of C/D
    cols = np.broadcast_to(lane % HALF, rows.shape)
    acc = np.empty((w.n, HALF, HALF), np.float32)
    acc[:, rows, cols] = c.view(np.float32).reshape(8, w.n, LANES).transpose(1, 0, 2)
    d = np.einsum("wmk,wnk->wmn", a, b, dtype=np.float32) + acc
    out = d[:, rows, cols].transpose(1, 0, 2).reshape(8, w.n * LANES)
    for i in range(8):
        w.v[fl["vdst"] + i] = out[i].view(np.uint32)
