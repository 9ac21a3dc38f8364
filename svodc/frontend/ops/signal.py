"""Signal processing: DFT, STFT, the Hann/Hamming/Blackman windows, MelWeightMatrix.

A DFT of length n along one axis is a product with constant cosine and sine matrices (computed at
compile time in float64; the product runs in float64 too, so the result rounds like the
reference's complex128 FFT). Zero padding to n drops matrix rows, truncation drops input elements.
Windows and mel matrices of a compile-time size fold to weights; a window's size may be a run-time
input within a bound the user gives.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.registry import onnx_op
from svodc.frontend.runtime_dims import bounded_output, user_bound
from svodc.frontend.runtime_values import axis_choice
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

F64 = dtypes.float64


def weight(a: np.ndarray, dt: DType) -> UOp:
    return UOp(Ops.WEIGHT, dt, (), ConstData(a.astype(dt.np)))


def _scalar(ctx: NodeContext, i: int, what: str) -> int | float | None:
    v = ctx.optional_const_input(i, what)
    return None if v is None else np.asarray(v).reshape(-1)[0].item()


def dft_last(re: UOp, im: UOp | None, n: int, inverse: bool, bins: int) -> tuple[UOp, UOp]:
    """The DFT (or inverse, with 1/n) of length n along the last axis of re + i*im, first `bins`
    outputs; inputs longer than n are truncated, shorter ones zero padded."""
    m = min(re.shape[-1], n)
    if m < re.shape[-1]:
        re = T.shrink(re, [(0, d) for d in re.shape[:-1]] + [(0, m)])
        im = None if im is None else T.shrink(im, [(0, d) for d in im.shape[:-1]] + [(0, m)])
    t = np.arange(m).reshape(m, 1)
    k = np.arange(bins).reshape(1, bins)
    angle = 2 * np.pi * ((t * k) % n) / n  # reduced mod n: exact angles for large t*k
    c, s = np.cos(angle), np.sin(angle)
    if inverse:
        c, s = c / n, -s / n  # e^{+i}: the sine term changes sign
    C, S = weight(c, F64), weight(s, F64)
    re = re.cast(F64)
    yr, yi = matmul(re, C), T.alu(Ops.NEG, matmul(re, S))
    if im is not None:  # (a + ib)(cos - i sin) = a cos + b sin + i (b cos - a sin)
        im = im.cast(F64)
        yr, yi = T.alu(Ops.ADD, yr, matmul(im, S)), T.alu(Ops.ADD, yi, matmul(im, C))
    return yr, yi


def irfft_last(re: UOp, im: UOp, n: int) -> UOp:
    """numpy.fft.irfft along the last axis: one-sided spectrum (the first n//2+1 bins) -> n reals."""
    m = min(re.shape[-1], n // 2 + 1)
    re = T.shrink(re, [(0, d) for d in re.shape[:-1]] + [(0, m)])
    im = T.shrink(im, [(0, d) for d in im.shape[:-1]] + [(0, m)])
    k = np.arange(m).reshape(m, 1)
    t = np.arange(n).reshape(1, n)
    w = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0)  # the bins that stand for two
    angle = 2 * np.pi * ((k * t) % n) / n
    c, s = w * np.cos(angle) / n, -w * np.sin(angle) / n
    return T.alu(Ops.ADD, matmul(re.cast(F64), weight(c, F64)), matmul(im.cast(F64), weight(s, F64)))


def _split_complex(x: UOp) -> tuple[UOp, UOp | None]:
    """[..., 1] -> (real, None); [..., 2] -> (real, imaginary), each without the last axis."""
    last = x.shape[-1]
    if last not in (1, 2):
        raise Unsupported(f"the last axis must be 1 (real) or 2 (complex), got {last}")
    parts = [T.reshape(T.shrink(x, [(0, d) for d in x.shape[:-1]] + [(i, i + 1)]), x.shape[:-1]) for i in range(last)]
    return parts[0], parts[1] if last == 2 else None


@onnx_op("DFT", 17, 20)
def dft(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if not x.dtype.is_float:
        raise Unsupported(f"DFT of {x.dtype.name} is not supported")
    if ctx.version >= 20 and ctx.optional_input(2) is not None:  # the axis may be a run-time input
        return axis_choice(ctx, 2, x.ndim, lambda axis: _dft_along(ctx, x, axis), valid=x.ndim - 1)
    return _dft_along(ctx, x, T.norm_axis(-2 if ctx.version >= 20 else int(ctx.attr("axis", 1)), x.ndim))


def _dft_along(ctx: NodeContext, x: UOp, axis: int) -> UOp:
    if axis == x.ndim - 1:
        raise Unsupported("the DFT axis cannot be the last (real/imaginary) axis")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    length = _scalar(ctx, 1, "dft_length")
    n = int(length) if length is not None else 2 * (x.shape[axis] - 1) if inverse and onesided else x.shape[axis]
    re, im = _split_complex(x)
    order = [i for i in range(re.ndim) if i != axis] + [axis]  # move the axis last, and back after
    back = [order.index(i) for i in range(re.ndim)]
    re = T.permute(re, order)
    im = None if im is None else T.permute(im, order)
    if inverse and onesided:
        if im is None:
            raise Unsupported("an inverse one-sided DFT needs a complex input")
        out = T.permute(irfft_last(re, im, n), back)
        return T.reshape(out, (*out.shape, 1)).cast(x.dtype)
    bins = n // 2 + 1 if onesided else n
    yr, yi = dft_last(re, im, n, inverse, bins)
    yr, yi = (T.reshape(T.permute(y, back), (*T.permute(y, back).shape, 1)) for y in (yr, yi))
    return T.concat([yr, yi], x.ndim - 1).cast(x.dtype)


@onnx_op("STFT", 17)
def stft(ctx: NodeContext) -> UOp:
    x, window = ctx.input(0), ctx.optional_input(2)
    step = _scalar(ctx, 1, "frame_step")
    frame_length = _scalar(ctx, 3, "frame_length")
    if step is None or int(step) <= 0:
        raise Unsupported("frame_step must be a positive constant")
    step = int(step)
    if frame_length is None:
        frame_length = window.shape[0] if window is not None else x.shape[-2]
    n = int(frame_length)
    ws = window.shape[0] if window is not None else n
    nb, length = x.shape[0], x.shape[1]
    frames = 1 + (length - n) // step
    re, im = _split_complex(x)  # [B, L]
    last = max(ws, (frames - 1) * step + ws)  # frames may read past the end: zeros there
    pad = [(0, 0), (0, max(0, last - length))]
    win_views = []
    for part in (re, im):
        if part is None:
            win_views.append(None)
            continue
        w = T.window(T.pad(part, pad), [1], [ws], [step], [1])  # [B, nf', ws]
        w = T.shrink(w, [(0, nb), (0, frames), (0, ws)])
        if window is not None:
            w = T.alu(Ops.MUL, w, T.reshape(window.cast(x.dtype), (1, 1, ws)))
        win_views.append(w)
    bins = n // 2 + 1 if ctx.attr("onesided", 1) else n
    yr, yi = dft_last(win_views[0], win_views[1], n, False, bins)
    out = T.concat([T.reshape(yr, (*yr.shape, 1)), T.reshape(yi, (*yi.shape, 1))], 3)
    return out.cast(x.dtype)


def _window(kind: str):
    def handler(ctx: NodeContext) -> UOp:
        periodic = ctx.attr("periodic", 1)
        out_dt = ctx.dtype_attr("output_datatype", 1)
        f64 = dtypes.float64
        known = is_constant(ctx.input(0))
        # a run-time size: computed at the bound the user gives, returned `size` long
        hi = int(_scalar(ctx, 0, "size")) if known else user_bound(ctx, 0, 0, 0)
        size = T.reshape(ctx.input(0), ()).cast(f64)
        big_n = size if periodic else T.alu(Ops.SUB, size, T.const(1.0, f64))
        phase = T.alu(Ops.DIV, weight(np.arange(hi, dtype=np.float64) * np.pi, f64), big_n)  # pi * i / N
        w = _window_formula(kind, phase).cast(out_dt)
        if known:
            with np.errstate(divide="ignore", invalid="ignore"):
                return weight(constant_value(w), out_dt)
        return bounded_output(ctx, w, [(T.reshape(ctx.input(0), ()).cast(dtypes.int64), 0, hi)], None, 0)
    return handler


def _window_formula(kind: str, phase: UOp) -> UOp:
    def cos(k: float) -> UOp:
        return UOp(Ops.COS, phase.dtype, (T.alu(Ops.MUL, T.scalar_like(phase, k), phase),))

    def lin(*terms: tuple[float, UOp | None]) -> UOp:  # sum of c * term (term None: the constant c)
        out = T.scalar_like(phase, 0.0)
        for c, t in terms:
            ct = T.scalar_like(phase, c)
            out = T.alu(Ops.ADD, out, ct if t is None else T.alu(Ops.MUL, ct, t))
        return out

    if kind == "Hann":
        s = UOp(Ops.SIN, phase.dtype, (phase,))
        return T.alu(Ops.MUL, s, s)
    if kind == "Hamming":
        alpha = 25.0 / 46.0
        return lin((alpha, None), (-(1 - alpha), cos(2.0)))
    return lin((0.42, None), (-0.5, cos(2.0)), (0.08, cos(4.0)))


for _kind in ("Hann", "Hamming", "Blackman"):
    onnx_op(f"{_kind}Window", 17)(_window(_kind))


@onnx_op("MelWeightMatrix", 17)
def mel_weight_matrix(ctx: NodeContext) -> UOp:
    """Triangular mel filters, [dft_length//2 + 1, num_mel_bins], as onnx.reference builds them."""
    bins_mel, dft_length, rate, lo, hi = (_scalar(ctx, i, w) for i, w in enumerate(
        ("num_mel_bins", "dft_length", "sample_rate", "lower_edge_hertz", "upper_edge_hertz")))
    bins_mel, dft_length, rate = int(bins_mel), int(dft_length), int(rate)
    spectrogram_bins = dft_length // 2 + 1
    edges = np.arange(bins_mel + 2)
    lo_mel = 2595 * np.log1p(lo / 700) / math.log(10)
    hi_mel = 2595 * np.log1p(hi / 700) / math.log(10)
    hz = 700 * np.expm1((edges * ((hi_mel - lo_mel) / edges.shape[0]) + lo_mel) / 2595 * math.log(10))
    points = (((dft_length + 1) * hz) // rate).astype(int)
    out = np.zeros((spectrogram_bins, bins_mel))
    for i in range(bins_mel):
        left, center, right = points[i], points[i + 1], points[i + 2]
        if center == left:
            out[center, i] = 1
        else:
            for j in range(left, center + 1):
                out[j, i] = (j - left) / (center - left)
        for j in range(center, right):
            out[j, i] = (right - j) / (right - center)
    return weight(out, ctx.dtype_attr("output_datatype", 1))
