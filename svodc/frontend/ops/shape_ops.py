"""Shape and data-movement ONNX ops, and constants. Shapes are static here, so Shape, Size and the
arithmetic on them become constants that fold at compile time."""

from __future__ import annotations

import numpy as np
from onnx import numpy_helper

from svodc.frontend.context import NodeContext, Unsupported, is_constant
from svodc.frontend.dtypes import onnx_to_dtype
from svodc.frontend.ops import view_runtime
from svodc.frontend.registry import onnx_op
from svodc.frontend.runtime_dims import bounded_output, element, user_bound
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp


def weight(array: np.ndarray) -> UOp:
    array = np.asarray(array)
    return UOp(Ops.WEIGHT, dtypes.from_numpy(array.dtype), (), ConstData(array))


@onnx_op("Reshape", 1, 5, 13, 14, 19, 21, 23, 24, 25, strings=True)
def reshape(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    allowzero = ctx.version >= 14 and ctx.attr("allowzero", 0)
    if ctx.version >= 5 and not is_constant(ctx.input(1)):
        return view_runtime.reshape_at_run_time(ctx, x, bool(allowzero))
    shape = ctx.ints("shape") if ctx.version < 5 else [int(v) for v in ctx.const_input(1, "shape")]
    out = []
    for i, d in enumerate(shape):
        if d == 0 and not allowzero:
            if i >= x.ndim:
                raise Unsupported(f"shape[{i}] = 0 copies a dimension the input (rank {x.ndim}) does not have")
            out.append(x.shape[i])
        else:
            out.append(d)
    if out.count(-1) > 1:
        raise Unsupported("shape has more than one -1")
    if -1 in out:
        known = int(np.prod([d for d in out if d != -1]))
        total = T.numel(x)
        if known == 0 or total % known:
            raise Unsupported(f"cannot reshape {x.shape} to {shape}")
        out[out.index(-1)] = total // known
    if int(np.prod(out)) != T.numel(x):
        raise Unsupported(f"cannot reshape {x.shape} to {shape}")
    return T.reshape(x, out)


@onnx_op("Flatten", 1, 9, 11, 13, 21, 23, 24, 25, strings=True)
def flatten(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    axis = ctx.attr("axis", 1)
    axis = axis + x.ndim if axis < 0 else axis
    if not 0 <= axis <= x.ndim:
        raise Unsupported(f"axis {axis} out of range for rank {x.ndim}")
    return T.reshape(x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))


@onnx_op("Transpose", 1, 13, 21, 23, 24, 25, strings=True)
def transpose(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    perm = ctx.ints("perm", list(range(x.ndim))[::-1])
    return T.permute(x, [p % x.ndim for p in perm])


@onnx_op("Concat", 1, 4, 11, 13, strings=True)
def concat(ctx: NodeContext) -> UOp:
    xs = [x for x in ctx.inputs if x is not None]
    axis = ctx.attr("axis", 1 if ctx.version < 4 else None)
    if axis is None:
        raise Unsupported("attribute 'axis' is required")
    return T.concat(xs, axis)


def _axes_arg(ctx: NodeContext, since_input: int) -> list[int] | None:
    if ctx.version < since_input:
        return ctx.ints("axes")
    a = ctx.optional_const_input(1, "axes")
    return None if a is None else [int(v) for v in a.reshape(-1)]


@onnx_op("Unsqueeze", 1, 11, 13, 21, 23, 24, 25, strings=True)
def unsqueeze(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version >= 13 and not is_constant(ctx.input(1)):
        return view_runtime.unsqueeze_at_run_time(ctx, x, ctx.input(1))
    axes = _axes_arg(ctx, 13)
    if axes is None:
        raise Unsupported("axes are required")
    rank = x.ndim + len(axes)
    axes = sorted(a % rank for a in axes)
    shape = list(x.shape)
    for a in axes:
        shape.insert(a, 1)
    return T.reshape(x, shape)


@onnx_op("Squeeze", 1, 11, 13, 21, 23, 24, 25, strings=True)
def squeeze(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if ctx.version >= 13 and (a := ctx.optional_input(1)) is not None and not is_constant(a):
        return view_runtime.squeeze_at_run_time(ctx, x, a)
    axes = _axes_arg(ctx, 13)
    if axes is None:
        axes = [i for i, d in enumerate(x.shape) if d == 1]
    axes = {a % x.ndim for a in axes}
    if any(x.shape[a] != 1 for a in axes):
        raise Unsupported(f"cannot squeeze axes {sorted(axes)} of shape {x.shape}")
    return T.reshape(x, [d for i, d in enumerate(x.shape) if i not in axes])


@onnx_op("Shape", 1, 13, 15, 19, 21, 23, 24, 25, strings=True)
def shape(ctx: NodeContext) -> UOp:
    dims = list(ctx.input(0).shape)
    start, end = ctx.attr("start", 0), ctx.attr("end", None)
    return weight(np.array(dims[start:end] if end is not None else dims[start:], dtype=np.int64))


@onnx_op("Size", 1, 13, 19, 21, 23, 24, 25, strings=True)
def size(ctx: NodeContext) -> UOp:
    return weight(np.array(T.numel(ctx.input(0)), dtype=np.int64))


@onnx_op("ConstantOfShape", 9, 20, 21, 23, 24, 25)
def constant_of_shape(ctx: NodeContext) -> UOp:
    value = ctx.attr("value")
    if value is None:
        value = np.zeros(1, dtype=np.float32)
    value = np.asarray(value).reshape(-1)
    dtype = dtypes.from_numpy(value.dtype)
    if not is_constant(ctx.input(0)):  # a run-time shape: at the bounds the user gives, one per axis
        shape = ctx.input(0)
        his = [user_bound(ctx, 0, j, 0) for j in range(T.numel(shape))]
        dims = [(element(shape, j), 0, hi) for j, hi in enumerate(his)]
        return bounded_output(ctx, T.const(value[0].item(), dtype, his), dims, None, 0)
    dims = [int(v) for v in ctx.const_input(0, "shape").reshape(-1)]
    return T.const(value[0].item(), dtype, dims)


@onnx_op("Constant", 1, 9, 11, 12, 13, 19, 21, 23, 24, 25, strings=True)
def constant(ctx: NodeContext) -> UOp:
    for name, a in ctx._attrs.items():
        if name == "value":
            t = a.t
            dtype = onnx_to_dtype(t.data_type, where="attribute 'value'")
            if dtype is dtypes.string:  # interned: the tensor holds ids (frontend/strings.py)
                return ctx.vocabulary.constant(numpy_helper.to_array(t), "attribute 'value'")
            return UOp(Ops.WEIGHT, dtype, (), ConstData(np.asarray(numpy_helper.to_array(t), dtype=dtype.np)))
        if name == "value_float":
            return weight(np.array(a.f, dtype=np.float32))
        if name == "value_floats":
            return weight(np.array(list(a.floats), dtype=np.float32))
        if name == "value_int":
            return weight(np.array(a.i, dtype=np.int64))
        if name == "value_ints":
            return weight(np.array(list(a.ints), dtype=np.int64))
        if name == "value_string":
            return ctx.vocabulary.constant(np.array(a.s, dtype=object), "attribute 'value_string'")
        if name == "value_strings":
            return ctx.vocabulary.constant(np.array(list(a.strings), dtype=object), "attribute 'value_strings'")
        raise Unsupported(f"Constant with attribute {name!r} is not supported")
    raise Unsupported("Constant has no value attribute")


@onnx_op("Expand", 8, 13, strings=True)
def expand(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if not is_constant(ctx.input(1)):
        return _expand_at_run_time(ctx, x, ctx.input(1))
    target = [int(v) for v in ctx.const_input(1, "shape").reshape(-1)]
    return T.broadcast_to(x, T.broadcast_shape(x.shape, target))


def _expand_at_run_time(ctx: NodeContext, x: UOp, shape: UOp) -> UOp:
    """Axis j of the output: x's dim where it is not 1 (the shape's value must be 1 or that dim), else
    the shape's value, within the bound the user gives."""
    k = T.numel(shape)
    rank = max(x.ndim, k)
    xd = (1,) * (rank - x.ndim) + x.shape
    bound, dims, checks = [], [], []
    for j in range(rank):
        v = element(shape, j - (rank - k)) if j >= rank - k else None
        if xd[j] != 1 or v is None:
            bound.append(xd[j])
            dims.append(xd[j])
            if v is not None:
                checks.append(T.alu(Ops.OR, T.alu(Ops.CMPEQ, v, T.const(1, dtypes.int64)),
                                    T.alu(Ops.CMPEQ, v, T.const(xd[j], dtypes.int64))))
            continue
        bound.append(user_bound(ctx, 0, j, 1))
        dims.append((v, 0, bound[-1]))
    valid = T.const(True, dtypes.bool)
    for c in checks:
        valid = T.alu(Ops.AND, valid, c)
    return bounded_output(ctx, T.broadcast_to(x, bound), dims, valid, 1)
