"""GridSample (2-D and volumetric; nearest, linear and cubic; zeros, border and reflection padding)
and DeformConv (bilinear taps at offset positions, then a grouped contraction with W), both built
on one sampler: each output position reads its taps with the IR's GATHER
(run-time positions) and weighs them, one dimension's coefficients times the others'.

Coordinates, rounding and the padding rules follow onnx.reference (which follows PyTorch): nearest
rounds half to even; border clamps and reflection mirrors a coordinate outside the borders, and a
tap outside the map reads 0 (zeros), the edge (border) or its mirror (reflection).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, GatherArg, Ops
from svodc.ir.uop import UOp

I64 = dtypes.int64
CUBIC_ALPHA = -0.75


def c(x: UOp, v: float) -> UOp:
    return T.scalar_like(x, v)


def un(op: Ops, x: UOp) -> UOp:
    return UOp(op, x.dtype, (x,))


def reflect(u: UOp, lo: float, hi: float) -> UOp:
    """Mirror u into [lo, hi] by the nearer border, as many times as it takes."""
    span = hi - lo
    if span <= 0:
        return T.alu(Ops.WHERE, T.alu(Ops.CMPNE, u, u), u, c(u, lo))

    def fold(d: UOp, near: float, far: float, sign: float) -> UOp:
        n = un(Ops.TRUNC, T.alu(Ops.DIV, d, c(d, span)))
        r = T.alu(Ops.SUB, d, T.alu(Ops.MUL, n, c(n, span)))
        even = T.alu(Ops.CMPEQ, T.alu(Ops.MUL, un(Ops.TRUNC, T.alu(Ops.MUL, n, c(n, 0.5))), c(n, 2.0)), n)
        return T.alu(Ops.WHERE, even, T.alu(Ops.ADD, c(r, near), T.alu(Ops.MUL, r, c(r, sign))),
                     T.alu(Ops.SUB, c(r, far), T.alu(Ops.MUL, r, c(r, sign))))
    below = fold(T.alu(Ops.SUB, c(u, lo), u), lo, hi, 1.0)
    above = fold(T.alu(Ops.SUB, u, c(u, hi)), hi, lo, -1.0)
    out = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, u, c(u, lo)), below, u)
    return T.alu(Ops.WHERE, T.alu(Ops.CMPLT, c(u, hi), u), above, out)


def _cubic(t: UOp) -> list[UOp]:
    """Keys' cubic convolution coefficients for taps -1, 0, 1, 2 at fraction t."""
    a = CUBIC_ALPHA

    def outer(x: UOp) -> UOp:  # ((a(x) - 5a) x + 8a) x - 4a for 1 <= x <= 2
        return T.alu(Ops.SUB, T.alu(Ops.MUL, T.alu(Ops.ADD, T.alu(Ops.MUL, T.alu(Ops.SUB, T.alu(
            Ops.MUL, c(x, a), x), c(x, 5 * a)), x), c(x, 8 * a)), x), c(x, 4 * a))

    def inner(x: UOp) -> UOp:  # ((a+2) x - (a+3)) x x + 1 for 0 <= x <= 1
        return T.alu(Ops.ADD, T.alu(Ops.MUL, T.alu(Ops.MUL, T.alu(Ops.SUB, T.alu(Ops.MUL, c(x, a + 2), x),
                                                                  c(x, a + 3)), x), x), c(x, 1.0))
    one_minus = T.alu(Ops.SUB, c(t, 1.0), t)
    return [outer(T.alu(Ops.ADD, t, c(t, 1.0))), inner(t), inner(one_minus),
            outer(T.alu(Ops.SUB, c(t, 2.0), t))]


def sample(x: UOp, coords: list[UOp], mode: str, padding: str, align: bool) -> UOp:
    """x [N, C, *dims] read at pixel coordinates coords (one [N, P] tensor per spatial dim, in x's
    order) -> [N, C, P]."""
    n, ch, dims = x.shape[0], x.shape[1], x.shape[2:]
    p = coords[0].shape[1]
    borders = [(0.0, d - 1.0) if align else (-0.5, d - 0.5) for d in dims]
    taps_per_dim = []
    for u, d, (lo, hi) in zip(coords, dims, borders, strict=True):
        if mode == "nearest":
            u = un(Ops.ROUND, u)
        outside = T.alu(Ops.OR, T.alu(Ops.CMPLT, u, c(u, lo)), T.alu(Ops.CMPLT, c(u, hi), u))
        if padding == "border":
            u = T.alu(Ops.WHERE, outside, T.alu(Ops.MIN, T.alu(Ops.MAX, u, c(u, 0.0)), c(u, d - 1.0)), u)
        elif padding == "reflection":
            u = reflect(u, lo, hi)
        if mode == "nearest":
            taps_per_dim.append([(un(Ops.TRUNC, u), None)])
            continue
        base = un(Ops.FLOOR, u)
        t = T.alu(Ops.SUB, u, base)
        if mode == "linear":
            offsets, weights = (0, 1), [T.alu(Ops.SUB, c(t, 1.0), t), t]
        else:
            offsets, weights = (-1, 0, 1, 2), _cubic(t)
        taps_per_dim.append([(T.alu(Ops.ADD, base, c(base, k)), w) for k, w in zip(offsets, weights, strict=True)])
    flat = T.reshape(x, (n, ch, math.prod(dims)))
    out = None
    for combo in itertools.product(*taps_per_dim):
        index, valid, weight = None, None, None
        for (j, w), d, (lo, hi), stride in zip(combo, dims, borders, _strides(dims), strict=True):
            j_ok = T.alu(Ops.AND, T.alu(Ops.CMPLT, c(j, -1.0), j), T.alu(Ops.CMPLT, j, c(j, float(d))))
            if padding == "border":
                j = T.alu(Ops.MIN, T.alu(Ops.MAX, j, c(j, 0.0)), c(j, d - 1.0))
            elif padding == "reflection":
                j = un(Ops.TRUNC, reflect(j, lo, hi))
            if padding == "zeros":
                valid = j_ok if valid is None else T.alu(Ops.AND, valid, j_ok)
            term = T.alu(Ops.MUL, j.cast(I64), T.const(stride, I64, ()))
            index = term if index is None else T.alu(Ops.ADD, index, term)
            if w is not None:
                weight = w if weight is None else T.alu(Ops.MUL, weight, w)
        index = T.expand(T.reshape(index, (n, 1, p)), (n, ch, p))
        value = UOp(Ops.GATHER, x.dtype, (flat, index), GatherArg(2))
        if valid is not None:
            value = T.alu(Ops.WHERE, T.reshape(valid, (n, 1, p)), value, c(value, 0.0))
        if weight is not None:
            value = T.alu(Ops.MUL, value, T.reshape(weight.cast(x.dtype), (n, 1, p)))
        out = value if out is None else T.alu(Ops.ADD, out, value)
    return out


def _strides(dims: tuple[int, ...]) -> list[int]:
    return [math.prod(dims[i + 1:]) for i in range(len(dims))]


@onnx_op("GridSample", 16, 20, 22)
def grid_sample(ctx: NodeContext) -> UOp:
    x, grid = ctx.input(0), ctx.input(1)
    if not x.dtype.is_float or grid.ndim != x.ndim or grid.shape[-1] != x.ndim - 2:
        raise Unsupported(f"GridSample needs float X [N, C, ...] and grid [N, ..., {x.ndim - 2}]")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(ctx.attr("mode", "linear" if ctx.version >= 20 else
                                                                   "bilinear"), ctx.attr("mode", "linear"))
    padding = ctx.attr("padding_mode", "zeros")
    if mode not in ("nearest", "linear", "cubic") or padding not in ("zeros", "border", "reflection"):
        raise Unsupported(f"mode={mode!r} / padding_mode={padding!r} is not supported")
    align = bool(ctx.attr("align_corners", 0))
    n, out_sp, nsp = x.shape[0], grid.shape[1:-1], x.ndim - 2
    p = math.prod(out_sp)
    g = T.reshape(grid.cast(x.dtype), (n, p, nsp))
    coords = []
    for i, d in enumerate(x.shape[2:]):  # the grid lists coordinates innermost first (x, y, z)
        v = T.reshape(T.shrink(g, [(0, n), (0, p), (nsp - 1 - i, nsp - i)]), (n, p))
        one = c(v, 1.0)
        if align:
            coords.append(T.alu(Ops.MUL, T.alu(Ops.MUL, T.alu(Ops.ADD, v, one), c(v, 0.5)), c(v, d - 1.0)))
        else:
            coords.append(T.alu(Ops.MUL, T.alu(Ops.SUB, T.alu(Ops.MUL, T.alu(Ops.ADD, v, one), c(v, float(d))), one),
                                c(v, 0.5)))
    return T.reshape(sample(x, coords, mode, padding, align), (n, x.shape[1], *out_sp))


@onnx_op("DeformConv", 19, 22)
def deform_conv(ctx: NodeContext) -> UOp:
    """Each kernel tap reads X bilinearly (zeros outside) at its regular position plus a learned
    offset, scaled by the mask; then the taps are contracted with W as a grouped convolution."""
    x, w, offset, b, mask = (ctx.optional_input(i) for i in range(5))
    if x.ndim != 4 or not x.dtype.is_float:
        raise Unsupported(f"DeformConv of {x.dtype.name}{list(x.shape)}: only float 2-D convolutions")
    n, ch, _, _ = x.shape
    oc, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    group, og = int(ctx.attr("group", 1)), int(ctx.attr("offset_group", 1))
    sh, sw = ctx.ints("strides", [1, 1])
    dh, dw = ctx.ints("dilations", [1, 1])
    ph, pw = ctx.ints("pads", [0, 0, 0, 0])[:2]
    oh, ow = offset.shape[2:]
    if ch % og or ch != w.shape[1] * group or oc % group or offset.shape[1] != og * kh * kw * 2:
        raise Unsupported(f"X {x.shape}, W {w.shape}, offset {offset.shape}, group {group}, offset_group {og} "
                          "do not fit together")
    f = x.dtype
    off = T.reshape(offset.cast(f), (n, og, kh, kw, 2, oh, ow))
    grid = []  # the regular sampling positions (dim 0: rows, 1: columns), [1, 1, kh, kw, oh, ow]
    for d, (k_size, dil, stride, pad, o_size) in enumerate(((kh, dh, sh, ph, oh), (kw, dw, sw, pw, ow))):
        pos = -pad + stride * np.arange(o_size)[None, :] + dil * np.arange(k_size)[:, None]  # [k, o]
        shape = (1, 1, k_size, 1, o_size, 1) if d == 0 else (1, 1, 1, k_size, 1, o_size)
        grid.append(T.reshape(UOp(Ops.WEIGHT, f, (), ConstData(pos.astype(f.np))), shape))
    p = kh * kw * oh * ow
    cg = ch // og
    parts = []
    for g in range(og):
        coords = []
        for d in range(2):
            o = T.reshape(T.shrink(off, [(0, n), (g, g + 1), (0, kh), (0, kw), (d, d + 1), (0, oh), (0, ow)]),
                          (n, 1, kh, kw, oh, ow))
            coords.append(T.reshape(T.alu(Ops.ADD, o, grid[d]), (n, p)))
        xg = T.shrink(x, [(0, n), (g * cg, (g + 1) * cg), (0, x.shape[2]), (0, x.shape[3])])
        v = sample(xg, coords, "linear", "zeros", True)  # [N, Cg, P]
        if mask is not None:
            m = T.shrink(T.reshape(mask.cast(f), (n, og, p)), [(0, n), (g, g + 1), (0, p)])
            v = T.alu(Ops.MUL, v, m)
        parts.append(v)
    vals = T.concat(parts, 1) if len(parts) > 1 else parts[0]  # [N, C, kh*kw*oh*ow]
    cpg, opg = ch // group, oc // group
    vals = T.reshape(vals, (n, group, cpg * kh * kw, oh * ow))
    wg = T.reshape(w.cast(f), (1, group, opg, cpg * kh * kw))
    y = T.reshape(matmul(T.expand(wg, (n, group, opg, cpg * kh * kw)), vals), (n, oc, oh, ow))
    if b is not None:
        y = T.alu(Ops.ADD, y, T.reshape(b.cast(f), (1, oc, 1, 1)))
    return y
