"""Resize and Upsample: separable interpolation with the geometry computed at compile time.

Scales or sizes must be known at compile time (they decide the output shape). For each resized
axis, numpy computes what the ONNX reference computes for every output position -- the source
positions of its taps (clamped into the axis) and their weights -- following the reference's
vectorized algorithm (`onnx.reference.ops.op_resize._interpolate_1d_along_axis`) step for step.
The tensor program is then a GATHER with that constant index table, a multiply by the weights and
a sum over the taps (one tap, no arithmetic, for nearest). Axes are resized one after the other,
as in the reference.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp


def _nearest(mode: str):
    def coeffs(ratio: float, _scale: float) -> np.ndarray:
        if float(ratio).is_integer():
            return np.array([0.0, 1.0])
        if mode == "round_prefer_floor":
            return np.array([ratio <= 0.5, ratio > 0.5], dtype=np.float64)
        if mode == "round_prefer_ceil":
            return np.array([ratio < 0.5, ratio >= 0.5], dtype=np.float64)
        if mode == "floor":
            return np.array([1.0, 0.0])
        if mode == "ceil":
            return np.array([0.0, 1.0])
        raise Unsupported(f"nearest_mode={mode!r} is not a valid value")
    return coeffs


def _linear(antialias: bool):
    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([1 - ratio, ratio])
        scale = min(scale, 1.0)
        start = int(np.floor(-1 / scale) + 1)
        args = (np.arange(start, start + 2 - 2 * start) - ratio) * scale
        c = np.clip(1 - np.abs(args), 0, 1)
        return c / c.sum()
    return coeffs


def _cubic(a: float, antialias: bool):
    def kernel(x: float) -> float:
        x = abs(x)
        if x <= 1:
            return (a + 2) * x ** 3 - (a + 3) * x ** 2 + 1
        if x < 2:
            return a * x ** 3 - 5 * a * x ** 2 + 8 * a * x - 4 * a
        return 0.0

    def coeffs(ratio: float, scale: float) -> np.ndarray:
        if not antialias:
            return np.array([kernel(ratio + 1), kernel(ratio), kernel(1 - ratio), kernel(2 - ratio)])
        scale = min(scale, 1.0)
        i_start = int(np.floor(-2 / scale) + 1)
        c = np.array([kernel(scale * (i - ratio)) for i in range(i_start, 2 - i_start)])
        return c / c.sum()
    return coeffs


def source_coords(mode: str, out_n: int, in_n: int, scale: float, roi: tuple[float, float] | None):
    """x_ori for every output position, and which positions extrapolate (tf_crop_and_resize)."""
    y = np.arange(out_n, dtype=np.float64)
    out_w = scale * in_n
    extra = None
    if mode == "align_corners":
        x = np.zeros(out_n) if out_w == 1 else y * (in_n - 1) / (out_w - 1)
    elif mode == "asymmetric":
        x = y / scale
    elif mode == "tf_crop_and_resize":
        if roi is None:
            raise Unsupported("tf_crop_and_resize needs roi")
        x = np.full(out_n, (roi[1] - roi[0]) * (in_n - 1) / 2) if out_w == 1 else \
            y * (roi[1] - roi[0]) * (in_n - 1) / (out_w - 1)
        x = x + roi[0] * (in_n - 1)
        extra = (x < 0) | (x > in_n - 1)
    elif mode == "pytorch_half_pixel":
        x = np.full(out_n, -0.5) if out_w == 1 else (y + 0.5) / scale - 0.5
    elif mode == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif mode == "half_pixel_symmetric":
        offset = in_n / 2 * (1 - out_n / out_w)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise Unsupported(f"coordinate_transformation_mode={mode!r} is not supported")
    return x, extra


def axis_taps(get_coeffs, in_n: int, out_n: int, scale: float, coord_mode: str, roi, exclude_outside: bool):
    """(tap source indices [out, n] clamped into the axis, tap weights [out, n], extrapolated mask)."""
    x, extra = source_coords(coord_mode, out_n, in_n, scale, roi)
    xi = np.floor(x).astype(np.int64)
    ratios = np.where(x == xi, 1.0, x - xi)
    coeffs = np.stack([np.asarray(get_coeffs(float(r), scale), dtype=np.float64) for r in ratios])
    n = coeffs.shape[1]
    pad = int(np.ceil(n / 2))
    xp = x + pad
    p = np.floor(xp).astype(np.int64)
    frac = xp - p
    if n % 2 == 0:
        offset = np.where(frac == 0, -(n // 2), -(n // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((n - 1) // 2), -((n - 1) // 2) + 1)
    idx = (p + offset)[:, None] + np.arange(n)[None, :] - pad
    if exclude_outside:
        coeffs = np.where((idx < 0) | (idx >= in_n), 0.0, coeffs)
        total = coeffs.sum(axis=-1, keepdims=True)
        coeffs = coeffs / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_n - 1), coeffs, extra


def resize_axis(x: UOp, axis: int, idx: np.ndarray, coeffs: np.ndarray, nearest: bool,
                extra: np.ndarray | None, extrapolation_value: float, sized: tuple[int, int] | None = None) -> UOp:
    out_n, in_n = idx.shape[0], x.shape[axis]
    if nearest:
        pick = idx[np.arange(out_n), np.argmax(coeffs, axis=1)]
        s = out_n // in_n if in_n else 0
        if s and out_n == s * in_n and (pick == np.arange(out_n) // s).all():  # integer upscale: a view
            shape = x.shape[:axis + 1] + (1,) + x.shape[axis + 1:]
            big = x.shape[:axis + 1] + (s,) + x.shape[axis + 1:]
            y = T.reshape(T.expand(T.reshape(x, shape), big), x.shape[:axis] + (out_n,) + x.shape[axis + 1:])
        else:
            y = gather_axis(x, weight(pick.astype(np.int64)), axis, sized)
    else:
        taps = gather_axis(x, weight(idx.astype(np.int64)), axis, sized)  # [..., out, n, ...]
        w = np.asarray(coeffs, dtype=x.dtype.np).reshape((1,) * axis + coeffs.shape + (1,) * (x.ndim - axis - 1))
        y = T.reduce(T.alu(Ops.MUL, taps, weight(w)), Ops.ADD, [axis + 1], keepdims=False)
    if extra is not None and extra.any():
        mask = weight(extra.reshape((1,) * axis + (out_n,) + (1,) * (x.ndim - axis - 1)))
        y = T.alu(Ops.WHERE, mask, T.const(extrapolation_value, y.dtype), y)
    return y


def resize(ctx: NodeContext, x: UOp, scales: list[float] | None, sizes: list[int] | None, axes: list[int],
           coord_mode: str, mode: str, nearest_mode: str, roi: list[float] | None) -> UOp:
    r = x.ndim
    if sizes is not None:
        out = list(x.shape)
        for a, s in zip(axes, sizes, strict=True):
            out[a] = int(s)
        full_scales = [o / i if i else 1.0 for o, i in zip(out, x.shape, strict=True)]
        policy = ctx.attr("keep_aspect_ratio_policy", "stretch")
        if policy != "stretch":
            picked = [full_scales[a] for a in axes]
            s = min(picked) if policy == "not_larger" else max(picked)
            if policy not in ("not_larger", "not_smaller"):
                raise Unsupported(f"keep_aspect_ratio_policy={policy!r} is not a valid value")
            full_scales = [s if a in axes else 1.0 for a in range(r)]
            out = [int(s * x.shape[a] + 0.5) if a in axes else x.shape[a] for a in range(r)]
    else:
        full_scales = [1.0] * r
        for a, s in zip(axes, scales, strict=True):
            full_scales[a] = float(s)
        out = [int(np.float64(s) * d) for s, d in zip(full_scales, x.shape, strict=True)]
    if any(s <= 0 for s in full_scales):
        raise Unsupported(f"scales {full_scales} must be positive")
    full_roi = None
    if roi is not None and len(roi):
        full_roi = [0.0] * r + [1.0] * r
        for k, a in enumerate(axes):
            full_roi[a], full_roi[r + a] = roi[k], roi[len(axes) + k]
    antialias = bool(ctx.attr("antialias", 0))
    if mode == "nearest":
        get, nearest = _nearest(nearest_mode), True
    elif mode in ("linear", "bilinear"):
        get, nearest = _linear(antialias), False
    elif mode in ("cubic", "bicubic"):
        get, nearest = _cubic(float(ctx.attr("cubic_coeff_a", -0.75)), antialias), False
    else:
        raise Unsupported(f"mode={mode!r} is not supported")
    y = x if x.dtype.is_float or nearest else x.cast(dtypes.float32)
    for a in axes:
        a_roi = None if full_roi is None else (full_roi[a], full_roi[a + r])
        if math.isclose(full_scales[a], 1.0) and out[a] == x.shape[a] and (
                a_roi is None or (math.isclose(a_roi[0], 0.0) and math.isclose(a_roi[1], 1.0))):
            continue
        if out[a] == 0 or x.shape[a] == 0:
            raise Unsupported(f"resizing axis {a} from {x.shape[a]} to {out[a]} elements is not supported")
        idx, coeffs, extra = axis_taps(get, x.shape[a], out[a], full_scales[a], coord_mode, a_roi,
                                       bool(ctx.attr("exclude_outside", 0)))
        sized = _bounded_scale(ctx, x, a, full_scales[a], sizes, coord_mode, antialias) if ctx.bounded(x)[a] else None
        y = resize_axis(y, a, idx, coeffs, nearest, extra, float(ctx.attr("extrapolation_value", 0.0)), sized)
    if y.dtype != x.dtype:  # integer data: round to nearest (halves up), then saturate
        y = UOp(Ops.FLOOR, y.dtype, (T.alu(Ops.ADD, y, T.const(0.5, y.dtype)),)).cast(x.dtype)
    return y


# Where every output position's taps and weights depend on the scale only, never on the input's size: the
# table made at a bounded dim's upper bound is right at every size (indices clamped into the real one).
SIZE_FREE_MODES = ("asymmetric", "half_pixel", "tf_half_pixel_for_nn")


def _bounded_scale(ctx: NodeContext, x: UOp, axis: int, scale: float, sizes, coord_mode: str,
                   antialias: bool) -> tuple[int, int]:
    """(mul, div): the scale of a resize over a bounded dim as an exact ratio (floor(size * scale) elements)."""
    if sizes is not None or coord_mode not in SIZE_FREE_MODES or antialias or ctx.attr("exclude_outside", 0):
        from svodc.passes.dynamic import DynamicShapeError

        raise DynamicShapeError(f"node {ctx.name!r} (Resize) resizes bounded dim {ctx.bounded(x)[axis]!r} by sizes, "
                                f"antialias, exclude_outside or coordinate_transformation_mode={coord_mode!r}: "
                                f"only by scales in {', '.join(SIZE_FREE_MODES)}; fix the dim with "
                                f"--dim {ctx.bounded(x)[axis]}=SIZE")
    return Fraction(scale).as_integer_ratio()


def _floats(a) -> list[float] | None:
    return None if a is None or np.asarray(a).size == 0 else [float(v) for v in np.asarray(a).reshape(-1)]


@onnx_op("Resize", 10, 11, 13, 18, 19)
def resize_op(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version == 10:
        scales, sizes, roi = _floats(ctx.const_input(1, "scales")), None, None
        coord, nearest_mode = "asymmetric", "floor"
    else:
        roi = _floats(ctx.optional_const_input(1, "roi"))
        scales = _floats(ctx.optional_const_input(2, "scales"))
        size_values = _floats(ctx.optional_const_input(3, "sizes"))
        sizes = None if size_values is None else [int(v) for v in size_values]
        coord = ctx.attr("coordinate_transformation_mode", "half_pixel")
        nearest_mode = ctx.attr("nearest_mode", "round_prefer_floor")
    if (scales is None) == (sizes is None):
        raise Unsupported("exactly one of scales and sizes must be given")
    axes = ctx.ints("axes") if ctx.version >= 18 else None
    axes = list(range(x.ndim)) if axes is None else [T.norm_axis(a, x.ndim) for a in axes]
    return resize(ctx, x, scales, sizes, axes, coord, ctx.attr("mode", "nearest"), nearest_mode,
                  roi if coord == "tf_crop_and_resize" else None)


@onnx_op("Upsample", 1, 7, 9)  # version 10 only deprecates it
def upsample(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version < 9:
        scales = ctx.attr("scales") or [1.0, 1.0, ctx.attr("height_scale", 1.0), ctx.attr("width_scale", 1.0)]
        scales = [float(s) for s in scales]
    else:
        scales = _floats(ctx.const_input(1, "scales"))
    return resize(ctx, x, scales, None, list(range(x.ndim)), "asymmetric", ctx.attr("mode", "nearest"),
                  "floor", None)
