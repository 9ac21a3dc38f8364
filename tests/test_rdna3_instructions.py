"""Single RDNA3 instructions in the emulator (tests/gpu/rdna3/), encoded here from the manual's field
layouts, on operands whose results the models rarely reach: SCC of signed overflow, bit-field
extracts, true16 halves picked by op_sel, 64-bit multiply-add carries, float classes. Expected values
come from Python integers and the IEEE definitions, lane by lane."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest

from tests.gpu.rdna3.runner import Emulator, Kernel
from tests.gpu.rdna3.wave import EXEC, LANES, MASK32, Memory, Waves

S_ENDPGM = 0xBFB00000
VGPR = 256
rng = np.random.default_rng(7)


def sop2(op: int, sdst: int, s0: int, s1: int) -> list[int]:
    return [(0b10 << 30) | (op << 23) | (sdst << 16) | (s1 << 8) | s0]


def vop3(op: int, vdst: int, s0: int, s1: int, s2: int = 0, opsel: int = 0, sdst: int | None = None) -> list[int]:
    mid = (sdst << 8) if sdst is not None else (opsel << 11)
    return [(0x35 << 26) | (op << 16) | mid | vdst, (s2 << 18) | (s1 << 9) | s0]


class _Code:
    def __init__(self, words: list[int]):
        self.image = struct.pack(f"<{len(words)}I", *words)


def run(words: list[int], sgprs: dict[int, int], vgprs: dict[int, np.ndarray]) -> Waves:
    """One wave, every lane on, runs `words` then s_endpgm."""
    emulator = Emulator(_Code([*words, S_ENDPGM]))  # type: ignore[arg-type]
    w = Waves(16, 1, Memory(), np.zeros(4, np.uint8), 4, np.zeros(LANES, np.int64))
    w.s[EXEC] = MASK32
    for r, value in sgprs.items():
        w.s[r] = value
    for r, lanes in vgprs.items():
        w.v[r] = lanes
    emulator._run(Kernel("snippet", None, [], {}), w, None)  # type: ignore[arg-type]
    assert w.done
    return w


def signed(x: int) -> int:
    return x - (1 << 32) if x >> 31 else x


@pytest.mark.parametrize(("a", "b"), [(0x7FFFFFFF, 1), (0x80000000, 0xFFFFFFFF), (5, 0xFFFFFFFD), (0, 0)])
def test_s_add_i32_and_s_sub_i32_set_scc_on_signed_overflow(a, b):
    for op, exact in ((0x2, signed(a) + signed(b)), (0x3, signed(a) - signed(b))):
        w = run(sop2(op, 2, 0, 1), {0: a, 1: b}, {})
        assert int(w.s[2][0]) == exact & MASK32
        assert int(w.scc[0]) == int(not -(1 << 31) <= exact < (1 << 31))


def test_s_bfe_u32_takes_offset_and_width_from_src1():
    for value, offset, width in ((0xDEADBEEF, 4, 8), (0xFFFFFFFF, 31, 1), (0x12345678, 0, 0), (0x80000001, 1, 31)):
        w = run(sop2(0x26, 2, 0, 1), {0: value, 1: offset | (width << 16)}, {})
        assert int(w.s[2][0]) == (value >> offset) & ((1 << width) - 1)
        assert int(w.scc[0]) == int(w.s[2][0] != 0)


@pytest.mark.parametrize("opsel", [0, 1, 2, 3, 8, 9, 10, 11])  # bit 0: src0 high, 1: src1 high, 3: dst high
def test_v_add_nc_u16_reads_and_writes_the_halves_op_sel_names(opsel):
    a, b, old = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(3))
    w = run(vop3(0x303, 3, VGPR + 1, VGPR + 2, opsel=opsel), {}, {1: a, 2: b, 3: old})
    for lane in range(LANES):
        x = (int(a[lane]) >> (16 * (opsel & 1))) & 0xFFFF
        y = (int(b[lane]) >> (16 * ((opsel >> 1) & 1))) & 0xFFFF
        dst_high = opsel >> 3
        kept = int(old[lane]) & (0xFFFF if dst_high else 0xFFFF0000)
        assert int(w.v[3][lane]) == kept | (((x + y) & 0xFFFF) << (16 * dst_high))


def test_v_mad_u64_u32_writes_the_pair_and_the_carry_mask():
    a, b = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    c = rng.integers(0, 1 << 64, LANES, dtype=np.uint64)
    c[:4] = np.uint64((1 << 64) - 1)  # these lanes carry unless a * b == 0
    lo, hi = (c & np.uint64(MASK32)).astype(np.uint32), (c >> np.uint64(32)).astype(np.uint32)
    w = run(vop3(0x2FE, 6, VGPR + 1, VGPR + 2, VGPR + 4, sdst=10), {}, {1: a, 2: b, 4: lo, 5: hi})
    carries = 0
    for lane in range(LANES):
        exact = int(a[lane]) * int(b[lane]) + int(c[lane])
        assert int(w.v[6][lane]) | (int(w.v[7][lane]) << 32) == exact & ((1 << 64) - 1)
        carries |= (exact >> 64) << lane
    assert int(w.s[10][0]) == carries


def test_v_cmp_class_f32_sets_one_bit_per_ieee_class():
    values = [math.nan, -math.inf, -1.5, -1e-40, -0.0, 0.0, 1e-40, 2.5, math.inf]
    classes = [1, 2, 3, 4, 5, 6, 7, 8, 9]  # quiet NaN .. +infinity, the manual's order
    x = np.array(values + [0.0] * (LANES - len(values)), np.float32).view(np.uint32)
    for c in range(10):
        w = run(vop3(0x7E, 2, VGPR + 1, 255, sdst=None) + [1 << c], {}, {1: x})
        want = sum(1 << lane for lane, k in enumerate(classes) if k == c)
        want |= sum(1 << lane for lane in range(len(values), LANES)) if c == 6 else 0  # the +0.0 padding
        assert int(w.s[2][0]) == want, f"class bit {c}"


@pytest.mark.parametrize("op, name", [(0x2C, "v_fmamk_f32"), (0x2D, "v_fmaak_f32")])
def test_v_fmamk_and_v_fmaak_take_their_constant_from_the_literal_after_them(op, name):
    """VOP2 with a trailing 32-bit K: fmamk is S0 * K + S1, fmaak is S0 * S1 + K (one rounding)."""
    a = rng.standard_normal(LANES).astype(np.float32)
    b = rng.standard_normal(LANES).astype(np.float32)
    k = np.float32(1.7)
    word = (op << 25) | (3 << 17) | (2 << 9) | (VGPR + 1)  # v3 = op(src0 v1, vsrc1 v2, K)
    w = run([word, int(np.array(k).view(np.uint32))], {}, {1: a.view(np.uint32), 2: b.view(np.uint32)})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = (a64 * k + b64) if name == "v_fmamk_f32" else (a64 * b64 + k)
    np.testing.assert_array_equal(w.v[3].view(np.float32), want.astype(np.float32))


def test_v_subrev_co_ci_u32_subtracts_the_other_way_with_the_borrow():
    """VOP3SD: D = S1 - S0 - borrow-in (a lane mask in an SGPR), borrow-out to sdst."""
    a, b = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    b[:3] = a[:3]  # equal operands: borrow exactly when one comes in
    borrow_in = int(rng.integers(0, 1 << 32))
    w = run(vop3(0x122, 3, VGPR + 1, VGPR + 2, 20, sdst=10), {20: borrow_in}, {1: a, 2: b})
    out = 0
    for lane in range(LANES):
        exact = int(b[lane]) - int(a[lane]) - ((borrow_in >> lane) & 1)
        assert int(w.v[3][lane]) == exact & MASK32
        out |= int(exact < 0) << lane
    assert int(w.s[10][0]) == out


def test_v_add_lshl_u32_and_v_mad_u16():
    """v_add_lshl_u32: (S0 + S1) << S2[4:0], 32-bit wrap; v_mad_u16: S0 * S1 + S2 in the low half,
    the high half of the destination kept."""
    a, b = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    s = rng.integers(0, 64, LANES).astype(np.uint32)
    w = run(vop3(0x247, 3, VGPR + 1, VGPR + 2, VGPR + 4), {}, {1: a, 2: b, 4: s})
    for lane in range(LANES):
        assert int(w.v[3][lane]) == (((int(a[lane]) + int(b[lane])) & MASK32) << (int(s[lane]) & 31)) & MASK32
    old = rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32)
    w = run(vop3(0x241, 3, VGPR + 1, VGPR + 2, VGPR + 4), {}, {1: a, 2: b, 4: s, 3: old})
    for lane in range(LANES):
        low = (int(a[lane]) & 0xFFFF) * (int(b[lane]) & 0xFFFF) + (int(s[lane]) & 0xFFFF)
        assert int(w.v[3][lane]) == (int(old[lane]) & 0xFFFF0000) | (low & 0xFFFF)


@pytest.mark.parametrize("op, name", [(0x300, "v_add_co_u32"), (0x301, "v_sub_co_u32"), (0x120, "v_add_co_ci_u32"),
                                      (0x121, "v_sub_co_ci_u32"), (0x122, "v_subrev_co_ci_u32")])
@pytest.mark.parametrize("in_place", [0, 1])  # vdst is src0 / src1
def test_carry_and_borrow_out_come_from_the_operands_when_vdst_is_a_source(op, name, in_place):
    """LLVM writes a 64-bit index update in place (v_sub_co_u32 v0, vcc_lo, v0, v6): the carry or borrow out
    is that of the operands read, not of the result just written over one of them. Lanes with equal
    operands and with a subtrahend between half and all of the minuend are where the two differ."""
    a, b = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    b[:4] = a[:4]
    b[4:8] = a[4:8] // 2 + 1
    carry_in = int(rng.integers(0, 1 << 32)) if "_ci_" in name else 0
    w = run(vop3(op, 1 + in_place, VGPR + 1, VGPR + 2, 20, sdst=10), {20: carry_in}, {1: a.copy(), 2: b.copy()})
    out = 0
    for lane in range(LANES):
        x, y, c = int(a[lane]), int(b[lane]), (carry_in >> lane) & 1
        exact = {"v_add_co_u32": x + y, "v_sub_co_u32": x - y, "v_add_co_ci_u32": x + y + c,
                 "v_sub_co_ci_u32": x - y - c, "v_subrev_co_ci_u32": y - x - c}[name]
        assert int(w.v[1 + in_place][lane]) == exact & MASK32
        out |= int(not 0 <= exact <= MASK32) << lane
    assert int(w.s[10][0]) == out


def test_vopd_reads_both_operations_sources_before_either_writes():
    """v_mov_b32 v2, v3 :: v_mov_b32 v3, v2 swaps the two registers."""
    x, y = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    mov = 0x8  # VOPD v_mov_b32 as opx and opy; vdsty = 3 (odd, the other bank from vdstx = 2): field 1
    words = [(0x32 << 26) | (mov << 22) | (mov << 17) | (VGPR + 3), (2 << 24) | (1 << 17) | (VGPR + 2)]
    w = run(words, {}, {2: x.copy(), 3: y.copy()})
    np.testing.assert_array_equal(w.v[2], y)
    np.testing.assert_array_equal(w.v[3], x)


def vop3p(op: int, vdst: int, s0: int, s1: int, opsel: int, opsel_hi: int) -> list[int]:
    return [(0x33 << 26) | (op << 16) | ((opsel_hi >> 2) << 14) | (opsel << 11) | vdst,
            ((opsel_hi & 3) << 27) | (s1 << 9) | s0]


@pytest.mark.parametrize("opsel", [0, 1, 2, 3])
@pytest.mark.parametrize("opsel_hi", [0, 1, 2, 3])
def test_v_pk_mul_lo_u16_multiplies_the_halves_op_sel_and_op_sel_hi_pick(opsel, opsel_hi):
    """Low half of D: the product of the halves op_sel picks (bit 0: src0's high, bit 1: src1's), high half:
    those op_sel_hi picks; each product kept to 16 bits. src0 a VGPR, then the 32-bit literal after it."""
    a, b = (rng.integers(0, 1 << 32, LANES, dtype=np.uint64).astype(np.uint32) for _ in range(2))
    literal = 0x2003C  # what LLVM packs for x * 60 and y * 2
    for words, x in ((vop3p(0x1, 3, VGPR + 1, VGPR + 2, opsel, opsel_hi), a),
                     (vop3p(0x1, 3, 255, VGPR + 2, opsel, opsel_hi) + [literal], np.full(LANES, literal, np.uint32))):
        w = run(words, {}, {1: a, 2: b})
        for lane in range(LANES):
            def half(v: int, high: int) -> int:
                return (v >> (16 * high)) & 0xFFFF
            lo = half(int(x[lane]), opsel & 1) * half(int(b[lane]), opsel >> 1) & 0xFFFF
            hi = half(int(x[lane]), opsel_hi & 1) * half(int(b[lane]), opsel_hi >> 1) & 0xFFFF
            assert int(w.v[3][lane]) == lo | (hi << 16)
