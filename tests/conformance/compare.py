"""Comparing a run's outputs with a case's expected outputs.

Floats: |got - want| <= atol + rtol * |want| elementwise (the onnx backend's rule), with NaN exactly
where the reference has NaN and infinities equal. Integers and booleans: exact. Types that numpy
only knows through ml_dtypes (bfloat16, float8, int4) are compared as float32 (int64) values after
bringing the runtime's array to that type.
"""

from __future__ import annotations

import numpy as np

_ML_INTS = ("int4", "uint4", "int2", "uint2")


def is_ml_dtype(dt: np.dtype) -> bool:
    """A type numpy only knows through ml_dtypes (bfloat16, float8, float4, int4, int2)."""
    return dt.type.__module__.startswith("ml_dtypes")


def as_reference_type(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """A runtime may return types numpy lacks as their storage integers (bfloat16 as uint16) or, for
    narrow integers, as a wider integer type: bring them to the reference's type to compare."""
    if got.dtype == want.dtype or not is_ml_dtype(want.dtype):
        return got
    if want.dtype.name in _ML_INTS and got.dtype.kind in "iu":
        return got.astype(np.int64).astype(want.dtype)
    if got.dtype.kind in "uiV" and got.dtype.itemsize == want.dtype.itemsize:
        return got.view(want.dtype)
    return got


def mismatch(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> str | None:
    """None when got matches want; otherwise a short reason (shape, dtype, or the largest error)."""
    want = np.asarray(want)
    got = as_reference_type(np.asarray(got), want)
    if got.shape != want.shape:
        return f"shape {list(got.shape)}, expected {list(want.shape)}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    if is_ml_dtype(want.dtype):
        cast = np.int64 if want.dtype.name in _ML_INTS else np.float32
        got, want = got.astype(cast), want.astype(cast)
    if want.dtype.kind in "fc":
        g, w = got.astype(np.float64), want.astype(np.float64)
        nan_g, nan_w = np.isnan(g), np.isnan(w)
        if (nan_g != nan_w).any():
            return f"NaN at {int((nan_g != nan_w).sum())} positions where the reference has none (or vice versa)"
        with np.errstate(invalid="ignore", over="ignore"):
            err = np.abs(g - w)
            close = np.where(np.isinf(w), g == w, err <= atol + rtol * np.abs(w))  # inf only equals itself
            bad = ~(nan_w | close)
        if bad.any():
            e = np.where(bad, np.where(np.isnan(err), np.inf, err), 0)
            i = np.unravel_index(np.argmax(e), e.shape)
            rel = float(e[i] / max(abs(w[i]), 1e-300)) if np.isfinite(e[i]) else float("inf")
            return (f"{int(bad.sum())}/{w.size} values differ, max abs error {float(e[i]):.3g} "
                    f"(rel {rel:.3g}) at {list(map(int, i))}: got {g[i]!r}, expected {w[i]!r}")
        return None
    if want.dtype.kind in "biu":
        bad = got != want
        if bad.any():
            i = np.unravel_index(np.argmax(bad), bad.shape)
            return f"{int(bad.sum())}/{want.size} values differ, first at {list(map(int, i))}: got {got[i]!r}, " \
                   f"expected {want[i]!r}"
        return None
    return None if np.array_equal(got, want) else "values differ"
