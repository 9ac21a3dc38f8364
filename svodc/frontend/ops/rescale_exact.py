"""When a float32 requantization gives the reference's integers for every int32 accumulator.

The reference (onnx.reference, numpy) requantizes an int32 accumulator as
    want(acc) = clip(roundeven(float64(acc) * float64(f) + z), lo, hi)
with f the float32 factor (x_scale * w_scale / y_scale) and z the integer zero point. A float32 rescale
    got(acc) = clip(roundeven(float32(float32(acc) * f)) + z, lo, hi)   (the + z in float32)
runs twice as many lanes per vector and is what onnxruntime computes (it rounds acc * f and adds z as
an integer), but its product is rounded to float32 first, so a value within a float32 ulp of a .5 can
round the other way. onnxruntime accepts those off-by-ones; we keep the reference's integers, so the
float32 form is used only where it is proven equal to want for every int32 acc, here, at compile time:

Both are non-decreasing in acc for f > 0 (each step -- int to float conversion, multiplication by a
positive constant, adding a constant, rounding to nearest, clipping -- is monotone), and both map into
[lo, hi]. Let a0 be an accumulator with want(a0) = lo and a1 one with want(a1) = hi. Where got equals
want on every acc in [a0, a1], it does everywhere: below a0, lo <= got(acc) <= got(a0) = lo; above a1
likewise hi. So checking the window [a0, a1], about (hi - lo) / f accumulators per distinct (f, z) pair,
is a proof; past `MAX_CHECKED` accumulators (a tiny factor) the float64 form stays.
"""

from __future__ import annotations

import numpy as np

MAX_CHECKED = 1 << 22  # accumulators enumerated per node, at most (tens of milliseconds of numpy)
INT32 = np.iinfo(np.int32)


def float32_rescale(acc: np.ndarray, f: np.float32, z: int, lo: int, hi: int) -> np.ndarray:
    """got(acc) above, as the kernels compute it (int32 in, int64 out for the comparison)."""
    y = np.rint(acc.astype(np.float32) * f) + np.float32(z)  # np.rint rounds half to even, as llvm.roundeven
    return np.clip(y, lo, hi).astype(np.int64)


def float64_rescale(acc: np.ndarray, f: np.float32, z: int, lo: int, hi: int) -> np.ndarray:
    """want(acc) above: the reference's float64 rescale."""
    return np.clip(np.rint(acc.astype(np.float64) * np.float64(f) + z), lo, hi).astype(np.int64)


def float32_rescale_is_exact(factors: np.ndarray, zeros: np.ndarray, lo: int, hi: int) -> bool:
    """Does the float32 rescale give the float64 one's integers for every int32 accumulator, for each
    (factor, zero point) pair of the broadcast arrays? factors float32, zeros integers in [lo, hi]."""
    f_all, z_all = np.broadcast_arrays(np.asarray(factors), np.asarray(zeros))
    pairs = set(zip(f_all.ravel().tolist(), z_all.ravel().tolist(), strict=True))
    windows = []
    for f, z in pairs:
        f32 = np.float32(f)
        if not (np.isfinite(f32) and f32 > 0) or not lo <= z <= hi:
            return False
        # want(a) = lo for a <= start, hi for a >= stop: a step of 2 past the real bounds covers the
        # float64 rounding of the bound computation itself.
        start = max(int(np.floor((lo - z) / np.float64(f32))) - 2, INT32.min)
        stop = min(int(np.ceil((hi - z) / np.float64(f32))) + 2, INT32.max)
        windows.append((f32, int(z), start, stop))
    if sum(stop - start + 1 for *_, start, stop in windows) > MAX_CHECKED:
        return False
    for f32, z, start, stop in windows:
        acc = np.arange(start, stop + 1, dtype=np.int64).astype(np.int32)
        want = float64_rescale(acc, f32, z, lo, hi)
        if (start > INT32.min and want[0] != lo) or (stop < INT32.max and want[-1] != hi):
            return False  # the window's ends must be saturated for the monotonicity argument
        if not np.array_equal(float32_rescale(acc, f32, z, lo, hi), want):
            return False
    return True
