"""Sequence and optional ops: list operations at compile time on the frontend's SequenceValue and
OptionalValue (see values.py). Positions and lengths must be known at compile time; the tensors
inside are ordinary UOps."""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.movement import _ints
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.values import OptionalValue, SequenceValue, Value
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.uop import UOp


def _position(ctx: NodeContext, i: int, length: int, default: int, inclusive_end: bool = False) -> int:
    p = ctx.optional_const_input(i, "position")
    pos = default if p is None else int(np.asarray(p).reshape(-1)[0])
    hi = length if inclusive_end else length - 1
    if not -length <= pos <= hi:
        raise Unsupported(f"position {pos} is outside a sequence of length {length}")
    return pos + length if pos < 0 else pos


@onnx_op("SequenceEmpty", 11)
def sequence_empty(ctx: NodeContext) -> SequenceValue:
    return SequenceValue((), ctx.dtype_attr("dtype", 1))


@onnx_op("SequenceConstruct", 11)
def sequence_construct(ctx: NodeContext) -> SequenceValue:
    items = tuple(ctx.input(i) for i in range(len(ctx.inputs)))
    if len({x.dtype for x in items}) > 1:
        raise Unsupported("sequence elements must have one element type")
    return SequenceValue(items, items[0].dtype)


@onnx_op("SequenceAt", 11)
def sequence_at(ctx: NodeContext) -> UOp:
    seq = ctx.sequence_input(0)
    return seq.items[_position(ctx, 1, len(seq), 0)]


@onnx_op("SequenceInsert", 11)
def sequence_insert(ctx: NodeContext) -> SequenceValue:
    seq, x = ctx.sequence_input(0), ctx.input(1)
    pos = _position(ctx, 2, len(seq), len(seq), inclusive_end=True)
    return SequenceValue(seq.items[:pos] + (x,) + seq.items[pos:], seq.dtype)


@onnx_op("SequenceErase", 11)
def sequence_erase(ctx: NodeContext) -> SequenceValue:
    seq = ctx.sequence_input(0)
    pos = _position(ctx, 1, len(seq), len(seq) - 1)
    return SequenceValue(seq.items[:pos] + seq.items[pos + 1:], seq.dtype)


@onnx_op("SequenceLength", 11)
def sequence_length(ctx: NodeContext) -> UOp:
    return weight(np.array(len(ctx.sequence_input(0)), dtype=np.int64))


@onnx_op("SplitToSequence", 11, 24)
def split_to_sequence(ctx: NodeContext) -> SequenceValue:
    x = ctx.input(0)
    axis = T.norm_axis(ctx.attr("axis", 0), x.ndim)
    n = x.shape[axis]
    split = ctx.optional_const_input(1, "split")
    keep = True
    if split is None:
        sizes, keep = [1] * n, bool(ctx.attr("keepdims", 1))
    elif np.asarray(split).ndim == 0:
        chunk = int(split)
        sizes = [min(chunk, n - s) for s in range(0, n, chunk)]
    else:
        sizes = _ints(split)
    if sum(sizes) != n:
        raise Unsupported(f"split sizes {sizes} do not add up to the axis size {n}")
    items, start = [], 0
    for size in sizes:
        bounds = [(0, d) for d in x.shape]
        bounds[axis] = (start, start + size)
        part = T.shrink(x, bounds)
        items.append(part if keep else T.reshape(part, x.shape[:axis] + x.shape[axis + 1:]))
        start += size
    return SequenceValue(tuple(items), x.dtype)


@onnx_op("ConcatFromSequence", 11)
def concat_from_sequence(ctx: NodeContext) -> UOp:
    seq = ctx.sequence_input(0)
    if not len(seq):
        raise Unsupported("cannot concatenate an empty sequence")
    new_axis = bool(ctx.attr("new_axis", 0))
    rank = seq.items[0].ndim + (1 if new_axis else 0)
    axis = T.norm_axis(ctx.attr("axis"), rank)
    items = seq.items
    if new_axis:
        items = tuple(T.reshape(x, x.shape[:axis] + (1,) + x.shape[axis:]) for x in items)
    return T.concat(list(items), axis)


@onnx_op("SequenceMap", 17)
def sequence_map(ctx: NodeContext) -> list[SequenceValue]:
    body = ctx.subgraph("body")
    seq = ctx.sequence_input(0)
    extra = [ctx.value(i) for i in range(1, len(ctx.inputs))]
    n = len(seq)
    for v in extra:
        if isinstance(v, SequenceValue) and len(v) != n:
            raise Unsupported(f"SequenceMap input sequences differ in length ({n} and {len(v)})")
    results: list[list[Value]] = [[] for _ in body.output]
    for i in range(n):
        args = [seq.items[i], *(v.items[i] if isinstance(v, SequenceValue) else v for v in extra)]
        for k, out in enumerate(ctx.run_subgraph(body, args)):
            results[k].append(out)
    outs = []
    for k, items in enumerate(results):
        if not all(isinstance(v, UOp) for v in items):
            raise Unsupported(f"SequenceMap output {k} is not a tensor per element")
        dtype = items[0].dtype if items else _output_dtype(body.output[k])
        outs.append(SequenceValue(tuple(items), dtype))
    return outs


def _output_dtype(vi) -> object:
    from svodc.frontend.dtypes import onnx_to_dtype

    t = vi.type
    while t.WhichOneof("value") in ("sequence_type", "optional_type"):
        t = t.sequence_type.elem_type if t.HasField("sequence_type") else t.optional_type.elem_type
    return onnx_to_dtype(t.tensor_type.elem_type, where=f"output {vi.name!r}") if t.HasField("tensor_type") \
        else dtypes.float32


@onnx_op("Optional", 15, 28)
def optional(ctx: NodeContext) -> OptionalValue:
    return OptionalValue(ctx.value(0))


@onnx_op("OptionalHasElement", 15, 18, 28)
def optional_has_element(ctx: NodeContext) -> UOp:
    v = ctx.value(0)
    has = v.has_element if isinstance(v, OptionalValue) else v is not None
    return weight(np.array(has))


@onnx_op("OptionalGetElement", 15, 18, 28)
def optional_get_element(ctx: NodeContext) -> Value:
    v = ctx.value(0)
    if isinstance(v, OptionalValue):
        if not v.has_element:
            raise Unsupported("the optional holds no element (known at compile time)")
        return v.value
    if v is None:
        raise Unsupported("input 0 is required")
    return v
