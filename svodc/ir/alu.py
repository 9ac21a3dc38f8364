"""The semantics of ALU ops, as numpy functions: the one definition that constant folding, the
reference interpreter and the codegen tests agree on.

Integer arithmetic wraps at the dtype's width. Integer DIV truncates toward zero and defines x/0 = 0
(ONNX leaves it undefined; a code image must never trap). IDIV/MOD are floor division and modulo,
used for index arithmetic. MAX/MIN propagate NaN. SHL/SHR by a negative amount or by the width or
more give 0 (SHR of a negative signed value: -1).

Emulated dtypes (float16, bfloat16, float8, float4, int4/int2) compute in float32 (int32) and round
(wrap) the result back once per op, which is what ml_dtypes and numpy's float16 do and what the
generated code does. CAST to a float8/float4/bfloat16 rounds to nearest even without saturating
(ml_dtypes: overflow gives inf, or NaN in formats without inf; float4 saturates); from float64 it
rounds through float32 (as ml_dtypes does), except float16, which numpy rounds once. CAST from a
float to a narrow integer truncates to int32 (saturating) and then wraps, as ml_dtypes does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from svodc.ir.dtypes import DType, dtypes, from_storage, max_value, min_value, to_storage
from svodc.ir.ops import Ops


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    if a.dtype.kind == "u":
        q = a // safe
    else:
        q = np.trunc(a.astype(np.float64) / safe).astype(a.dtype) if a.dtype.itemsize < 8 else _trunc_div64(a, safe)
    return np.where(b == 0, 0, q).astype(a.dtype)


def _trunc_div64(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    q = np.floor_divide(a, b)
    r = a - q * b
    adjust = (r != 0) & ((r < 0) != (b < 0))
    return q + adjust.astype(a.dtype)


def _div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if a.dtype.kind == "f":
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / b
    return _int_div(a, b)


def _floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.floor_divide(a, np.where(b == 0, 1, b))


def _mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.mod(a, np.where(b == 0, 1, b))


def _erf(x: np.ndarray) -> np.ndarray:
    import math

    return np.vectorize(math.erf, otypes=[x.dtype])(x) if x.size else x


def _pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(all="ignore"):
        if a.dtype.kind in "iu":
            return np.power(a, np.maximum(b, 0)).astype(a.dtype)
        return np.power(a, b)


def _float(fn: Callable) -> Callable:
    def f(x: np.ndarray) -> np.ndarray:
        with np.errstate(all="ignore"):
            return fn(x)
    return f


def _not(x: np.ndarray) -> np.ndarray:
    return np.logical_not(x) if x.dtype == np.bool_ else np.invert(x)


def _shift(left: bool) -> Callable:
    def f(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        width = a.dtype.itemsize * 8
        amount = b.astype(np.int64)
        out_of_range = (amount < 0) | (amount >= width)
        safe = np.where(out_of_range, 0, amount).astype(a.dtype)
        r = np.left_shift(a, safe) if left else np.right_shift(a, safe)
        fill = 0 if left or a.dtype.kind == "u" else np.where(a < 0, -1, 0)
        return np.where(out_of_range, fill, r).astype(a.dtype)
    return f


def _logic(bool_fn: Callable, int_fn: Callable) -> Callable:
    return lambda a, b: bool_fn(a, b) if a.dtype == np.bool_ else int_fn(a, b)


NUMPY_ALU: dict[Ops, Callable[..., np.ndarray]] = {
    Ops.NEG: lambda x: np.negative(x) if x.dtype != np.bool_ else x,
    Ops.RECIP: _float(lambda x: np.reciprocal(x)),
    Ops.SQRT: _float(np.sqrt),
    Ops.EXP2: _float(np.exp2),
    Ops.LOG2: _float(np.log2),
    Ops.EXP: _float(np.exp),
    Ops.LOG: _float(np.log),
    Ops.TANH: _float(np.tanh),
    Ops.ERF: _erf,
    Ops.SIN: _float(np.sin),
    Ops.COS: _float(np.cos),
    Ops.TAN: _float(np.tan),
    Ops.ASIN: _float(np.arcsin),
    Ops.ACOS: _float(np.arccos),
    Ops.ATAN: _float(np.arctan),
    Ops.SINH: _float(np.sinh),
    Ops.COSH: _float(np.cosh),
    Ops.ASINH: _float(np.arcsinh),
    Ops.ACOSH: _float(np.arccosh),
    Ops.ATANH: _float(np.arctanh),
    Ops.ROUND: np.round,
    Ops.TRUNC: np.trunc,
    Ops.FLOOR: np.floor,
    Ops.ABS: np.abs,
    Ops.NOT: _not,
    Ops.ADD: lambda a, b: a + b,
    Ops.SUB: lambda a, b: a - b,
    Ops.MUL: lambda a, b: a * b,
    Ops.DIV: _div,
    Ops.IDIV: _floordiv,
    Ops.MOD: _mod,
    Ops.MAX: np.maximum,
    Ops.MIN: np.minimum,
    Ops.POW: _pow,
    Ops.CMPLT: np.less,
    Ops.CMPEQ: np.equal,
    Ops.CMPNE: np.not_equal,
    Ops.AND: _logic(np.logical_and, np.bitwise_and),
    Ops.OR: _logic(np.logical_or, np.bitwise_or),
    Ops.XOR: _logic(np.logical_xor, np.bitwise_xor),
    Ops.SHL: _shift(left=True),
    Ops.SHR: _shift(left=False),
    Ops.WHERE: lambda c, a, b: np.where(c, a, b),
    Ops.MULACC: lambda a, b, c: a * b + c,
}


def _emulated(a: np.ndarray) -> bool:
    """An array of a dtype that computes in float32 / int32 (ml_dtypes kinds are 'V'; float16)."""
    return a.dtype.kind == "V" or a.dtype == np.float16


def widen(a: np.ndarray) -> np.ndarray:
    if not _emulated(a):
        return a
    if a.dtype == np.float16 or "float" in a.dtype.name:
        return a.astype(np.float32)
    return a.astype(np.int32)


def _is_floatlike(a: np.ndarray) -> bool:
    return a.dtype.kind == "f" or "float" in a.dtype.name


def cast_array(x: np.ndarray, to: DType) -> np.ndarray:
    """CAST semantics: bool is x != 0; float -> int truncates (NaN -> 0, out of range saturates);
    see the module docstring for the emulated dtypes."""
    x = np.asarray(x)
    target = to.np
    with np.errstate(all="ignore"):
        if to.kind == "bool":
            return widen(x) != 0
        if _is_floatlike(x) and to.is_int:
            wide = dtypes.int32 if to.width else to
            info_lo, info_hi = min_value(wide), max_value(wide)
            y = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0)
            y = np.clip(y, info_lo, info_hi).astype(wide.np)
            return y.astype(target) if to.width else y
        if to.width:  # int -> narrow int wraps
            return x.astype(np.int64).astype(target)
        if to.emulated and to.is_float and to is not dtypes.float16:
            return widen(x).astype(np.float32).astype(target)
        if to is dtypes.float16 and x.dtype.kind == "V":
            return widen(x).astype(target)
        return x.astype(target)


def bitcast_array(x: np.ndarray, to: DType) -> np.ndarray:
    """BITCAST: the same storage bytes read as another dtype of the same size."""
    src = dtypes.from_numpy(x.dtype)
    raw = to_storage(np.ascontiguousarray(x), src)
    return from_storage(raw.view(to.storage_np), to)


def eval_alu(op: Ops, out_dtype: DType, srcs: list[np.ndarray]) -> np.ndarray:
    """Evaluate one ALU op on numpy arrays of equal shape; the result has out_dtype."""
    if op is Ops.CAST:
        return cast_array(srcs[0], out_dtype)
    if op is Ops.BITCAST:
        return bitcast_array(srcs[0], out_dtype)
    if out_dtype.emulated or any(_emulated(s) for s in srcs):
        with np.errstate(all="ignore"):
            out = np.asarray(NUMPY_ALU[op](*[widen(s) for s in srcs]))
        return cast_array(out, out_dtype)
    with np.errstate(over="ignore"):
        out = NUMPY_ALU[op](*srcs)
    out = np.asarray(out)
    target = out_dtype.np
    return out if out.dtype == target else out.astype(target)


def fold_scalar(op: Ops, out_dtype: DType, values: list[Any], src_dtypes: list[DType]) -> Any:
    """Constant-fold one ALU op on python scalars with the IR's semantics."""
    arrays = [np.asarray(v, dtype=d.np) for v, d in zip(values, src_dtypes, strict=True)]
    r = eval_alu(op, out_dtype, arrays)
    return r.item()
