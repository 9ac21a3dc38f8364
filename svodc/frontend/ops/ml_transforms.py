"""ai.onnx.ml feature transformers: Scaler, Normalizer, OneHotEncoder, Imputer, FeatureVectorizer,
CategoryMapper, and ZipMap (whose sequence of maps is a tensor plus keys: values.py ZipMapValue,
turned into a list of dicts by svodrt at the edge)."""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.label_encoder import _chain, _table
from svodc.frontend.ops.ml_common import ML, c
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.values import EdgeStrings, ZipMapValue
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

_F32 = dtypes.float32


def _per_column(x: UOp, values: list[float] | list[int], what: str) -> UOp:
    """A row of per-feature values for x [..., F] (one value stands for every feature)."""
    a = np.asarray(values, dtype=x.dtype.np).reshape(-1)
    if a.size not in (1, x.shape[-1]):
        raise Unsupported(f"{what} has {a.size} values for {x.shape[-1]} features")
    return T.reshape(weight(a), (1,) * (x.ndim - 1) + (a.size,))


@onnx_op("Scaler", 1, domain=ML)
def scaler(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    x = x if x.dtype in (_F32, dtypes.float64) else x.cast(_F32)
    y = T.alu(Ops.SUB, x, _per_column(x, ctx.attr("offset") or [0.0], "offset"))
    return T.alu(Ops.MUL, y, _per_column(x, ctx.attr("scale") or [1.0], "scale")).cast(_F32)


@onnx_op("Normalizer", 1, domain=ML)
def normalizer(ctx: NodeContext) -> UOp:
    """Each row divided by its MAX, L1 or L2 norm (at least 1e-30, so a zero row stays zero)."""
    x = ctx.input(0)
    x = x if x.dtype in (_F32, dtypes.float64) else x.cast(_F32)
    rows = x if x.ndim == 2 else T.reshape(x, (1, x.shape[0]))
    norm = ctx.attr("norm", "MAX")
    if norm == "MAX":
        d = T.reduce(rows, Ops.MAX, [1])
    elif norm == "L1":
        d = T.reduce(T.alu(Ops.ABS, rows), Ops.ADD, [1])
    elif norm == "L2":
        d = T.alu(Ops.SQRT, T.reduce(T.alu(Ops.MUL, rows, rows), Ops.ADD, [1]))
    else:
        raise Unsupported(f"norm={norm!r} is not MAX, L1 or L2")
    y = T.alu(Ops.DIV, rows, T.alu(Ops.MAX, d, c(d, 1e-30)))
    return T.reshape(y, x.shape).cast(_F32)


@onnx_op("OneHotEncoder", 1, domain=ML, strings=True)
def one_hot_encoder(ctx: NodeContext) -> UOp:
    """[..., categories] float: 1 where the element is that category. onnxruntime fails a run on an
    element that is no category when zeros=0; compiled code cannot fail, so such a row is all zeros --
    unless x is a string or integer input that svodrt sees: then svodrt refuses the call first (a
    "check" of the string program, format 1.8)."""
    x = ctx.input(0)
    check = int(ctx.attr("zeros", 1)) == 0 and x.op is Ops.INPUT
    if x.dtype is dtypes.string:
        names = list(ctx.attr("cats_strings") or [])
        cats = ctx.vocabulary.ids(np.asarray(list(ctx.raw_attr("cats_strings") or []), dtype=object))
        table = UOp(Ops.WEIGHT, dtypes.string, (), ConstData(cats))
    else:
        ints = names = ctx.ints("cats_int64s") or []
        table = weight(np.asarray(ints, dtype=x.dtype.np if x.dtype.is_int else np.float64))
        x = x if x.dtype.is_int else x.cast(dtypes.float64)
    n = table.shape[0]
    if not n:
        raise Unsupported("cats_int64s or cats_strings is required")
    if check and x.dtype in (dtypes.string, dtypes.int64, dtypes.int32):
        ctx.vocabulary.edge_checks.append(EdgeStrings(ctx.node.output[0], "OneHotEncoder", (x.arg.name,),
                                                      {"categories": names}, x.dtype, None))
    hit = T.alu(Ops.CMPEQ, T.reshape(x, (*x.shape, 1)), T.reshape(table, (1,) * x.ndim + (n,)))
    return T.alu(Ops.WHERE, hit, T.const(1.0, _F32, ()), T.const(0.0, _F32, ()))


@onnx_op("Imputer", 1, domain=ML)
def imputer(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if x.dtype.is_float:
        values, replaced = ctx.attr("imputed_value_floats"), float(ctx.attr("replaced_value_float", 0.0))
    else:
        values, replaced = ctx.ints("imputed_value_int64s"), int(ctx.attr("replaced_value_int64", 0))
    if not values:
        raise Unsupported(f"imputed_value_{'floats' if x.dtype.is_float else 'int64s'} is required")
    missing = T.alu(Ops.CMPNE, x, x) if replaced != replaced else T.alu(Ops.CMPEQ, x, c(x, replaced))
    return T.alu(Ops.WHERE, missing, T.broadcast_to(_per_column(x, values, "imputed values"), x.shape), x)


@onnx_op("FeatureVectorizer", 1, domain=ML)
def feature_vectorizer(ctx: NodeContext) -> UOp:
    """The inputs' columns side by side, each cut or zero-padded to its inputdimensions entry."""
    dims = ctx.ints("inputdimensions") or []
    parts = []
    for i, d in enumerate(dims):
        x = ctx.input(i)
        x = T.reshape(x, (x.shape[0], 1)) if x.ndim == 1 else x
        if x.ndim != 2:
            raise Unsupported(f"input {i} must have rank 1 or 2, got {list(x.shape)}")
        x = x.cast(_F32)
        w = x.shape[1]
        parts.append(T.shrink(x, [(0, x.shape[0]), (0, d)]) if d < w else T.pad(x, [(0, 0), (0, d - w)]))
    if not parts:
        raise Unsupported("inputdimensions is required")
    return T.concat(parts, 1)


@onnx_op("CategoryMapper", 1, domain=ML, strings=True)
def category_mapper(ctx: NodeContext) -> UOp:
    """strings -> int64 and int64 -> strings through the pairs (cats_strings[i], cats_int64s[i])."""
    x = ctx.input(0)
    ids = ctx.vocabulary.ids(np.asarray(list(ctx.raw_attr("cats_strings") or []), dtype=object)).astype(np.int64)
    ints = np.asarray(ctx.ints("cats_int64s") or [], np.int64)
    if len(ids) != len(ints):
        raise Unsupported(f"{len(ids)} cats_strings but {len(ints)} cats_int64s")
    if x.dtype is dtypes.string:
        return _table(x, ids, ints, int(ctx.attr("default_int64", -1)), dtypes.int64)
    if x.dtype is not dtypes.int64:
        raise Unsupported(f"the input must be string or int64, got {x.dtype.name}")
    default = int(ctx.vocabulary.intern(ctx.raw_attr("default_string", b"_Unused"), "attribute 'default_string'"))
    if len(ints) and int(ints.max()) - int(ints.min()) < max(256, 4 * len(ints)):
        return _table(x, ints, ids.astype(np.int32), default, dtypes.string)
    return _chain(x, ints, ids.astype(np.int32), default, dtypes.string)


@onnx_op("ZipMap", 1, domain=ML)
def zip_map(ctx: NodeContext) -> ZipMapValue:
    x = ctx.input(0)
    if x.ndim != 2 or x.dtype is not _F32:
        raise Unsupported(f"X must be a float [N, C] tensor, got {x.dtype.name}{list(x.shape)}")
    if ctx.has_attr("classlabels_strings") and ctx.attr("classlabels_strings"):
        keys: tuple[int | str, ...] = tuple(ctx.attr("classlabels_strings"))
    else:
        keys = tuple(ctx.ints("classlabels_int64s") or [])
    if len(keys) != x.shape[1]:
        raise Unsupported(f"{len(keys)} class labels for {x.shape[1]} columns")
    return ZipMapValue(x, keys)
