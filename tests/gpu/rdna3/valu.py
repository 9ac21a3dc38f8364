"""Vector ALU instructions (VOP1, VOP2, VOPC, VOP3, VOP3SD, VOPD), vectorized over every lane of a batch.

OPS maps each opcode name to (source widths, function, result kind). Functions take uint32 (uint64
for 64-bit operands) lane arrays and return lane arrays; floats are handled as float32 views of the
bits. Result kinds: "v" a 32-bit VGPR, "v64" a VGPR pair, "v16" one half of a VGPR, "cmp" a lane
mask (VCC or an SGPR; EXEC for v_cmpx), "s" an SGPR (v_readfirstlane). 16-bit operands are true16:
VOP1/2/C name the half in bit 7 of a register field, VOP3 in op_sel.

Deliberate simplifications, each safe for IEEE-normal operands: FMA is computed in float64 and
rounded once to float32 (the product is exact; the sum can differ from a fused FMA by a rounding in
rare ties); v_div_scale_f32 does not rescale (it returns its operand, VCC 0) and v_div_fixup_f32
takes the special cases (zero, infinity, NaN) from NumPy's division -- operands near the float32
range limits would get fewer correct bits than on hardware.
"""

from __future__ import annotations

import numpy as np

from tests.gpu.rdna3 import wmma
from tests.gpu.rdna3.decode import VOP3SD, Instr
from tests.gpu.rdna3.wave import EXEC, LANES, LITERAL, MASK32, VCC, EmulationError, Waves

U32, U64, F32, F64 = np.uint32, np.uint64, np.float32, np.float64
M16 = U32(0xFFFF)


def f(x: np.ndarray) -> np.ndarray:
    return x.view(F32)


def bits(x: np.ndarray) -> np.ndarray:
    return np.asarray(x, F32).view(U32)


def _fma(a, b, c):
    return bits((f(a).astype(F64) * f(b) + f(c)).astype(F32))


def _cvt_i32(a):
    x = np.nan_to_num(np.trunc(f(a).astype(F64)), nan=0.0)
    return np.clip(x, -2.0 ** 31, 2.0 ** 31 - 1).astype(np.int64).astype(U32)


def _i24(a):
    return ((a & U32(0xFFFFFF)).astype(np.int64) ^ 0x800000) - 0x800000


def _med3(a, b, c):
    return np.maximum(np.minimum(a, b), np.minimum(np.maximum(a, b), c))


def _div_fixup(q, d, n):
    qf, df, nf = f(q), f(d), f(n)
    special = ~np.isfinite(df) | ~np.isfinite(nf) | (df == 0)
    sign = np.signbit(df) ^ np.signbit(nf)
    return bits(np.where(special, nf / np.where(special, df, F32(1)), np.where(sign, -np.abs(qf), np.abs(qf))))




def _class(a, m):
    x = f(a)
    neg, ax = np.signbit(x), np.abs(x)
    nan = np.isnan(x)
    quiet = (a & U32(0x400000)) != 0
    normal = (ax >= F32(2.0 ** -126)) & np.isfinite(x)
    denorm = (ax > 0) & (ax < F32(2.0 ** -126))
    cls = np.select([nan & ~quiet, nan, np.isinf(x) & neg, normal & neg, denorm & neg, (ax == 0) & neg,
                     (ax == 0), denorm, normal], list(range(9)), default=9).astype(U32)
    return ((m >> cls) & U32(1)) != 0


def _fcmp(op):
    return lambda a, b: op(f(a), f(b))


_CMP = {"lt": np.less, "eq": np.equal, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "ne": np.not_equal}

OPS: dict[str, tuple[tuple[int, ...], object, str]] = {
    "v_mov_b32": ((32,), lambda a: a, "v"),
    "v_mov_b16": ((16,), lambda a: a, "v16"),
    "v_readfirstlane_b32": ((32,), lambda a: a, "s"),
    "v_cvt_i32_f32": ((32,), _cvt_i32, "v"),
    "v_cvt_f32_f16": ((16,), lambda a: bits(a.astype(np.uint16).view(np.float16).astype(F32)), "v"),
    "v_cvt_f16_f32": ((32,), lambda a: f(a).astype(np.float16).view(np.uint16).astype(U32), "v16"),
    "v_rcp_f32": ((32,), lambda a: bits(F32(1) / f(a)), "v"),
    "v_sqrt_f32": ((32,), lambda a: bits(np.sqrt(f(a))), "v"),
    "v_add_f32": ((32, 32), lambda a, b: bits(f(a) + f(b)), "v"),
    "v_sub_f32": ((32, 32), lambda a, b: bits(f(a) - f(b)), "v"),
    "v_subrev_f32": ((32, 32), lambda a, b: bits(f(b) - f(a)), "v"),
    "v_mul_f32": ((32, 32), lambda a, b: bits(f(a) * f(b)), "v"),
    "v_max_f32": ((32, 32), lambda a, b: bits(np.fmax(f(a), f(b))), "v"),
    "v_fmac_f32": ((32, 32, 32), _fma, "v"),  # the accumulator (vdst) is the third source
    "v_fma_f32": ((32, 32, 32), _fma, "v"),
    "v_div_fmas_f32": ((32, 32, 32), _fma, "v"),
    "v_div_fixup_f32": ((32, 32, 32), _div_fixup, "v"),
    "v_div_scale_f32": ((32, 32, 32), lambda a, b, c: a, "v"),
    "v_mul_u32_u24": ((32, 32), lambda a, b: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)), "v"),
    "v_mul_hi_u32_u24": ((32, 32), lambda a, b: (((a & U32(0xFFFFFF)).astype(U64) * (b & U32(0xFFFFFF)))
                                                 >> U64(32)).astype(U32), "v"),
    "v_mul_i32_i24": ((32, 32), lambda a, b: (_i24(a) * _i24(b)).astype(U32), "v"),
    "v_mul_hi_i32_i24": ((32, 32), lambda a, b: ((_i24(a) * _i24(b)) >> 32).astype(U32), "v"),
    "v_mad_u32_u24": ((32, 32, 32), lambda a, b, c: (a & U32(0xFFFFFF)) * (b & U32(0xFFFFFF)) + c, "v"),
    "v_mul_lo_u32": ((32, 32), lambda a, b: a * b, "v"),
    "v_mul_hi_u32": ((32, 32), lambda a, b: ((a.astype(U64) * b) >> U64(32)).astype(U32), "v"),
    "v_lshlrev_b32": ((32, 32), lambda a, b: b << (a & U32(31)), "v"),
    "v_lshrrev_b32": ((32, 32), lambda a, b: b >> (a & U32(31)), "v"),
    "v_ashrrev_i32": ((32, 32), lambda a, b: (b.view(np.int32) >> (a & U32(31)).astype(np.int32)).view(U32), "v"),
    "v_and_b32": ((32, 32), lambda a, b: a & b, "v"),
    "v_or_b32": ((32, 32), lambda a, b: a | b, "v"),
    "v_add_nc_u32": ((32, 32), lambda a, b: a + b, "v"),
    "v_sub_nc_u32": ((32, 32), lambda a, b: a - b, "v"),
    "v_bfe_u32": ((32, 32, 32), lambda a, b, c: (a >> (b & U32(31))) &
                  ((U32(1) << (c & U32(31))) - U32(1)), "v"),
    "v_alignbit_b32": ((32, 32, 32), lambda a, b, c: (((a.astype(U64) << U64(32)) | b) >>
                                                      (c & U32(31)).astype(U64)).astype(U32), "v"),
    "v_med3_u32": ((32, 32, 32), _med3, "v"),
    "v_lshl_add_u32": ((32, 32, 32), lambda a, b, c: (a << (b & U32(31))) + c, "v"),
    "v_lshl_or_b32": ((32, 32, 32), lambda a, b, c: (a << (b & U32(31))) | c, "v"),
    "v_and_or_b32": ((32, 32, 32), lambda a, b, c: (a & b) | c, "v"),
    "v_add3_u32": ((32, 32, 32), lambda a, b, c: a + b + c, "v"),
    "v_add_lshl_u32": ((32, 32, 32), lambda a, b, c: (a + b) << (c & U32(31)), "v"),
    "v_lshlrev_b64": ((32, 64), lambda a, b: b << (a & U32(63)).astype(U64), "v64"),
    "v_lshrrev_b64": ((32, 64), lambda a, b: b >> (a & U32(63)).astype(U64), "v64"),
    "v_add_nc_u16": ((16, 16), lambda a, b: a + b, "v16"),
    "v_sub_nc_u16": ((16, 16), lambda a, b: a - b, "v16"),
    "v_mul_lo_u16": ((16, 16), lambda a, b: a * b, "v16"),
    "v_max_u16": ((16, 16), np.maximum, "v16"),
    "v_med3_u16": ((16, 16, 16), _med3, "v16"),
    "v_lshlrev_b16": ((16, 16), lambda a, b: b << (a & U32(15)), "v16"),
    "v_lshrrev_b16": ((16, 16), lambda a, b: b >> (a & U32(15)), "v16"),
    "v_and_b16": ((16, 16), lambda a, b: a & b, "v16"),
    "v_or_b16": ((16, 16), lambda a, b: a | b, "v16"),
    "v_mad_u16": ((16, 16, 16), lambda a, b, c: a * b + c, "v16"),
    "v_cmp_o_f32": ((32, 32), lambda a, b: ~(np.isnan(f(a)) | np.isnan(f(b))), "cmp"),
    "v_cmp_u_f32": ((32, 32), lambda a, b: np.isnan(f(a)) | np.isnan(f(b)), "cmp"),
    "v_cmp_nge_f32": ((32, 32), lambda a, b: ~(f(a) >= f(b)), "cmp"),
    "v_cmp_nlt_f32": ((32, 32), lambda a, b: ~(f(a) < f(b)), "cmp"),
    "v_cmp_ngt_f32": ((32, 32), lambda a, b: ~(f(a) > f(b)), "cmp"),
    "v_cmp_nle_f32": ((32, 32), lambda a, b: ~(f(a) <= f(b)), "cmp"),
    "v_cmp_class_f32": ((32, 32), _class, "cmp"),
}
for _rel, _fn in _CMP.items():
    OPS[f"v_cmp_{_rel}_f32"] = ((32, 32), _fcmp(_fn), "cmp")
    for _t, _w in (("u16", 16), ("u32", 32), ("u64", 64)):
        OPS[f"v_cmp_{_rel}_{_t}"] = ((_w, _w), _fn, "cmp")
        OPS[f"v_cmpx_{_rel}_{_t}"] = ((_w, _w), _fn, "cmp")
    for _op in ("v_cmp", "v_cmpx"):
        OPS[f"{_op}_{_rel}_i64"] = ((64, 64), lambda a, b, fn=_fn: fn(a.view(np.int64), b.view(np.int64)), "cmp")
FLOAT_MODS = {n for n in OPS if "_f32" in n} | {"v_cndmask_b32"}


def _half(x: np.ndarray, hi: int) -> np.ndarray:
    return (x >> U32(16)) if hi else (x & M16)


def _sources(w: Waves, ins: Instr, widths: tuple[int, ...]) -> list[np.ndarray]:
    """The sources of a VOP1/VOP2/VOPC/VOP3 instruction, modifiers applied."""
    fl = ins.f
    if ins.enc == "VOP3":
        codes = [fl["src0"], fl["src1"], 256 + fl["vdst"] if ins.name == "v_fmac_f32" else fl["src2"]][:len(widths)]
        hi = [(fl["opsel"] >> i) & 1 for i in range(3)]
    else:
        codes = [fl["src0"], 256 + fl["vsrc1"] if "vsrc1" in fl else None, 256 + fl.get("vdst", 0)][:len(widths)]
        hi = [0, 0, 0]
        for i, c in enumerate(codes):
            if widths[i] == 16 and c >= 256:  # true16 in a 32-bit encoding: bit 7 of the register picks the half
                codes[i], hi[i] = 256 + ((c - 256) & 127), (c - 256) >> 7
    out = []
    for i, (c, width) in enumerate(zip(codes, widths, strict=True)):
        x = w.vread(c, ins.literal, width)
        if width == 16:
            x = _half(x, hi[i]) if c >= 256 else x & M16
        out.append(x)
    if ins.enc == "VOP3" and (fl["abs"] or fl["neg"]) and ins.name not in VOP3SD:
        if ins.name not in FLOAT_MODS:
            raise EmulationError(f"RDNA3 emulator: abs/neg modifiers on integer {ins.where()}")
        for i in range(len(out)):
            if (fl["abs"] >> i) & 1:
                out[i] = out[i] & U32(0x7FFFFFFF)
            if (fl["neg"] >> i) & 1:
                out[i] = out[i] ^ U32(0x80000000)
    return out


def _mask_operand(w: Waves, ins: Instr) -> np.ndarray:
    """The lane mask a v_cndmask / v_add_co_ci reads: VCC in 32-bit encodings, the src2 SGPR in VOP3."""
    return w.lane_mask(w.sread(ins.f["src2"], ins.literal) if ins.enc == "VOP3" else w.s[VCC])


def _write_mask(w: Waves, ins: Instr, mask: np.ndarray, field: str = "vdst") -> None:
    """A per-lane result bit (inactive lanes 0) to VCC (32-bit encodings) or the SGPR of `field` (VOP3)."""
    value = w.to_bits(mask & w.exec_mask())
    w.swrite(ins.f[field] if ins.enc == "VOP3" else VCC, value)


def _carry_ops(w: Waves, ins: Instr) -> None:
    name, fl = ins.name, ins.f
    if name == "v_add_co_u32":
        a, b = _sources(w, ins, (32, 32))
        r = a.astype(U64) + b
    elif name == "v_add_co_ci_u32":
        a, b = _sources(w, ins, (32, 32))
        r = a.astype(U64) + b + _mask_operand(w, ins).astype(U64)
    elif name in ("v_sub_co_u32", "v_sub_co_ci_u32", "v_subrev_co_ci_u32"):  # the carry out is the borrow
        a, b = _sources(w, ins, (32, 32))
        if name == "v_subrev_co_ci_u32":  # S1 - S0 - borrow
            a, b = b, a
        sub = b.astype(U64) + (_mask_operand(w, ins).astype(U64) if name != "v_sub_co_u32" else U64(0))
        borrow = sub > a  # before the write: a is a view of its VGPR, which may be vdst (v0 = v0 - v6)
        w.vwrite(fl["vdst"], ((a.astype(U64) - sub) & U64(MASK32)).astype(U32))
        _write_mask(w, ins, borrow, "sdst")
        return
    elif name == "v_mad_u64_u32":
        a, b, c = _sources(w, ins, (32, 32, 64))
        prod = a.astype(U64) * b
        r64 = prod + c
        w.vwrite64(fl["vdst"], r64)
        _write_mask(w, ins, r64 < c, "sdst")
        return
    else:  # v_div_scale_f32: no rescaling (see the module docstring)
        a, _, _ = _sources(w, ins, (32, 32, 32))
        w.vwrite(fl["vdst"], a)
        _write_mask(w, ins, np.zeros(w.n * LANES, bool), "sdst")
        return
    w.vwrite(fl["vdst"], (r & U64(MASK32)).astype(U32))
    _write_mask(w, ins, (r >> U64(32)) != 0, "sdst")


def execute_valu(w: Waves, ins: Instr) -> None:
    name, fl = ins.name, ins.f
    if ins.enc == "VOP3" and (fl["clamp"] or (fl["omod"] and name not in VOP3SD)):
        raise EmulationError(f"RDNA3 emulator: clamp/omod on {ins.where()} is not implemented")
    if name in VOP3SD:
        _carry_ops(w, ins)
        return
    if name == "v_cndmask_b32":
        a, b = _sources(w, ins, (32, 32))
        w.vwrite(fl["vdst"], np.where(_mask_operand(w, ins), b, a))
        return
    if name == "v_div_fmas_f32" and (w.s[VCC] & w.s[EXEC]).any():
        raise EmulationError(f"RDNA3 emulator: {ins.where()} with VCC set (a rescaled division)")
    if name in ("v_fmamk_f32", "v_fmaak_f32"):  # VOP2 only; K is the literal after the instruction
        a, b = _sources(w, ins, (32, 32))
        k = np.full(w.n * LANES, ins.literal, U32)
        w.vwrite(fl["vdst"], _fma(a, k, b) if name == "v_fmamk_f32" else _fma(a, b, k))  # S0*K+S1, S0*S1+K
        return
    widths, fn, kind = OPS[name]
    srcs = _sources(w, ins, widths)
    r = fn(*srcs)
    if kind == "v":
        w.vwrite(fl["vdst"], r)
    elif kind == "v64":
        w.vwrite64(fl["vdst"], r)
    elif kind == "v16":
        hi = (fl["opsel"] >> 3) & 1 if ins.enc == "VOP3" else fl["vdst"] >> 7
        reg = fl["vdst"] if ins.enc == "VOP3" else fl["vdst"] & 127
        old = w.v[reg]
        r = r.astype(U32) & M16
        w.vwrite(reg, (old & U32(0xFFFF)) | (r << U32(16)) if hi else (old & U32(0xFFFF0000)) | r)
    elif kind == "s":  # the first active lane of each wave (lane 0 if none is)
        lane = w.exec_mask().reshape(w.n, LANES).argmax(1)
        w.swrite(fl["vdst"], r.reshape(w.n, LANES)[np.arange(w.n), lane])
    elif name.startswith("v_cmpx"):
        w.s[EXEC] = w.to_bits(r & w.exec_mask())
    else:
        _write_mask(w, ins, r)


def execute_vopd(w: Waves, ins: Instr) -> None:
    """Two independent operations; both read their sources before either writes."""
    fl = ins.f
    names = ins.name.split("::")
    results = []
    for name, src0, vsrc1, vdst in ((names[0], fl["src0x"], fl["vsrcx1"], fl["vdstx"]),
                                    (names[1], fl["src0y"], fl["vsrcy1"], fl["vdsty"])):
        a = w.vread(src0, ins.literal)
        b = w.v[vsrc1]
        if name == "v_mov_b32":
            r = a.copy()  # a view of its VGPR, which the other operation may write first
        elif name == "v_cndmask_b32":
            r = np.where(w.lane_mask(w.s[VCC]), b, a)
        elif name == "v_fmac_f32":
            r = _fma(a, b, w.v[vdst])
        elif name == "v_fmaak_f32":
            r = _fma(a, b, np.full(w.n * LANES, ins.literal, U32))
        elif name == "v_fmamk_f32":
            r = _fma(a, np.full(w.n * LANES, ins.literal, U32), b)
        else:
            r = OPS[name][1](a, b)
        results.append((vdst, r))
    for vdst, r in results:
        w.vwrite(vdst, r)


def execute_vop3p(w: Waves, ins: Instr) -> None:
    """WMMA (wmma.py), or v_pk_mul_lo_u16: two 16-bit products, the low one of the halves op_sel picks, the high
    one of those op_sel_hi picks (a 32-bit literal is two halves like a VGPR; LLVM packs x*60 and y*2 into one)."""
    if ins.name.startswith("v_wmma"):
        wmma.execute_wmma(w, ins)
        return
    fl = ins.f
    if fl["neg"] or fl["neg_hi"] or fl["clamp"]:
        raise EmulationError(f"RDNA3 emulator: modifiers on {ins.where()} are not implemented")
    codes = (fl["src0"], fl["src1"])
    if any(c < 256 and c != LITERAL for c in codes):
        raise EmulationError(f"RDNA3 emulator: {ins.where()} with a scalar or inline-constant operand")
    x, y = (w.vread(c, ins.literal) for c in codes)
    lo, hi = ((_half(x, (sel >> 0) & 1) * _half(y, (sel >> 1) & 1)) & M16 for sel in (fl["opsel"], fl["opsel_hi"]))
    w.vwrite(fl["vdst"], lo | (hi << U32(16)))
