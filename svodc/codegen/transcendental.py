"""Transcendental functions as polynomial rewrites in the IR.

A code image may not call libm (it has no symbols to call), and LLVM's exp/log/sin intrinsics become
libm calls on CPUs (and abort on NVPTX). So EXP, EXP2, LOG, LOG2, POW, TANH, ERF, the trigonometric,
hyperbolic and inverse functions, ROUND, TRUNC and FLOOR are rewritten here into +, *, comparisons,
selects and bit manipulation, which every backend compiles inline (float32/float64 ROUND stays on CPUs that
round to nearest even in one instruction: Target.native_roundeven).

float32 follows the Cephes single-precision algorithms (range reduction + minimax polynomial, about
1-3 ulp); float64 EXP/LOG use Taylor series on a reduced range to double precision; other float64
functions and float16 compute in float32 (float16 loses nothing by it).

Invariants: NaN in gives NaN out; +-inf and zeros give the IEEE results; no float->int conversion
of an out-of-range value (CAST is saturating in the IR, and inputs are clamped first).
"""

from __future__ import annotations

import math

from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp

F32, F64, I32, I64 = dtypes.float32, dtypes.float64, dtypes.int32, dtypes.int64


def _c(x: UOp, v: float) -> UOp:
    return UOp.const(x.dtype, v)


def poly(x: UOp, coeffs: list[float]) -> UOp:
    """Horner: coeffs[0]*x^(n-1) + ... + coeffs[-1], each step a MULACC (one FMA where the target has it)."""
    acc = _c(x, coeffs[0])
    for c in coeffs[1:]:
        acc = UOp(Ops.MULACC, x.dtype, (acc, x, _c(x, c)))
    return acc


def _bits_int(dt: DType) -> DType:
    return I32 if dt is F32 else I64


def _mantissa_bits(dt: DType) -> int:
    return 23 if dt is F32 else 52


def _exp_bias(dt: DType) -> int:
    return 127 if dt is F32 else 1023


def pow2i(k: UOp, dt: DType) -> UOp:
    """2**k for an integer k in the normal exponent range of dt, built from its bits."""
    it = _bits_int(dt)
    biased = k.cast(it) + UOp.const(it, _exp_bias(dt))
    return UOp(Ops.BITCAST, dt, (biased * UOp.const(it, 1 << _mantissa_bits(dt)),))


def round_nearest(x: UOp) -> UOp:
    """Round to nearest (ties to even): |x| + 2**23 - 2**23 (2**52 for float64) rounds |x| < 2**23 to
    an integer in the add; larger values are already integral. The sign is put back after (-0.3 -> -0)."""
    mant = 23 if x.dtype is F32 else 52
    a = x.alu(Ops.ABS)
    r = (a + _c(x, 2.0 ** mant)) - _c(x, 2.0 ** mant)
    r = a.lt(_c(x, 2.0 ** mant)).where(r, a)
    return x.lt(_c(x, 0.0)).alu(Ops.OR, x.eq(_c(x, 0.0))).where(_copysign_small(x, r), r)


def _copysign_small(x: UOp, r: UOp) -> UOp:
    """r (>= 0) with the sign of x, where x < 0 or x is a zero: -r, or x itself for x = ±0."""
    return x.eq(_c(x, 0.0)).where(x, r.alu(Ops.NEG))


def small_integral_to_int(n: UOp) -> UOp:
    """An integral float n with |n| < 2**(mantissa - 1) as the same-width integer, without a conversion:
    n + 1.5 * 2**mantissa has the exponent of 2**mantissa, so its low bits hold n (biased). A CAST would
    do it too, but the IR's casts saturate, which LLVM scalarizes on x86 (a compare and a cmov per lane)."""
    it = _bits_int(n.dtype)
    magic = _c(n, 1.5 * 2.0 ** _mantissa_bits(n.dtype))
    return UOp(Ops.BITCAST, it, (n + magic,)) - UOp(Ops.BITCAST, it, (magic,))


def scale_by_pow2(p: UOp, n: UOp) -> UOp:
    """p * 2**n for integral n in [-2*emax, 2*emax], in two steps so each factor is a normal number."""
    it = _bits_int(p.dtype)
    ni = small_integral_to_int(n)
    n1 = ni // UOp.const(it, 2)  # IDIV floors
    n2 = ni - n1
    return p * pow2i(n1, p.dtype) * pow2i(n2, p.dtype)


def exp_f32(x: UOp) -> UOp:
    """Cephes expf. n = round(x / ln 2) and its integer come from one add: |x / ln 2| <= 151 < 2**22, so
    v + 1.5 * 2**23 rounds v to an integer (ties to even) and holds it in its low mantissa bits. 2**n is
    two normal factors 2**(n >> 1) * 2**(n - (n >> 1)), so results near the overflow bound and subnormal
    ones (x < -87.3) round once. With the FMAs and the clamps' single compares (llvm_alu.float_minmax) about
    half the vector operations of round_nearest + scale_by_pow2: a row-fused [6, 1500, 1500] softmax, two
    exps per element, 17.5 -> 9.5 ms on one Zen 4 core."""
    xc = x.maximum(_c(x, -104.0)).minimum(_c(x, 89.0))
    magic = 1.5 * 2.0 ** 23
    t = UOp(Ops.MULACC, F32, (xc, _c(x, 1.4426950408889634), _c(x, magic)))
    n = t - _c(x, magic)
    # r = x - n ln 2 in two parts (n * 0.693359375 is exact), each an FMA
    r = UOp(Ops.MULACC, F32, (n, _c(x, -0.693359375), xc))
    r = UOp(Ops.MULACC, F32, (n, _c(x, 2.12194440e-4), r))
    q = poly(r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
                 5.0000001201e-1])
    p = UOp(Ops.MULACC, F32, (q, r * r, r)) + _c(x, 1.0)
    ni = UOp(Ops.BITCAST, I32, (t,)) - UOp.const(I32, 0x4B400000)  # the bits of 1.5 * 2**23
    n1 = ni.alu(Ops.SHR, UOp.const(I32, 1))  # arithmetic: floor(n / 2)
    return p * pow2i(n1, F32) * pow2i(ni - n1, F32)


def exp_f64(x: UOp) -> UOp:
    xc = x.maximum(_c(x, -746.0)).minimum(_c(x, 710.0))
    n = round_nearest(xc * _c(x, 1.4426950408889634))
    r = xc - n * _c(x, 6.93147180369123816490e-01) - n * _c(x, 1.90821492927058770002e-10)
    p = poly(r, [1 / math.factorial(k) for k in range(13, -1, -1)])
    return scale_by_pow2(p, n)


def exp(x: UOp) -> UOp:
    return exp_f32(x) if x.dtype is F32 else exp_f64(x)


def exp2(x: UOp) -> UOp:
    hi = 129.0 if x.dtype is F32 else 1025.0
    xc = x.maximum(_c(x, -hi - 22)).minimum(_c(x, hi))
    n = round_nearest(xc)
    f = (xc - n) * _c(x, math.log(2))
    return scale_by_pow2(exp(f), n)


def _frexp_normalized(x: UOp) -> tuple[UOp, UOp]:
    """For x > 0: (m, e) with x = m * 2**e, m in [sqrt(1/2), sqrt(2)), e integral (as a float)."""
    dt, it = x.dtype, _bits_int(x.dtype)
    mb = _mantissa_bits(dt)
    tiny = x.lt(_c(x, 2.0 ** (-126 if dt is F32 else -1022)))
    xs = tiny.where(x * _c(x, 2.0 ** mb), x)  # subnormals: scale into the normal range
    bits = UOp(Ops.BITCAST, it, (xs,))
    e = (bits // UOp.const(it, 1 << mb)).alu(Ops.AND, UOp.const(it, (1 << (dt.bits - mb - 1)) - 1))
    e = e - UOp.const(it, _exp_bias(dt) - 1)  # so that m is in [0.5, 1)
    half_bits = UOp.const(it, (_exp_bias(dt) - 1) << mb)
    mant_mask = UOp.const(it, (1 << mb) - 1)
    m = UOp(Ops.BITCAST, dt, (bits.alu(Ops.AND, mant_mask).alu(Ops.OR, half_bits),))
    ef = e.cast(dt) - tiny.where(_c(x, float(mb)), _c(x, 0.0))
    low = m.lt(_c(x, math.sqrt(0.5)))
    m = low.where(m + m, m)
    ef = low.where(ef - _c(x, 1.0), ef)
    return m, ef


def _log_special(x: UOp, y: UOp) -> UOp:
    nan, inf = _c(x, math.nan), _c(x, math.inf)
    y = x.eq(_c(x, math.inf)).where(inf, y)
    y = x.eq(_c(x, 0.0)).where(_c(x, -math.inf), y)
    y = x.lt(_c(x, 0.0)).where(nan, y)
    return x.ne(x).where(x, y)


def log(x: UOp) -> UOp:
    finite_pos = _c(x, 0.0).lt(x).alu(Ops.AND, x.lt(_c(x, math.inf)))
    safe = finite_pos.where(x, _c(x, 1.0))  # _log_special supplies the other cases
    m, e = _frexp_normalized(safe)
    if x.dtype is F32:
        f = m - _c(x, 1.0)
        z = f * f
        y = poly(f, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
                     -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1]) * f * z
        y = y + e * _c(x, -2.12194440e-4) - _c(x, 0.5) * z
        out = f + y + e * _c(x, 0.693359375)
    else:
        s = (m - _c(x, 1.0)) / (m + _c(x, 1.0))
        s2 = s * s
        series = poly(s2, [1 / k for k in range(21, 0, -2)])
        out = _c(x, 2.0) * s * series + e * _c(x, math.log(2))
    return _log_special(x, out)


def log2(x: UOp) -> UOp:
    return log(x) * _c(x, 1.4426950408889634)


def trunc(x: UOp) -> UOp:
    """Round toward zero without libm. |x| >= 2**mantissa (and inf, NaN) is already integral; below
    that the value fits the same-width integer, so a (saturating) int round trip truncates it."""
    it = _bits_int(x.dtype)
    integral = x.alu(Ops.ABS).lt(_c(x, 2.0 ** _mantissa_bits(x.dtype))).alu(Ops.NOT)
    t = x.cast(it).cast(x.dtype)
    t = t.eq(_c(x, 0.0)).where(x * _c(x, 0.0), t)  # keep the sign of -0.5 and -0.0
    return integral.where(x, t)


def floor(x: UOp) -> UOp:
    t = trunc(x)
    return t.lt(x).alu(Ops.NOT).alu(Ops.AND, t.ne(x)).where(t - _c(x, 1.0), t)


def pow_(x: UOp, y: UOp) -> UOp:
    ax = x.alu(Ops.ABS)
    r = exp2(y * log2(ax))
    y_int = trunc(y).eq(y)
    half = trunc(y * _c(y, 0.5))
    y_odd = y_int.alu(Ops.AND, (half + half).ne(y))
    neg = x.lt(_c(x, 0.0))
    r = neg.where(y_int.where(y_odd.where(r.alu(Ops.NEG), r), _c(x, math.nan)), r)
    zero = x.eq(_c(x, 0.0))
    zero_val = y.lt(_c(y, 0.0)).where(_c(x, math.inf), y_odd.where(x, _c(x, 0.0)))
    r = zero.where(zero_val, r)
    r = x.eq(_c(x, 1.0)).where(_c(x, 1.0), r)
    return y.eq(_c(y, 0.0)).where(_c(x, 1.0), r)


def tanh(x: UOp) -> UOp:
    ax = x.alu(Ops.ABS)
    z = x * x
    small = poly(z, [-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1,
                     -3.33332819422e-1]) * z * x + x
    e = exp(_c(x, 2.0) * ax.minimum(_c(x, 9.0)))
    large = _c(x, 1.0) - _c(x, 2.0) / (e + _c(x, 1.0))
    large = x.lt(_c(x, 0.0)).where(large.alu(Ops.NEG), large)
    return ax.lt(_c(x, 0.625)).where(small, large)


def erf(x: UOp) -> UOp:
    ax = x.alu(Ops.ABS)
    z = x * x
    # |x| < 1: the Maclaurin series 2/sqrt(pi) * sum (-1)^k x^(2k+1) / (k! (2k+1)), 11 terms.
    series = [(-1) ** k / (math.factorial(k) * (2 * k + 1)) for k in range(10, -1, -1)]
    small = poly(z, series) * x * _c(x, 2 / math.sqrt(math.pi))
    # |x| >= 1: Abramowitz & Stegun 7.1.26 (absolute error < 1.5e-7).
    t = _c(x, 1.0) / (_c(x, 1.0) + _c(x, 0.3275911) * ax)
    p = poly(t, [1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592]) * t
    large = _c(x, 1.0) - p * exp((ax * ax).minimum(_c(x, 100.0)).alu(Ops.NEG))
    large = x.lt(_c(x, 0.0)).where(large.alu(Ops.NEG), large)
    return ax.lt(_c(x, 1.0)).alu(Ops.OR, x.ne(x)).where(small, large)


def _quadrant_polys(x: UOp) -> tuple[UOp, UOp, UOp]:
    """x = k*pi/2 + r with |r| <= pi/4 (Cody-Waite, 3 parts): (k as int64, sin r, cos r)."""
    k = round_nearest(x * _c(x, 2 / math.pi))
    r = x - k * _c(x, 1.5703125) - k * _c(x, 4.837512969970703125e-4) - k * _c(x, 7.54978995489188216e-8)
    # Past ~1e5 this reduction loses precision (no Payne-Hanek); keep the result in [-1, 1] there.
    r = r.maximum(_c(x, -math.pi / 4)).minimum(_c(x, math.pi / 4))
    r2 = r * r
    s = poly(r2, [-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1]) * r2 * r + r
    c = poly(r2, [2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2]) * r2 * r2 \
        - _c(x, 0.5) * r2 + _c(x, 1.0)
    return k.cast(I64), s, c


def _sin_shifted(x: UOp, quarter_turns: int) -> UOp:
    """sin(x + quarter_turns * pi/2)."""
    k, s, c = _quadrant_polys(x)
    q = (k + UOp.const(I64, quarter_turns)).alu(Ops.AND, UOp.const(I64, 3))
    odd = q.alu(Ops.AND, UOp.const(I64, 1)).ne(UOp.const(I64, 0))
    v = odd.where(c, s)
    return q.lt(UOp.const(I64, 2)).where(v, v.alu(Ops.NEG))


def sin(x: UOp) -> UOp:
    return x.eq(_c(x, 0.0)).where(x, _sin_shifted(x, 0))


def cos(x: UOp) -> UOp:
    return _sin_shifted(x, 1)


def tan(x: UOp) -> UOp:
    k, s, c = _quadrant_polys(x)
    odd = k.alu(Ops.AND, UOp.const(I64, 1)).ne(UOp.const(I64, 0))
    return x.eq(_c(x, 0.0)).where(x, odd.where((c / s).alu(Ops.NEG), s / c))


def _sign_of(x: UOp, y: UOp) -> UOp:
    """|y| with the sign of x (y >= 0 or NaN); x itself where x is ±0 (odd functions: f(-0) = -0)."""
    return x.eq(_c(x, 0.0)).where(x, x.lt(_c(x, 0.0)).where(y.alu(Ops.NEG), y))


def atan(x: UOp) -> UOp:
    """Cephes atanf: reduce |x| by tan(pi/8) and tan(3pi/8), odd polynomial on [-0.4142, 0.4142]."""
    a = x.alu(Ops.ABS)
    big = _c(x, 2.414213562373095).lt(a)
    mid = _c(x, 0.4142135623730950).lt(a)
    y0 = big.where(_c(x, math.pi / 2), mid.where(_c(x, math.pi / 4), _c(x, 0.0)))
    t = big.where(_c(x, -1.0) / a, mid.where((a - _c(x, 1.0)) / (a + _c(x, 1.0)), a))
    z = t * t
    y = poly(z, [8.05374449538e-2, -1.38776856032e-1, 1.99777106478e-1, -3.33329491539e-1]) * z * t + t
    return _sign_of(x, y0 + y)


def _asin_core(t: UOp) -> UOp:
    """asin(t) for 0 <= t <= 0.5 (Cephes asinf polynomial)."""
    z = t * t
    return poly(z, [4.2163199048e-2, 2.4181311049e-2, 4.5470025998e-2, 7.4953002686e-2, 1.6666752422e-1]) * z * t + t


def asin(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    upper = _c(x, 0.5).lt(a)
    t = upper.where((_c(x, 0.5) * (_c(x, 1.0) - a)).alu(Ops.SQRT), a)  # asin a = pi/2 - 2 asin sqrt((1-a)/2)
    p = _asin_core(t)
    y = upper.where(_c(x, math.pi / 2) - (p + p), p)
    return _c(x, 1.0).lt(a).where(_c(x, math.nan), _sign_of(x, y))


def acos(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    t = (_c(x, 0.5) * (_c(x, 1.0) - a)).alu(Ops.SQRT)
    p = _asin_core(t)
    outer = x.lt(_c(x, 0.0)).where(_c(x, math.pi) - (p + p), p + p)  # |x| > 0.5: 2 asin sqrt((1-|x|)/2)
    inner = _c(x, math.pi / 2) - _sign_of(x, _asin_core(a))  # |x| <= 0.5: pi/2 - asin x
    y = _c(x, 0.5).lt(a).where(outer, inner)
    return _c(x, 1.0).lt(a).where(_c(x, math.nan), y)


def _half_exp(a: UOp) -> UOp:
    """e**a / 2 for a >= 0, finite up to a ~ 89.4 (e**a itself overflows past 88.7)."""
    w = exp(_c(a, 0.5) * a)
    return (_c(a, 0.5) * w) * w


def sinh(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    z = x * x
    small = poly(z, [2.03721912945e-4, 8.33028376239e-3, 1.66667160211e-1]) * z * x + x
    e = exp(a)
    big_exp = _c(x, 88.0).lt(a)
    hp = _half_exp(a)
    large = big_exp.where(hp, _c(x, 0.5) * e - _c(x, 0.5) / e)
    return a.lt(_c(x, 1.0)).where(small, _sign_of(x, large))


def cosh(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    e = exp(a)
    hp = _half_exp(a)
    return _c(x, 88.0).lt(a).where(hp, _c(x, 0.5) * e + _c(x, 0.5) / e)


def asinh(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    z = x * x
    small = poly(z, [2.0122003309e-2, -4.2699340972e-2, 7.4847586088e-2, -1.6666288134e-1]) * z * x + x
    huge = log(a) + _c(x, math.log(2))
    mid = log(a + (a * a + _c(x, 1.0)).alu(Ops.SQRT))
    y = _c(x, 1500.0).lt(a).where(huge, mid)
    return _sign_of(x, a.lt(_c(x, 0.5)).where(small.alu(Ops.ABS), y))


def acosh(x: UOp) -> UOp:
    z = x - _c(x, 1.0)
    near_one = poly(z, [1.7596881071e-3, -7.5272886713e-3, 2.6454905019e-2, -1.1784741703e-1, 1.4142135263e0]) \
        * z.maximum(_c(x, 0.0)).alu(Ops.SQRT)
    mid = log(x + (z * (x + _c(x, 1.0))).alu(Ops.SQRT))
    huge = log(x) + _c(x, math.log(2))
    y = _c(x, 1500.0).lt(x).where(huge, z.lt(_c(x, 0.5)).where(near_one, mid))
    return x.lt(_c(x, 1.0)).where(_c(x, math.nan), y)


def atanh(x: UOp) -> UOp:
    a = x.alu(Ops.ABS)
    z = x * x
    small = poly(z, [1.81740078349e-1, 8.24370301058e-2, 1.46691431730e-1, 1.99782164500e-1,
                     3.33337300303e-1]) * z * x + x
    large = _c(x, 0.5) * log((_c(x, 1.0) + x) / (_c(x, 1.0) - x))
    return x.eq(_c(x, 0.0)).where(x, a.lt(_c(x, 0.5)).where(small, large))


_IMPL = {Ops.EXP: exp, Ops.EXP2: exp2, Ops.LOG: log, Ops.LOG2: log2, Ops.TANH: tanh, Ops.ERF: erf,
         Ops.SIN: sin, Ops.COS: cos, Ops.TAN: tan, Ops.ASIN: asin, Ops.ACOS: acos, Ops.ATAN: atan, Ops.SINH: sinh,
         Ops.COSH: cosh, Ops.ASINH: asinh, Ops.ACOSH: acosh, Ops.ATANH: atanh, Ops.ROUND: round_nearest,
         Ops.TRUNC: trunc, Ops.FLOOR: floor}
_NATIVE = {F32: set(_IMPL),
           F64: {Ops.EXP, Ops.EXP2, Ops.LOG, Ops.LOG2, Ops.TRUNC, Ops.FLOOR, Ops.ROUND}}


def _rewrite_unary(n: UOp) -> UOp | None:
    if n.op not in _IMPL or not n.dtype.is_float:
        return None
    x = n.src[0]
    if n.op in _NATIVE.get(n.dtype, set()):
        return _IMPL[n.op](x)
    return UOp(n.op, F32, (x.cast(F32),)).cast(n.dtype)  # computed in float32


def _rewrite_pow(n: UOp) -> UOp | None:
    if not n.dtype.is_float:
        return None
    x, y = n.src
    if y.op is Ops.CONST and y.arg in (1.0, 2.0, 3.0):  # x**2 is x*x, exactly what numpy computes
        r = x
        for _ in range(int(y.arg) - 1):
            r = r * x
        return r
    if n.dtype in (F32, F64):
        return pow_(n.src[0], n.src[1])
    return UOp(Ops.POW, F32, tuple(s.cast(F32) for s in n.src)).cast(n.dtype)


pm_transcendental = PatternMatcher([
    (UPat(tuple(_IMPL), name="n"), _rewrite_unary),
    (UPat(Ops.POW, name="n"), _rewrite_pow),
], name="transcendental")
# For CPUs with a round-to-nearest-even instruction (Target.native_roundeven): float32/float64 ROUND stays.
pm_transcendental_native_round = PatternMatcher([
    (UPat(tuple(op for op in _IMPL if op is not Ops.ROUND), name="n"), _rewrite_unary),
    (UPat(Ops.ROUND, name="n"), lambda n: None if n.dtype in (F32, F64) else _rewrite_unary(n)),
    (UPat(Ops.POW, name="n"), _rewrite_pow),
], name="transcendental_native_round")
