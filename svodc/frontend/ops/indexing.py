"""Indexing with run-time index values (Gather*, Scatter*, OneHot), arg-reductions, TopK, cumulative
sums (their axis may be a run-time input), and the ops whose output shape depends on data (NonZero,
Compress, Unique: only with inputs known at compile time).

Run-time indices become the IR's GATHER/SCATTER along one axis. Multi-component indices (GatherND,
ScatterND) are linearized first: the indexed axes of the data are merged into one, and each index
row becomes one linear index (components normalized separately, so negative components count from
the end of their own axis).
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.runtime_dims import bounded_output, user_bound
from svodc.frontend.runtime_values import axis_choice
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import normalize_index
from svodc.ir.ops import GatherArg, Ops, ScatterArg
from svodc.ir.uop import UOp

_I64 = dtypes.int64


def gather_axis(x: UOp, idx: UOp, axis: int, sized: tuple[int, int] | None = None) -> UOp:
    """ONNX Gather: out[pre, i..., post] = x[pre, idx[i...], post], idx of any rank. `sized` (mul, div): idx
    depends only on the position along its first axis, of floor(size * mul / div) elements (GatherArg.sized)."""
    if T.numel(idx) == 1 and is_constant(idx):  # one known index (x[:, 3]): a view, no index load
        n = x.shape[axis]
        i = int(np.clip(normalize_index(constant_value(idx).reshape(-1), n)[0], 0, max(n - 1, 0)))
        bounds = [(0, d) for d in x.shape]
        bounds[axis] = (i, i + 1)
        return T.reshape(T.shrink(x, bounds), x.shape[:axis] + idx.shape + x.shape[axis + 1:])
    if idx.ndim == 0:
        out = gather_axis(x, T.reshape(idx, (1,)), axis)
        return T.reshape(out, x.shape[:axis] + x.shape[axis + 1:])
    pre, post, r = x.shape[:axis], x.shape[axis + 1:], idx.ndim
    xr = T.reshape(x, pre + (1,) * (r - 1) + (x.shape[axis],) + post)
    out_shape = pre + idx.shape + post
    ir = T.expand(T.reshape(idx, (1,) * len(pre) + idx.shape + (1,) * len(post)), out_shape)
    return UOp(Ops.GATHER, x.dtype, (xr, ir), GatherArg(len(pre) + r - 1, sized and (len(pre), *sized)))


def normalized(idx: UOp, size: int | UOp) -> UOp:
    """idx + size where idx < 0 (as int64; size a compile-time int or a run-time int64 scalar)."""
    i = idx.cast(_I64)
    n = T.const(size, _I64) if isinstance(size, int) else size
    return T.alu(Ops.WHERE, T.alu(Ops.CMPLT, i, T.const(0, _I64)), T.alu(Ops.ADD, i, n), i)


def linear_index(idx: UOp, dims: tuple[int, ...]) -> UOp:
    """Rows of idx (last axis: one component per dim) as linear indices into dims, row-major."""
    k = idx.shape[-1]
    lead = idx.shape[:-1]
    out: UOp | None = None
    for j in range(k):
        bounds = [(0, d) for d in lead] + [(j, j + 1)]
        comp = normalized(T.reshape(T.shrink(idx, bounds), lead), dims[j])
        stride = math.prod(dims[j + 1:])
        term = comp if stride == 1 else T.alu(Ops.MUL, comp, T.const(stride, _I64))
        out = term if out is None else T.alu(Ops.ADD, out, term)
    return out if out is not None else T.const(0, _I64, lead)


@onnx_op("Gather", 1, 11, 13, strings=True)
def gather(ctx: NodeContext) -> UOp:
    x, idx = ctx.input(0), ctx.input(1)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    if x.shape[axis] == 0 and T.numel(idx):
        raise Unsupported(f"cannot gather from the empty axis {axis} of {x.shape}")
    return gather_axis(x, idx, axis)


@onnx_op("GatherElements", 11, 13)
def gather_elements(ctx: NodeContext) -> UOp:
    x, idx = ctx.input(0), ctx.input(1)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    return UOp(Ops.GATHER, x.dtype, (x, idx), GatherArg(axis))


@onnx_op("GatherND", 11, 12, 13)
def gather_nd(ctx: NodeContext) -> UOp:
    x, idx = ctx.input(0), ctx.input(1)
    b = int(ctx.attr("batch_dims", 0)) if ctx.version >= 12 else 0
    k = idx.shape[-1]
    batch, dims, rest = x.shape[:b], x.shape[b:b + k], x.shape[b + k:]
    middle = idx.shape[b:-1]
    lin = linear_index(idx, dims)  # batch + middle
    xr = T.reshape(x, batch + (math.prod(dims),) + rest)
    if not middle:
        lin = T.reshape(lin, batch + (1,))
    m = middle or (1,)
    out = gather_batched(xr, lin, b, m, rest)
    return T.reshape(out, batch + middle + rest)


def gather_batched(xr: UOp, lin: UOp, b: int, middle: tuple[int, ...], rest: tuple[int, ...]) -> UOp:
    """out[B, M, R] = xr[B, lin[B, M], R] for xr of shape B + (N,) + R."""
    batch = xr.shape[:b]
    x2 = T.reshape(xr, batch + (1,) * (len(middle) - 1) + (xr.shape[b],) + rest)
    out_shape = batch + middle + rest
    i2 = T.expand(T.reshape(lin, batch + middle + (1,) * len(rest)), out_shape)
    return UOp(Ops.GATHER, xr.dtype, (x2, i2), GatherArg(b + len(middle) - 1))


_REDUCTIONS = {"none": None, "add": Ops.ADD, "mul": Ops.MUL, "max": Ops.MAX, "min": Ops.MIN}


def _reduction(ctx: NodeContext) -> Ops | None:
    name = ctx.attr("reduction", "none")
    if name not in _REDUCTIONS:
        raise Unsupported(f"reduction={name!r} is not a valid value")
    return _REDUCTIONS[name]


@onnx_op("ScatterElements", 11, 13, 16, 18)
def scatter_elements(ctx: NodeContext) -> UOp:
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    return UOp(Ops.SCATTER, x.dtype, (x, idx, upd), ScatterArg(axis, _reduction(ctx)))


@onnx_op("Scatter", 9, 11)
def scatter(ctx: NodeContext) -> UOp:
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    return UOp(Ops.SCATTER, x.dtype, (x, idx, upd), ScatterArg(axis))


@onnx_op("ScatterND", 11, 13, 16, 18)
def scatter_nd(ctx: NodeContext) -> UOp:
    x, idx, upd = ctx.input(0), ctx.input(1), ctx.input(2)
    k = idx.shape[-1]
    dims, rest, lead = x.shape[:k], x.shape[k:], idx.shape[:-1]
    m = math.prod(lead)
    xr = T.reshape(x, (math.prod(dims),) + rest)
    lin = T.reshape(linear_index(idx, dims), (m,) + (1,) * len(rest))
    ur = T.reshape(upd, (m,) + rest)
    out = UOp(Ops.SCATTER, x.dtype, (xr, T.expand(lin, (m,) + rest), ur), ScatterArg(0, _reduction(ctx)))
    return T.reshape(out, x.shape)


@onnx_op("OneHot", 9, 11, 28)
def one_hot(ctx: NodeContext) -> UOp:
    idx, values = ctx.input(0), ctx.input(2)
    rank = idx.ndim + 1
    axis = T.norm_axis(ctx.attr("axis", -1), rank)
    run_time = not is_constant(ctx.input(1))
    if run_time:  # a run-time depth: the output at the bound the user gives for its axis
        d = ctx.input(1)
        d = UOp(Ops.TRUNC, d.dtype, (d,)) if d.dtype.is_float else d
        depth_value = T.reshape(d, (T.numel(d),))
        depth_value = T.reshape(T.shrink(depth_value, [(0, 1)]), ()).cast(_I64)
        depth = user_bound(ctx, 0, axis, 1)
    else:
        depth = int(np.asarray(ctx.const_input(1, "depth")).reshape(-1)[0])
        depth_value = T.const(depth, _I64)
    i = idx if not idx.dtype.is_float else UOp(Ops.TRUNC, idx.dtype, (idx,))
    i = normalized(i.cast(_I64), depth_value if run_time else depth) if ctx.version >= 11 else i.cast(_I64)
    shape = idx.shape[:axis] + (1,) + idx.shape[axis:]
    iota_shape = [1] * rank
    iota_shape[axis] = depth
    iota = T.reshape(weight(np.arange(depth, dtype=np.int64)), iota_shape)
    hit = T.alu(Ops.CMPEQ, T.reshape(i, shape), iota)
    off = T.reshape(T.shrink(T.reshape(values, (2,)), [(0, 1)]), ())
    on = T.reshape(T.shrink(T.reshape(values, (2,)), [(1, 2)]), ())
    out = T.alu(Ops.WHERE, hit, on, off)
    if not run_time:
        return out
    dims = [(depth_value, 0, depth) if a == axis else d for a, d in enumerate(out.shape)]
    return bounded_output(ctx, out, dims, T.alu(Ops.CMPLT, T.const(0, _I64), depth_value), 1)


def iota_along(n: int, axis: int, ndim: int) -> UOp:
    shape = [1] * ndim
    shape[axis] = n
    return T.reshape(weight(np.arange(n, dtype=np.int64)), shape)


def _arg_extreme(find_max: bool):
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
        keep = bool(ctx.attr("keepdims", 1))
        last = bool(ctx.attr("select_last_index", 0))
        n = x.shape[axis]
        best = T.reduce(x, Ops.MAX if find_max else Ops.MIN, [axis])
        hit = T.alu(Ops.CMPEQ, x, best)
        if x.dtype.is_float:  # NaN is the extreme (numpy's argmax/argmin): match NaN with NaN
            nan_x = T.alu(Ops.CMPNE, x, x)
            nan_best = T.alu(Ops.CMPNE, best, best)
            hit = T.alu(Ops.OR, hit, T.alu(Ops.AND, nan_x, nan_best))
        iota = iota_along(n, axis, x.ndim)
        miss = T.const(-1 if last else n, _I64)
        pos = T.reduce(T.alu(Ops.WHERE, hit, iota, miss), Ops.MAX if last else Ops.MIN, [axis], keepdims=keep)
        return pos
    return handler


onnx_op("ArgMax", 1, 11, 12, 13)(_arg_extreme(True))
onnx_op("ArgMin", 1, 11, 12, 13)(_arg_extreme(False))


@onnx_op("TopK", 1, 10, 11, 24)
def top_k(ctx: NodeContext) -> list[UOp]:
    """Ranks by pairwise comparison (ties: lower index first), then the element of each rank.
    O(n^2) per row along the axis, in plain tensor ops. (NaN compares false with everything, so it
    keeps its position among equals; ONNX leaves NaN ordering unspecified.)"""
    x = ctx.input(0)
    axis = T.norm_axis(ctx.attr("axis", -1), x.ndim)
    n = x.shape[axis]
    if ctx.version >= 10 and not is_constant(ctx.input(1)):
        # K at run time: every element ranked (the first K of the full order are the top K), the outputs
        # returned K long along the axis, K checked against [0, n]
        k_value = T.reshape(ctx.input(1), ()).cast(_I64)
        valid = T.alu(Ops.AND, T.alu(Ops.CMPLT, k_value, T.const(n + 1, _I64)),
                      T.alu(Ops.CMPLT, T.const(-1, _I64), k_value))
        dims = [k_value if a == axis else d for a, d in enumerate(x.shape)]
        return [bounded_output(ctx, o, [(d, 0, n) if a == axis else d for a, d in enumerate(dims)], valid, 1, i)
                for i, o in enumerate(_top_k(ctx, x, axis, n))]
    k = int(ctx.attr("k")) if ctx.version < 10 else int(np.asarray(ctx.const_input(1, "K")).reshape(-1)[0])
    if not 0 <= k <= n:
        raise Unsupported(f"K={k} is outside [0, {n}]")
    return _top_k(ctx, x, axis, k)


def _top_k(ctx: NodeContext, x: UOp, axis: int, k: int) -> list[UOp]:
    largest, n = bool(ctx.attr("largest", 1)), x.shape[axis]
    order = [a for a in range(x.ndim) if a != axis] + [axis]
    xt = T.permute(x, order)
    lead = xt.shape[:-1]
    full = lead + (n, n)
    xi = T.expand(T.reshape(xt, lead + (n, 1)), full)  # [.., i, j] = x_i
    xj = T.expand(T.reshape(xt, lead + (1, n)), full)  # [.., i, j] = x_j
    beats = T.alu(Ops.CMPLT, xi, xj) if largest else T.alu(Ops.CMPLT, xj, xi)  # x_j ranks before x_i
    equal = T.alu(Ops.CMPEQ, xi, xj)
    earlier = weight(np.tril(np.ones((n, n), dtype=bool), -1))  # [i, j] = j < i
    before = T.alu(Ops.OR, beats, T.alu(Ops.AND, equal, T.broadcast_to(earlier, full)))
    rank = T.reduce(before.cast(_I64), Ops.ADD, [len(lead) + 1], keepdims=False)  # lead + (n,)
    ranks = T.expand(T.reshape(rank, lead + (1, n)), lead + (k, n))
    wanted = T.reshape(weight(np.arange(k, dtype=np.int64)), (k, 1))
    iota = T.reshape(weight(np.arange(n, dtype=np.int64)), (1, n))
    picked = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, ranks, wanted), iota, T.const(0, _I64))
    indices = T.reduce(picked, Ops.ADD, [len(lead) + 1], keepdims=False)  # lead + (k,)
    values = UOp(Ops.GATHER, x.dtype, (xt, indices), GatherArg(len(lead))) if k else T.const(0, x.dtype, lead + (0,))
    back = [order.index(a) for a in range(x.ndim)]
    return [T.permute(values, back), T.permute(indices, back)]


def _cumulative(op: Ops, identity: int):
    """CumSum/CumProd: along the axis, out[i] = x[0] op ... op x[i], as a window reduction over the
    input padded with n-1 identities in front (exclusive: shifted by one; reverse: flipped). The axis
    may be a run-time input (runtime_values.axis_choice)."""
    def handler(ctx: NodeContext) -> UOp:
        x = ctx.input(0)
        return axis_choice(ctx, 1, x.ndim, lambda axis: along(ctx, x, axis))

    def along(ctx: NodeContext, x: UOp, axis: int) -> UOp:
        n = x.shape[axis]
        if n == 0:
            return x
        flip = [(0, d, 1) for d in x.shape]
        flip[axis] = (n - 1, 0, -1)

        def flipped(t: UOp) -> UOp:
            return T.slice_axes(t, [s for s, _, _ in flip], [st for _, _, st in flip], t.shape)

        y = flipped(x) if ctx.attr("reverse", 0) else x
        if ctx.attr("exclusive", 0):
            pads = [(0, 0)] * x.ndim
            pads[axis] = (1, 0)
            bounds = [(0, d) for d in x.shape]
            y = T.shrink(T.pad(y, pads, identity), bounds)
        pads = [(0, 0)] * x.ndim
        pads[axis] = (n - 1, 0)
        win = T.window(T.pad(y, pads, identity), [axis], [n], [1], [1])
        out = T.reduce(win, op, [x.ndim], keepdims=False)
        return flipped(out) if ctx.attr("reverse", 0) else out
    return handler


onnx_op("CumSum", 11, 14)(_cumulative(Ops.ADD, 0))
onnx_op("CumProd", 26)(_cumulative(Ops.MUL, 1))


@onnx_op("MaxUnpool", 9, 11, 22)
def max_unpool(ctx: NodeContext) -> UOp:
    """x scattered at I (flat indices into the unpooled shape) into zeros; an explicit output_shape
    places that result at its origin (the ONNX reference's rule)."""
    x, idx = ctx.input(0), ctx.input(1)
    nsp = x.ndim - 2
    kernel = ctx.ints("kernel_shape")
    strides = ctx.ints("strides", [1] * nsp)
    pads = ctx.ints("pads", [0] * (2 * nsp))
    inferred = x.shape[:2] + tuple((d - 1) * s - pads[i] - pads[i + nsp] + k for i, (d, s, k) in
                                   enumerate(zip(x.shape[2:], strides, kernel, strict=True)))
    zeros = T.const(0, x.dtype, (math.prod(inferred),))
    flat = UOp(Ops.SCATTER, x.dtype, (zeros, T.reshape(idx, (T.numel(idx),)), T.reshape(x, (T.numel(x),))),
               ScatterArg(0))
    y = T.reshape(flat, inferred)
    shape = ctx.optional_const_input(2, "output_shape")
    if shape is None:
        return y
    out = [int(v) for v in np.asarray(shape).reshape(-1)]
    y = T.shrink(y, [(0, min(d, o)) for d, o in zip(inferred, out, strict=True)])
    return T.pad(y, [(0, max(0, o - d)) for d, o in zip(inferred, out, strict=True)], 0)


@onnx_op("TensorScatter", 24)
def tensor_scatter(ctx: NodeContext) -> UOp:
    """A cache update: past with update written at write_indices[b] + s along the sequence axis (wrapping
    around in circular mode)."""
    past, update, where = ctx.input(0), ctx.input(1), ctx.optional_input(2)
    axis = T.norm_axis(ctx.attr("axis", -2), past.ndim)
    n, s = past.shape[axis], update.shape[axis]
    batch = past.shape[0]
    start = T.const(0, _I64, (batch,)) if where is None else where.cast(_I64)
    pos = T.alu(Ops.ADD, T.reshape(start, (batch,) + (1,) * (past.ndim - 1)), iota_along(s, axis, past.ndim))
    if ctx.attr("mode", "linear") == "circular":
        pos = T.alu(Ops.MOD, pos, T.const(n, _I64))  # floor modulo: within [0, n) for any start
    elif ctx.attr("mode", "linear") != "linear":
        raise Unsupported(f"mode={ctx.attr('mode')!r} is not a valid value")
    return UOp(Ops.SCATTER, past.dtype, (past, T.broadcast_to(pos, update.shape), update), ScatterArg(axis))
