"""RoiAlign: bilinear samples of regions given at run time, as products with interpolation matrices.

Bilinear weights are separable, so the samples of all regions are Wy @ X[batch] @ Wx^T, where
Wy [R, P, H] holds for each sample row its two interpolation weights (0 elsewhere) and Wx the same
for columns: matmuls instead of run-time gathers. The matrices come from compare-and-select with the
sample coordinates, which are computed from the regions at run time, following onnx.reference:
samples outside [-1, size] weigh 0, coordinates clamp into the map. "max" mode takes, as the
reference does, the largest of the four weighted corner values of each sample.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.linalg import matmul
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp


def _iota(n: int, shape: tuple[int, ...], dt) -> UOp:
    return T.reshape(UOp(Ops.WEIGHT, dt, (), ConstData(np.arange(n).astype(dt.np))), shape)


def _axis_weights(start: UOp, bin_size: UOp, pooled: int, grid: int, size: int) -> tuple[UOp, UOp, UOp, UOp, UOp]:
    """For sample coordinates start + p*bin + (i+0.5)*bin/grid ([R, pooled*grid]): (in range, low index,
    high index, weight of low, weight of high), each [R, pooled*grid, 1]."""
    f = start.dtype
    r = start.shape[0]
    steps = np.array([p + (i + 0.5) / grid for p in range(pooled) for i in range(grid)])
    pos = T.alu(Ops.ADD, T.reshape(start, (r, 1)), T.alu(Ops.MUL, T.reshape(bin_size, (r, 1)),
                                                        T.reshape(UOp(Ops.WEIGHT, f, (), ConstData(steps.astype(f.np))),
                                                                  (1, pooled * grid))))
    below = T.alu(Ops.CMPLT, pos, T.scalar_like(pos, -1.0))
    above = T.alu(Ops.CMPLT, T.scalar_like(pos, size), pos)
    inside = T.alu(Ops.NOT, T.alu(Ops.OR, below, above))  # -1 <= pos <= size
    pos = T.alu(Ops.MAX, pos, T.scalar_like(pos, 0.0))
    low = UOp(Ops.FLOOR, f, (pos,))
    at_edge = T.alu(Ops.CMPLT, T.scalar_like(low, size - 2), low)  # low >= size - 1
    low = T.alu(Ops.WHERE, at_edge, T.scalar_like(low, size - 1), low)
    pos = T.alu(Ops.WHERE, at_edge, low, pos)
    high = T.alu(Ops.WHERE, at_edge, low, T.alu(Ops.ADD, low, T.scalar_like(low, 1.0)))
    frac = T.alu(Ops.SUB, pos, low)
    shape = (r, pooled * grid, 1)
    return (T.reshape(inside, shape), T.reshape(low, shape), T.reshape(high, shape),
            T.reshape(T.alu(Ops.SUB, T.scalar_like(frac, 1.0), frac), shape), T.reshape(frac, shape))


def _onehot_weights(index: UOp, weight: UOp, inside: UOp, size: int) -> UOp:
    """[R, S, size]: weight at column `index` of each sample row (0 outside the map)."""
    cols = _iota(size, (1, 1, size), index.dtype)
    w = T.alu(Ops.WHERE, inside, weight, T.scalar_like(weight, 0.0))
    return T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, cols, index), w, T.scalar_like(w, 0.0))


@onnx_op("RoiAlign", 10, 16, 22)
def roi_align(ctx: NodeContext) -> UOp:
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    if not x.dtype.is_float or x.ndim != 4:
        raise Unsupported(f"RoiAlign needs a float [N, C, H, W] input, got {x.dtype.name}{list(x.shape)}")
    ratio = int(ctx.attr("sampling_ratio", 0))
    if ratio <= 0:
        raise Unsupported("sampling_ratio=0 (a grid that depends on the run-time regions) is not supported")
    oh, ow = int(ctx.attr("output_height", 1)), int(ctx.attr("output_width", 1))
    scale = float(ctx.attr("spatial_scale", 1.0))
    mode = ctx.attr("mode", "avg")
    half_pixel = ctx.version >= 16 and ctx.attr("coordinate_transformation_mode", "half_pixel") == "half_pixel"
    n, c, h, w = x.shape
    r = rois.shape[0]
    f = x.dtype
    roi = T.alu(Ops.SUB, T.alu(Ops.MUL, rois.cast(f), T.scalar_like(rois.cast(f), scale)),
                T.scalar_like(rois.cast(f), 0.5 if half_pixel else 0.0))

    def col(i: int) -> UOp:
        return T.reshape(T.shrink(roi, [(0, r), (i, i + 1)]), (r,))

    x0, y0, x1, y1 = col(0), col(1), col(2), col(3)
    width, height = T.alu(Ops.SUB, x1, x0), T.alu(Ops.SUB, y1, y0)
    if not half_pixel:  # malformed regions become 1x1
        width = T.alu(Ops.MAX, width, T.scalar_like(width, 1.0))
        height = T.alu(Ops.MAX, height, T.scalar_like(height, 1.0))
    bin_h = T.alu(Ops.DIV, height, T.scalar_like(height, oh))
    bin_w = T.alu(Ops.DIV, width, T.scalar_like(width, ow))
    iy, ly, hy, wly, why = _axis_weights(y0, bin_h, oh, ratio, h)
    ix, lx, hx, wlx, whx = _axis_weights(x0, bin_w, ow, ratio, w)
    # the image of each region: a compare-and-sum over the batch
    images = _iota(n, (1, n, 1, 1, 1), dtypes.int64)
    pick = T.alu(Ops.CMPEQ, T.reshape(batch.cast(dtypes.int64), (r, 1, 1, 1, 1)), images)
    img = T.reduce(T.alu(Ops.WHERE, pick, T.reshape(x, (1, n, c, h, w)), T.scalar_like(x, 0.0)), Ops.ADD, [1],
                   keepdims=False)  # [R, C, H, W]

    def sample(wy: UOp, wx: UOp) -> UOp:
        """[R, C, P, Q] = wy [R, P, H] @ img @ wx [R, Q, W]^T"""
        return matmul(matmul(T.reshape(wy, (r, 1, oh * ratio, h)), img),
                      T.permute(T.reshape(wx, (r, 1, ow * ratio, w)), (0, 1, 3, 2)))

    def pooled(v: UOp, op: Ops) -> UOp:
        v = T.reshape(v, (r, c, oh, ratio, ow, ratio))
        return T.reduce(v, op, [3, 5], keepdims=False)

    if mode == "avg":
        wy = T.alu(Ops.ADD, _onehot_weights(ly, wly, iy, h), _onehot_weights(hy, why, iy, h))
        wx = T.alu(Ops.ADD, _onehot_weights(lx, wlx, ix, w), _onehot_weights(hx, whx, ix, w))
        return T.alu(Ops.DIV, pooled(sample(wy, wx), Ops.ADD), T.const(float(ratio * ratio), f, ()))
    if mode != "max":
        raise Unsupported(f"mode={mode!r} is not avg or max")
    corners = [sample(_onehot_weights(yi, yw, iy, h), _onehot_weights(xi, xw, ix, w))
               for yi, yw in ((ly, wly), (hy, why)) for xi, xw in ((lx, wlx), (hx, whx))]
    best = corners[0]
    for corner in corners[1:]:
        best = T.alu(Ops.MAX, best, corner)
    return pooled(best, Ops.MAX)
