"""Emulated dtypes: float16, bfloat16, the float8/float4 formats and the narrow integers, rewritten
into float32 / int32 arithmetic and integer bit manipulation before emission.

No x86 level has float16 arithmetic, and baseline x86-64 has no float16 conversion either; LLVM
would turn `half` arithmetic and conversions into libcalls (__extendhfsf2...), which a code image
cannot have. So at the loop level:
- every ALU op whose result (or, for comparisons, whose operands) has an emulated dtype computes in
  float32 (int32): its operands are CAST up, its result CAST back -- one rounding per op, which is
  what numpy's float16 and ml_dtypes do (`svodc/ir/alu.py` is the reference);
- LOOP_REDUCE accumulates in float32 (int32) and rounds once at the end;
- every CAST to or from an emulated dtype becomes integer operations on the bits (`decode_float`,
  `encode_float`, `wrap_narrow_int`), ending in a BITCAST of same-size storage.
After this pass an emulated dtype only appears on LOAD, STORE, WHERE, CONST and BITCAST, which the
emitter handles as plain integers of the storage width (`llvm_types.ltype`) -- and, on targets with
conversion instructions (Target.native_f16: F16C, aarch64, Zfh, POWER9), on float16 <-> float32
CASTs, which the emitter turns into fpext/fptrunc (vcvtph2ps/vcvtps2ph, fcvt...: exact, and
round to nearest even like the integer code; float64 -> float16 keeps the integer code: LLVM would
call __truncdfhf2 for it).
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ALU, COMPARE, Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp
from svodrt.format import FLOAT_FORMATS

F32, F64 = dtypes.float32, dtypes.float64
U32, U64, I32, I64 = dtypes.uint32, dtypes.uint64, dtypes.int32, dtypes.int64


@dataclass(frozen=True)
class FloatFormat:
    """A small binary float format. kind: 'ieee' (exponent all ones is inf/NaN), 'fn' (no inf; the
    all-ones magnitude is NaN), 'fnuz' (no inf, no -0; 0x80 is the only NaN), 'sat' (no inf or NaN:
    overflow saturates)."""

    bits: int
    mant: int
    bias: int
    kind: str
    max_mag: int  # the largest finite magnitude encoding
    nan: int  # the NaN encoding produced (magnitude; the sign is added for ieee/fn)

    @property
    def inf_mag(self) -> int:
        return ((1 << (self.bits - 1 - self.mant)) - 1) << self.mant


def _format(nbits: int, mant: int, bias: int, kind: str) -> FloatFormat:
    """The encodings a format's kind implies (svodrt.format.FLOAT_FORMATS holds the formats)."""
    if kind == "ieee":
        top = (1 << (nbits - 1 - mant)) - 1
        return FloatFormat(nbits, mant, bias, kind, ((top - 1) << mant) | ((1 << mant) - 1),
                           (top << mant) | (1 << (mant - 1)))
    if kind == "fn":
        return FloatFormat(nbits, mant, bias, kind, (1 << (nbits - 1)) - 2, (1 << (nbits - 1)) - 1)
    if kind == "fnuz":
        return FloatFormat(nbits, mant, bias, kind, (1 << (nbits - 1)) - 1, 1 << (nbits - 1))
    return FloatFormat(nbits, mant, bias, kind, (1 << (nbits - 1)) - 1, 0)


FORMATS: dict[str, FloatFormat] = {name: _format(*f) for name, f in FLOAT_FORMATS.items() if f[3] != "e8m0"}


def _u(dt: DType, v: int) -> UOp:
    return UOp.const(dt, v)


def _storage_int(dt: DType) -> DType:
    """The unsigned integer with dt's storage size (the register type of its bits)."""
    return {1: dtypes.uint8, 2: dtypes.uint16, 4: U32, 8: U64}[dt.itemsize]


def _bits_of(x: UOp) -> UOp:
    """The storage bits of an emulated float value, zero-extended to uint32."""
    return UOp(Ops.BITCAST, _storage_int(x.dtype), (x,)).cast(U32)


def _from_bits(bits32: UOp, dt: DType) -> UOp:
    """A uint32 holding dt's encoding in its low bits -> a value of dt."""
    return UOp(Ops.BITCAST, dt, (bits32.cast(_storage_int(dt)),))


def decode_float(x: UOp) -> UOp:
    """An emulated float value -> the float32 with the same value (exact for every format)."""
    dt = x.dtype
    bits = _bits_of(x)
    if dt is dtypes.bfloat16:
        return UOp(Ops.BITCAST, F32, (bits.alu(Ops.SHL, 16),))
    if dt is dtypes.float8e8m0:  # 2**(e - 127); e = 0 is 2**-127 (a float32 subnormal); 0xFF is NaN
        f = bits.eq(_u(U32, 0)).where(_u(U32, 0x00400000), bits.alu(Ops.SHL, 23))
        return UOp(Ops.BITCAST, F32, (bits.eq(_u(U32, 0xFF)).where(_u(U32, 0x7FC00000), f),))
    fmt = FORMATS[dt.name]
    m_bits = fmt.mant
    sign = bits.alu(Ops.SHR, fmt.bits - 1)
    mag = bits.alu(Ops.AND, (1 << (fmt.bits - 1)) - 1)
    e = mag.alu(Ops.SHR, m_bits)
    m = mag.alu(Ops.AND, (1 << m_bits) - 1)
    normal = (e + _u(U32, 127 - fmt.bias)).alu(Ops.SHL, 23).alu(Ops.OR, m.alu(Ops.SHL, 23 - m_bits))
    sub = UOp(Ops.BITCAST, U32, (m.cast(F32) * UOp.const(F32, 2.0 ** (1 - fmt.bias - m_bits)),))
    val = e.eq(_u(U32, 0)).where(sub, normal)
    qnan = _u(U32, 0x7FC00000)
    if fmt.kind == "ieee":
        special = e.eq(_u(U32, (1 << (fmt.bits - 1 - m_bits)) - 1))
        val = special.where(m.eq(_u(U32, 0)).where(_u(U32, 0x7F800000), qnan), val)
    elif fmt.kind == "fn":
        val = mag.eq(_u(U32, fmt.nan)).where(qnan, val)
    elif fmt.kind == "fnuz":
        val = bits.eq(_u(U32, 0x80)).where(qnan, val)
        sign = bits.eq(_u(U32, 0x80)).where(_u(U32, 0), sign)
    return UOp(Ops.BITCAST, F32, (val.alu(Ops.OR, sign.alu(Ops.SHL, 31)),))


def encode_float(x: UOp, dt: DType) -> UOp:
    """A float32 or float64 value -> dt, rounded to nearest even, without saturating."""
    if dt is dtypes.float8e8m0:
        return _encode_e8m0(x if x.dtype is F32 else x.cast(F32))
    fmt = FORMATS[dt.name]
    src_mant, src_bias = (23, 127) if x.dtype is F32 else (52, 1023)
    width = x.dtype.bits
    U, I = (U32, I32) if x.dtype is F32 else (U64, I64)
    bits = UOp(Ops.BITCAST, U, (x,))
    sign = bits.alu(Ops.SHR, width - 1)
    mag = bits.alu(Ops.AND, (1 << (width - 1)) - 1)
    inf_bits = ((1 << (width - 1 - src_mant)) - 1) << src_mant
    is_nan = _u(U, inf_bits).lt(mag)
    is_inf = mag.eq(_u(U, inf_bits))
    e_src = mag.alu(Ops.SHR, src_mant).cast(I)
    man = mag.alu(Ops.AND, (1 << src_mant) - 1)
    full = e_src.eq(UOp.const(I, 0)).where(man, man.alu(Ops.OR, 1 << src_mant))
    te = e_src.maximum(UOp.const(I, 1)) + UOp.const(I, fmt.bias - src_bias)  # target biased exponent
    extra = (UOp.const(I, 1) - te).maximum(UOp.const(I, 0))  # below the normal range: shift further
    shift = (UOp.const(I, src_mant - fmt.mant) + extra).minimum(UOp.const(I, src_mant + 2)).cast(U)
    q = full.alu(Ops.SHR, shift)
    rem = full.alu(Ops.AND, _u(U, 1).alu(Ops.SHL, shift) - _u(U, 1))
    half = _u(U, 1).alu(Ops.SHL, shift - _u(U, 1))
    odd = q.alu(Ops.AND, 1).ne(_u(U, 0))
    up = half.lt(rem).alu(Ops.OR, rem.eq(half).alu(Ops.AND, odd))
    q = q + up.cast(U)
    # q carries the implicit bit for normal results: adding (te-1) << mant makes the exponent field.
    r = q + (te - UOp.const(I, 1)).maximum(UOp.const(I, 0)).cast(U).alu(Ops.SHL, fmt.mant)
    too_big = _u(U, fmt.max_mag).lt(r).alu(Ops.OR, is_inf)
    sign_shift = fmt.bits - 1
    if fmt.kind == "ieee":
        r = too_big.where(_u(U, fmt.inf_mag), r)
        r = is_nan.where(_u(U, fmt.nan), r)
        out = r.alu(Ops.OR, sign.alu(Ops.SHL, sign_shift))
    elif fmt.kind == "fn":
        r = too_big.alu(Ops.OR, is_nan).where(_u(U, fmt.nan), r)
        out = r.alu(Ops.OR, sign.alu(Ops.SHL, sign_shift))
    elif fmt.kind == "fnuz":  # one NaN (0x80) and no negative zero
        nan = too_big.alu(Ops.OR, is_nan)
        signed = r.alu(Ops.OR, r.eq(_u(U, 0)).where(_u(U, 0), sign.alu(Ops.SHL, sign_shift)))
        out = nan.where(_u(U, fmt.nan), signed)
    else:  # float4e2m1 saturates; NaN has no encoding (ml_dtypes gives a zero of the opposite sign)
        r = too_big.where(_u(U, fmt.max_mag), r)
        out = is_nan.where(sign.alu(Ops.XOR, 1).alu(Ops.SHL, sign_shift),
                           r.alu(Ops.OR, sign.alu(Ops.SHL, sign_shift)))
    return UOp(Ops.BITCAST, dt, (out.cast(_storage_int(dt)),))


def _encode_e8m0(x: UOp) -> UOp:
    """float32 -> float8e8m0 as ml_dtypes rounds it: a normal value to the nearest power of two,
    halves up; a float32 subnormal to 2**-127 up to 2**-127 itself, above it to 2**-126; zero,
    negative values, inf and NaN give NaN (0xFF), as does overflow."""
    bits = UOp(Ops.BITCAST, U32, (x,))
    e = bits.alu(Ops.SHR, 23).alu(Ops.AND, 0xFF)
    m = bits.alu(Ops.AND, 0x7FFFFF)
    normal = e + _u(U32, 0x400000).lt(m + _u(U32, 1)).cast(U32)
    sub = _u(U32, 0x400000).lt(m).cast(U32)
    code = e.eq(_u(U32, 0)).where(sub, normal)
    bad = bits.alu(Ops.SHR, 31).ne(_u(U32, 0)).alu(Ops.OR, bits.eq(_u(U32, 0))).alu(Ops.OR, _u(U32, 254).lt(code))
    return _from_bits(bad.where(_u(U32, 0xFF), code), dtypes.float8e8m0)


def wrap_narrow_int(x: UOp, dt: DType) -> UOp:
    """An int32 value wrapped to dt's width (two's complement), as a value of dt."""
    k = dt.bits
    w = x.alu(Ops.AND, (1 << k) - 1)
    if dt.kind == "int":
        w = w.alu(Ops.XOR, 1 << (k - 1)) - UOp.const(I32, 1 << (k - 1))
    storage = dtypes.int8 if dt.kind == "int" else dtypes.uint8
    return UOp(Ops.BITCAST, dt, (w.cast(storage),))


def _wide(dt: DType) -> DType:
    return F32 if dt.is_float else I32


def _native_f16_cast(n: UOp) -> UOp | None:
    """Keep float16 <-> float32 CASTs (the target converts them in one instruction)."""
    if {n.src[0].dtype, n.dtype} == {dtypes.float16, F32}:
        return None
    return lower_cast(n)


def lower_cast(n: UOp) -> UOp | None:
    x = n.src[0]
    src, dst = x.dtype, n.dtype
    if not (src.emulated or dst.emulated):
        return None
    if src == dst:
        return x
    if src.emulated:  # read the value out at full precision, then cast natively (or encode again)
        if src.is_float:
            return decode_float(x).cast(dst)
        return UOp(Ops.BITCAST, dtypes.int8 if src.kind == "int" else dtypes.uint8, (x,)).cast(dst)
    if dst.is_float:
        if src is F64 and dst is dtypes.float16:
            return encode_float(x, dst)  # numpy rounds float64 -> float16 once
        if src is F32:
            return encode_float(x, dst)
        return encode_float(x.cast(F64).cast(F32) if not src.is_float else x.cast(F32), dst)
    return wrap_narrow_int(x.cast(I32), dst)  # float: truncate and saturate to int32 first; int: low bits


_KEEP = frozenset({Ops.CAST, Ops.BITCAST, Ops.WHERE})


def compute_wide(n: UOp) -> UOp | None:
    if not n.dtype.emulated or n.op in _KEEP:
        return None
    wide = _wide(n.dtype)
    srcs = tuple(s.cast(wide) if s.dtype == n.dtype else s for s in n.src)
    return UOp(n.op, wide, srcs).cast(n.dtype)


def compare_wide(n: UOp) -> UOp | None:
    dt = n.src[0].dtype
    if not dt.emulated:
        return None
    wide = _wide(dt)
    return UOp(n.op, n.dtype, tuple(s.cast(wide) for s in n.src))


def reduce_wide(n: UOp) -> UOp | None:
    if not n.dtype.emulated:
        return None
    wide = _wide(n.dtype)
    return UOp(Ops.LOOP_REDUCE, wide, (n.src[0].cast(wide), *n.src[1:]), n.arg).cast(n.dtype)


_WIDEN_RULES = [
    (UPat(COMPARE, name="n"), compare_wide),
    (UPat(ALU - COMPARE - _KEEP, name="n"), compute_wide),
    (UPat(Ops.LOOP_REDUCE, name="n"), reduce_wide),
]
pm_emulate = PatternMatcher([(UPat(Ops.CAST, name="n"), lower_cast), *_WIDEN_RULES], name="emulate")
pm_emulate_f16c = PatternMatcher([(UPat(Ops.CAST, name="n"), _native_f16_cast), *_WIDEN_RULES], name="emulate_f16c")


def pm_emulate_for(native_f16: bool) -> PatternMatcher:
    """native_f16: the target converts float16 <-> float32 in hardware (svodc.target.Target.native_f16)."""
    return pm_emulate_f16c if native_f16 else pm_emulate
