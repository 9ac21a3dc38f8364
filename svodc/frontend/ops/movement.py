"""Data-movement ONNX ops beyond reshapes: Slice, Pad, Split, Tile, DepthToSpace/SpaceToDepth,
CenterCropPad, ReverseSequence, and the position-only generators Trilu, EyeLike, Range.

Everything with compile-time geometry is a view (SLICE, PAD, EXPAND, RESHAPE, PERMUTE); index maps
that are not affine (reflect/edge/wrap padding) are a GATHER with a constant index vector.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.ops import pad_runtime, view_runtime
from svodc.frontend.ops.indexing import gather_axis, iota_along
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.runtime_dims import bounded_output, element, user_bound
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import GatherArg, Ops
from svodc.ir.uop import UOp


def _ints(a: np.ndarray | None) -> list[int] | None:
    return None if a is None else [int(v) for v in np.asarray(a).reshape(-1)]


def _axes(axes: list[int] | None, ndim: int, count: int) -> list[int]:
    if axes is None:
        return list(range(count))
    out = [T.norm_axis(a, ndim) for a in axes]
    if len(set(out)) != len(out):
        raise Unsupported(f"axes {axes} repeat an axis")
    return out


def slice_view(x: UOp, starts: list[int], ends: list[int], axes: list[int], steps: list[int],
               from_front: bool = False) -> UOp:
    """numpy slicing x[start:end:step] on the given axes (ONNX clamping rules are numpy's)."""
    first, step, shape = [0] * x.ndim, [1] * x.ndim, list(x.shape)
    for a, s, e, st in zip(axes, starts, ends, steps, strict=True):
        if st == 0:
            raise Unsupported("a slice step is 0")
        s, e, st = slice(s, e, st).indices(x.shape[a])
        n = len(range(s, e, st))
        first[a], step[a], shape[a] = (s if n else 0), st, n
    return T.slice_axes(x, first, step, shape, from_front)


@onnx_op("Slice", 1, 10, 11, 13, strings=True)
def slice_(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version < 10:
        starts, ends, axes, steps = ctx.ints("starts"), ctx.ints("ends"), ctx.ints("axes"), None
    elif any(v is not None and not is_constant(v) for v in ctx.inputs[1:5]):
        return view_runtime.slice_at_run_time(ctx, x)
    else:
        starts, ends = _ints(ctx.const_input(1, "starts")), _ints(ctx.const_input(2, "ends"))
        axes, steps = _ints(ctx.optional_const_input(3, "axes")), _ints(ctx.optional_const_input(4, "steps"))
    if starts is None or ends is None or len(starts) != len(ends):
        raise Unsupported("starts and ends are required and must have one length")
    axes = _axes(axes, x.ndim, len(starts))
    steps = steps or [1] * len(starts)
    dims = ctx.bounded(x)
    if relative := sorted({dims[a] for a, s, e, st in zip(axes, starts, ends, steps, strict=True)
                           if dims[a] is not None and min(s, e, st) < 0}):
        # The bound's size resolves a negative start or end: at another size it is elsewhere (passes/dynamic.py
        # takes starts from the front, ends at or past the end, and fixed ends the size always reaches).
        from svodc.passes.dynamic import DynamicShapeError

        raise DynamicShapeError(f"node {ctx.name!r} (SLICE) slices a bounded dim relative to its end or backwards: "
                                f"not supported for a bounded dim yet; fix the dim with "
                                f"{' '.join(f'--dim {d}=SIZE' for d in relative)}")
    return slice_view(x, starts, ends, axes, steps, from_front=any(dims[a] is not None for a in axes))


def _pad_value(ctx: NodeContext, x: UOp) -> UOp | int | float | bool:
    if ctx.version < 11:
        return ctx.attr("value", 0.0) if x.dtype.is_float else int(ctx.attr("value", 0.0))
    v = ctx.optional_input(2)
    if v is None:
        return False if x.dtype is dtypes.bool else 0
    if is_constant(v):
        return np.asarray(constant_value(v)).reshape(-1)[0].item()
    return T.reshape(v, ())  # a run-time pad value: selected in below


@onnx_op("Pad", 1, 2, 11, 13, 18, 19, 21, 23, 24, 25)
def pad(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    mode = ctx.attr("mode", "constant")
    if ctx.version < 11:
        pads = ctx.ints("paddings" if ctx.version < 2 else "pads")
        axes = None
    elif not all(v is None or is_constant(v) for v in ctx.inputs[1:4:2]):  # pads or axes at run time
        return pad_runtime.pad_at_run_time(ctx, x, mode, _pad_value(ctx, x))
    else:
        pads = _ints(ctx.const_input(1, "pads"))
        axes = _ints(ctx.optional_const_input(3, "axes")) if ctx.version >= 18 else None
    axes = _axes(axes, x.ndim, x.ndim)
    if pads is None or len(pads) != 2 * len(axes):
        raise Unsupported(f"pads needs {2 * len(axes)} values")
    full = [(0, 0)] * x.ndim
    for k, a in enumerate(axes):
        full[a] = (pads[k], pads[k + len(axes)])
    # negative pads crop first
    x = T.shrink(x, [(max(0, -b), d - max(0, -e)) for (b, e), d in zip(full, x.shape, strict=True)])
    full = [(max(0, b), max(0, e)) for b, e in full]
    if mode == "constant":
        value = _pad_value(ctx, x)
        if not isinstance(value, UOp):
            return T.pad(x, full, value)
        inside = T.pad(T.const(True, dtypes.bool, x.shape), full, False)
        return T.alu(Ops.WHERE, inside, T.pad(x, full, 0), value.cast(x.dtype))
    if mode not in ("reflect", "edge", "wrap"):
        raise Unsupported(f"mode={mode!r} is not supported")
    for a, (b, e) in enumerate(full):
        if b or e:
            n = x.shape[a]
            if n == 0 or (mode == "reflect" and n == 1 and (b or e)):
                raise Unsupported(f"cannot {mode}-pad an axis of size {n}")
            src = np.pad(np.arange(n, dtype=np.int64), (b, e), mode=mode)
            x = gather_axis(x, weight(src), a)
    return x


@onnx_op("Split", 1, 2, 11, 13, 18, strings=True)
def split(ctx: NodeContext) -> list[UOp]:
    x = ctx.input(0)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    n, outs = x.shape[axis], ctx.num_outputs
    if ctx.version >= 13 and (v := ctx.optional_input(1)) is not None and not is_constant(v):
        return view_runtime.split_at_run_time(ctx, x, axis)
    if ctx.version >= 13:
        sizes = _ints(ctx.optional_const_input(1, "split"))
    elif ctx.version < 2 and ctx.optional_input(1) is not None:
        sizes = _ints(ctx.const_input(1, "split"))
    else:
        sizes = ctx.ints("split")
    if sizes is None:
        if ctx.version >= 18 and ctx.has_attr("num_outputs"):
            k = int(ctx.attr("num_outputs"))
            chunk = -(-n // k)
            sizes = [min(chunk, n - i * chunk) for i in range(k)]
        else:
            if n % outs:
                raise Unsupported(f"axis of size {n} does not split into {outs} equal parts")
            sizes = [n // outs] * outs
    if sum(sizes) != n or len(sizes) != outs:
        raise Unsupported(f"split sizes {sizes} do not fit axis of size {n} and {outs} outputs")
    parts, start = [], 0
    for size in sizes:
        bounds = [(0, d) for d in x.shape]
        bounds[axis] = (start, start + size)
        parts.append(T.shrink(x, bounds))
        start += size
    return parts


@onnx_op("Tile", 1, 6, 13, strings=True)
def tile(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version < 6:
        tiles, axis = int(ctx.const_input(1, "tiles").reshape(-1)[0]), int(ctx.const_input(2, "axis").reshape(-1)[0])
        reps = [1] * x.ndim
        reps[axis] = tiles
    elif not is_constant(ctx.input(1)):
        return _tile_at_run_time(ctx, x, ctx.input(1))
    else:
        reps = _ints(ctx.const_input(1, "repeats"))
    if len(reps) != x.ndim:
        raise Unsupported(f"repeats has {len(reps)} values for rank {x.ndim}")
    inter = tuple(v for d in x.shape for v in (1, d))
    big = tuple(v for r, d in zip(reps, x.shape, strict=True) for v in (r, d))
    out = T.expand(T.reshape(x, inter), big)
    return T.reshape(out, tuple(r * d for r, d in zip(reps, x.shape, strict=True)))


def _tile_at_run_time(ctx: NodeContext, x: UOp, repeats: UOp) -> UOp:
    """Axis a of the output is dim * repeats[a], within the bound the user gives; element o reads
    x at o mod dim (a constant index vector at the bound)."""
    if T.numel(repeats) != x.ndim:
        raise Unsupported(f"repeats has {T.numel(repeats)} values for rank {x.ndim}")
    dims, checks = [], []
    for a, d in enumerate(x.shape):
        if d == 0:
            dims.append(0)
            continue
        hi = user_bound(ctx, 0, a, 1)
        x = gather_axis(x, weight(np.arange(hi, dtype=np.int64) % d), a)
        rep = element(repeats, a)
        checks.append(T.alu(Ops.CMPLT, T.const(-1, dtypes.int64), rep))
        dims.append((T.alu(Ops.MUL, rep, T.const(d, dtypes.int64)), 0, hi))
    valid = T.const(True, dtypes.bool)
    for c in checks:
        valid = T.alu(Ops.AND, valid, c)
    return bounded_output(ctx, x, dims, valid, 1)


@onnx_op("DepthToSpace", 1, 11, 13, 28)
def depth_to_space(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    bs = int(ctx.attr("blocksize"))
    b, c, h, w = x.shape
    if c % (bs * bs):
        raise Unsupported(f"channels {c} are not a multiple of blocksize^2 = {bs * bs}")
    c2 = c // (bs * bs)
    if ctx.attr("mode", "DCR") == "DCR":
        tmp = T.permute(T.reshape(x, (b, bs, bs, c2, h, w)), (0, 3, 4, 1, 5, 2))
    else:
        tmp = T.permute(T.reshape(x, (b, c2, bs, bs, h, w)), (0, 1, 4, 2, 5, 3))
    return T.reshape(tmp, (b, c2, h * bs, w * bs))


@onnx_op("SpaceToDepth", 1, 13, 28)
def space_to_depth(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    bs = int(ctx.attr("blocksize"))
    b, c, h, w = x.shape
    if h % bs or w % bs:
        raise Unsupported(f"spatial size {h}x{w} is not a multiple of blocksize {bs}")
    tmp = T.reshape(x, (b, c, h // bs, bs, w // bs, bs))
    order = (0, 3, 5, 1, 2, 4) if ctx.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    return T.reshape(T.permute(tmp, order), (b, c * bs * bs, h // bs, w // bs))


@onnx_op("CenterCropPad", 18)
def center_crop_pad(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    axes = _axes(ctx.ints("axes"), x.ndim, x.ndim)
    if not is_constant(ctx.input(1)):
        return pad_runtime.center_crop_pad_at_run_time(ctx, x, axes)
    target = _ints(ctx.const_input(1, "shape"))
    if len(target) != len(axes):
        raise Unsupported(f"shape has {len(target)} values for {len(axes)} axes")
    crop = [(0, d) for d in x.shape]
    pads = [(0, 0)] * x.ndim
    for a, t in zip(axes, target, strict=True):
        d = x.shape[a]
        if t < d:
            crop[a] = ((d - t) // 2, (d - t) // 2 + t)
        elif t > d:
            pads[a] = ((t - d) // 2, t - d - (t - d) // 2)
    return T.pad(T.shrink(x, crop), pads, 0)


@onnx_op("ReverseSequence", 10, 28)
def reverse_sequence(ctx: NodeContext) -> UOp:
    """out[b, t] = x[b, len[b] - 1 - t] for t < len[b], else x[b, t]: a GATHER along the time axis."""
    x, lens = ctx.input(0), ctx.input(1)
    batch_axis, time_axis = int(ctx.attr("batch_axis", 1)), int(ctx.attr("time_axis", 0))
    n = x.shape[time_axis]
    shape = [1] * x.ndim
    shape[batch_axis] = x.shape[batch_axis]
    length = T.reshape(lens.cast(dtypes.int64), shape)
    t = iota_along(n, time_axis, x.ndim)
    rev = T.alu(Ops.SUB, T.alu(Ops.SUB, length, T.const(1, dtypes.int64)), t)
    idx = T.broadcast_to(T.alu(Ops.WHERE, T.alu(Ops.CMPLT, t, length), rev, T.broadcast_to(t, rev.shape)), x.shape)
    return UOp(Ops.GATHER, x.dtype, (x, idx), GatherArg(time_axis))


@onnx_op("Trilu", 14)
def trilu(ctx: NodeContext) -> UOp:
    """Keep x where j - i >= k (upper) or j - i <= k (lower) on the last two axes. k may be a run-time
    value: the mask is then computed from the positions."""
    x = ctx.input(0)
    n, m = x.shape[-2:]
    offset = weight(np.arange(m, dtype=np.int64)[None, :] - np.arange(n, dtype=np.int64)[:, None])  # j - i
    k = ctx.optional_input(1)
    k = T.const(0, dtypes.int64) if k is None else T.reshape(k.cast(dtypes.int64), ())
    k = T.broadcast_to(k, (n, m))
    if ctx.attr("upper", 1):
        keep = T.alu(Ops.NOT, T.alu(Ops.CMPLT, offset, k))  # j - i >= k
    else:
        keep = T.alu(Ops.NOT, T.alu(Ops.CMPLT, k, offset))  # j - i <= k
    return T.alu(Ops.WHERE, T.broadcast_to(keep, x.shape), x, T.scalar_like(x, 0))


@onnx_op("EyeLike", 9, 22)
def eye_like(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    dtype = ctx.dtype_attr("dtype") if ctx.has_attr("dtype") else x.dtype
    if x.ndim != 2:
        raise Unsupported(f"EyeLike needs a 2-D input, got shape {x.shape}")
    return weight(np.eye(x.shape[0], x.shape[1], int(ctx.attr("k", 0)), dtype=dtype.np))


@onnx_op("Range", 11, 27)
def range_(ctx: NodeContext) -> UOp:
    if any(not is_constant(ctx.input(i)) for i in range(3)):
        return _range_at_run_time(ctx)
    start, limit, delta = (ctx.const_input(i, what).reshape(()) for i, what in
                           enumerate(("start", "limit", "delta")))
    if delta == 0:
        raise Unsupported("delta is 0")
    count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    if start.dtype.kind in "iu":
        values = start + np.arange(count, dtype=start.dtype) * delta
    else:  # start + i * delta in double, rounded once (stash_type only matters for a running sum)
        values = float(start) + np.arange(count, dtype=np.float64) * float(delta)
    return weight(np.asarray(values, dtype=start.dtype))


def _range_at_run_time(ctx: NodeContext) -> UOp:
    """max(ceil((limit - start) / delta), 0) values start + i * delta (in double for floats), at the
    bound the user gives for the count."""
    start, limit, delta = (T.reshape(ctx.input(i), ()) for i in range(3))
    hi = user_bound(ctx, 0, 0, 1)
    f64 = dtypes.float64
    count = T.alu(Ops.DIV, T.alu(Ops.SUB, limit.cast(f64), start.cast(f64)), delta.cast(f64))
    ceil = T.alu(Ops.NEG, UOp(Ops.FLOOR, f64, (T.alu(Ops.NEG, count),)))
    n = T.alu(Ops.MAX, ceil, T.const(0.0, f64))
    i = weight(np.arange(hi, dtype=np.int64))
    calc = start.dtype if start.dtype.is_int else f64
    values = T.alu(Ops.ADD, start.cast(calc), T.alu(Ops.MUL, i.cast(calc), delta.cast(calc))).cast(start.dtype)
    valid = T.alu(Ops.CMPNE, delta, T.scalar_like(delta, 0))
    return bounded_output(ctx, values, [(n.cast(dtypes.int64), 0, hi)], valid, 1)


@onnx_op("Col2Im", 18)
def col2im(ctx: NodeContext) -> UOp:
    """Sums sliding blocks back into an image. The geometry is known at compile time, so each image
    position's contributions (block offset k, block l) form a constant table; the op is a GATHER of
    those columns and a sum."""
    x = ctx.input(0)
    image = _ints(ctx.const_input(1, "image_shape"))
    block = _ints(ctx.const_input(2, "block_shape"))
    nsp = len(image)
    dil = ctx.ints("dilations", [1] * nsp)
    pads = ctx.ints("pads", [0] * (2 * nsp))
    strides = ctx.ints("strides", [1] * nsp)
    n, ck, cols = x.shape
    k_total = math.prod(block)
    if ck % k_total:
        raise Unsupported(f"input channels {ck} are not a multiple of the block size {k_total}")
    blocks = [(image[i] + pads[i] + pads[i + nsp] - dil[i] * (block[i] - 1) - 1) // strides[i] + 1
              for i in range(nsp)]
    if math.prod(blocks) != cols:
        raise Unsupported(f"{cols} columns do not match {blocks} block positions")
    sources: list[list[int]] = [[] for _ in range(math.prod(image))]
    for k, offs in enumerate(np.ndindex(*block)):
        for l, pos in enumerate(np.ndindex(*blocks)):
            p = [pos[i] * strides[i] + offs[i] * dil[i] - pads[i] for i in range(nsp)]
            if all(0 <= p[i] < image[i] for i in range(nsp)):
                sources[int(np.ravel_multi_index(p, image))].append(k * cols + l)
    j = max(1, max(len(s) for s in sources))
    idx = np.zeros((len(sources), j), dtype=np.int64)
    valid = np.zeros((len(sources), j), dtype=bool)
    for p, src in enumerate(sources):
        idx[p, :len(src)] = src
        valid[p, :len(src)] = True
    c = ck // k_total
    taps = gather_axis(T.reshape(x, (n, c, k_total * cols)), weight(idx), 2)  # [n, c, P, j]
    taps = T.alu(Ops.WHERE, T.broadcast_to(weight(valid), taps.shape), taps, T.scalar_like(taps, 0))
    return T.reshape(T.reduce(taps, Ops.ADD, [3], keepdims=False), (n, c, *image))
