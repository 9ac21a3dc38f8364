"""float16 without conversion instructions: compute in float32, store 16-bit patterns.

LLVM handles `half` on CPUs without f16<->f32 conversion instructions (baseline x86-64, rv64gc
without Zfh, POWER8, every s390x) by calling __extendhfsf2/__truncsfhf2 from compiler-rt/libgcc: a
code image has none to call, so that would be a link error. `legalize_f16` rewrites a kernel so no
float16 value reaches LLVM: loads read the 16-bit pattern and widen it with integer ops; every
float16 result of arithmetic is computed in float32 and rounded to float16 precision (round to
nearest even, as the hardware would: float32 has enough bits that rounding twice, for + - * / and
sqrt, gives the correctly rounded float16 result); stores narrow it back to the pattern.

`Target.native_f16` says when this is needed; targets with conversion instructions keep LLVM's
`half` (which promotes arithmetic to float32 the same way, with hardware conversions).
"""

from __future__ import annotations

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort

F16, F32, I32, U16 = dtypes.float16, dtypes.float32, dtypes.int32, dtypes.uint16
# float16 results that may not be representable: rounded back to float16 precision after the op.
_ROUNDED = {Ops.ADD, Ops.SUB, Ops.MUL, Ops.DIV, Ops.RECIP, Ops.SQRT, Ops.MULACC, Ops.LOOP_REDUCE}


def _i(v: int) -> UOp:
    return UOp.const(I32, v)


def _bits(x: UOp) -> UOp:
    return UOp(Ops.BITCAST, I32, (x,))


def _float(bits: UOp) -> UOp:
    return UOp(Ops.BITCAST, F32, (bits,))


def half_to_float(pattern: UOp) -> UOp:
    """A float16 bit pattern (uint16 or int16) -> its float32 value, exactly (subnormals, inf, NaN)."""
    h = UOp(Ops.BITCAST, U16, (pattern,)) if pattern.dtype is not U16 else pattern
    h = h.cast(I32)  # zero-extends
    em = h.alu(Ops.AND, _i(0x7FFF))  # exponent and mantissa
    shifted = em * _i(1 << 13)
    normal = _float(shifted + _i((127 - 15) << 23))  # rebias the exponent
    inf_nan = _float(shifted.alu(Ops.OR, _i(0x7F800000)))  # all-ones exponent, mantissa (NaN payload) kept
    subnormal = em.cast(F32) * UOp.const(F32, 2.0 ** -24)  # exact: em < 2**10
    magnitude = em.lt(_i(0x400)).where(subnormal, em.lt(_i(0x7C00)).where(normal, inf_nan))
    negative = h.alu(Ops.AND, _i(0x8000)).ne(_i(0))
    return _float(_bits(magnitude).alu(Ops.OR, negative.where(_i(-(1 << 31)), _i(0))))


def float_to_half(x: UOp) -> UOp:
    """float32 -> the uint16 pattern of the nearest float16 (ties to even; overflow to inf; NaN stays
    NaN). F. Giesen's branch-free float_to_half_fast3_rtne, as selects."""
    u = _bits(x)
    a = u.alu(Ops.AND, _i(0x7FFFFFFF))  # |x|, non-negative as int32, so // below is a plain shift
    inf_or_nan = a.lt(_i(0x7F800001)).where(_i(0x7C00), _i(0x7E00))
    # |x| < 2**-14: the float16 is subnormal or zero; adding 0.5 lets the FPU round the mantissa
    magic = 126 << 23  # 0.5
    sub = _bits(_float(a) + _float(_i(magic))) - _i(magic)
    odd = (a // _i(1 << 13)).alu(Ops.AND, _i(1))
    normal = (a + _i(((15 - 127) << 23) + 0xFFF) + odd) // _i(1 << 13)
    o = a.lt(_i((127 + 16) << 23)).where(a.lt(_i(113 << 23)).where(sub, normal), inf_or_nan)
    sign = u.lt(_i(0)).where(_i(0x8000), _i(0))
    return o.alu(Ops.OR, sign).cast(U16)


def round_to_half(x: UOp) -> UOp:
    return half_to_float(float_to_half(x))


def _legal(n: UOp, src: tuple[UOp, ...]) -> UOp:
    if n.op is Ops.CONST and n.dtype is F16:
        return UOp.const(F32, float(n.arg))
    if n.op is Ops.LOAD and n.dtype is F16:
        return half_to_float(UOp(Ops.LOAD, U16, src, n.arg))
    if n.op is Ops.STORE and n.src[2].dtype is F16:
        return UOp(Ops.STORE, n.dtype, (src[0], src[1], float_to_half(src[2])), n.arg)
    if n.op is Ops.BITCAST and n.src[0].dtype is F16:  # to int16/uint16: the pattern
        pattern = float_to_half(src[0])
        return pattern if n.dtype is U16 else UOp(Ops.BITCAST, n.dtype, (pattern,))
    if n.op is Ops.BITCAST and n.dtype is F16:
        return half_to_float(src[0])
    if n.op is Ops.CAST and n.src[0].dtype is F16:
        return src[0].cast(n.dtype)
    if n.op is Ops.CAST and n.dtype is F16:  # float64/int -> float32 -> float16 rounds twice (rarely off by 1 ulp)
        return round_to_half(src[0].cast(F32))
    if n.dtype is F16:
        wide = UOp(n.op, F32, src, n.arg)
        return round_to_half(wide) if n.op in _ROUNDED else wide
    return n if src == n.src else UOp(n.op, n.dtype, src, n.arg)


def legalize_f16(ast: UOp) -> UOp:
    """The kernel with every float16 value computed as float32 (see the module doc)."""
    done: dict[UOp, UOp] = {}
    for n in toposort([ast]):
        done[n] = _legal(n, tuple(done[s] for s in n.src))
    return done[ast]
