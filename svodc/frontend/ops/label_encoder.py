"""ai.onnx.ml LabelEncoder (versions 1, 2 and 4): each element mapped through a key -> value table
known at compile time; elements that are no key get the default.

Keys are strings (the usual case: an sklearn-onnx encoder of categorical features), integers or
floats; values and the default are numbers or strings (a string output: ids, which svodrt decodes at
the edge; svodc/frontend/strings.py).

Two lookups, both exact:
- a table, for string keys (their ids, frontend/strings.py) and for integer keys that span a range at
  most a few times their count: out = table[j], j = x - lo inside [lo, hi], else the slot after the
  last, which holds the default. A string id outside the vocabulary, or of a string that is no key, so
  gets the default: the lookup reads nothing but whether an id is a key's id.
- a chain of compare-and-select, for float keys (and sparse integer keys): a NaN key matches every
  NaN input, as the schema says (NaN == NaN is false, so it is tested as x != x).
A key given twice maps to its last value (the schema's rule).
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.dtypes import UnsupportedDType, onnx_to_dtype
from svodc.frontend.ops.indexing import gather_axis
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

ML = "ai.onnx.ml"
_I64 = dtypes.int64
# An integer key range up to this many times the number of keys (or this many slots) is a table.
_DENSE_FACTOR, _DENSE_MIN = 4, 256


def _tensor_attr(ctx: NodeContext, name: str) -> tuple[DType, np.ndarray] | None:
    """A TENSOR attribute as (dtype, flat array); string tensors as their raw values (interned later)."""
    if not ctx.has_attr(name):
        return None
    t = ctx.raw_attr(name)
    try:
        dtype = onnx_to_dtype(t.data_type, where=f"attribute {name!r}")
    except UnsupportedDType as e:
        raise Unsupported(str(e)) from None
    from onnx import numpy_helper

    return dtype, np.asarray(numpy_helper.to_array(t)).reshape(-1)


def _keys(ctx: NodeContext) -> tuple[DType, np.ndarray]:
    """(key dtype, keys): string keys as their ids, numbers as arrays of the key dtype."""
    if ctx.version == 1:
        given = [("classes_strings", dtypes.string)]
    else:
        given = [(n, d) for n, d in (("keys_strings", dtypes.string), ("keys_int64s", dtypes.int64),
                                      ("keys_floats", dtypes.float32)) if ctx.has_attr(n)]
        tensor = _tensor_attr(ctx, "keys_tensor") if ctx.version >= 4 else None
        if tensor is not None:
            given.append(("keys_tensor", tensor[0]))
    if len(given) != 1:
        raise Unsupported(f"exactly one keys attribute must be set, got {[n for n, _ in given] or 'none'}")
    name, dtype = given[0]
    raw = _tensor_attr(ctx, name)[1] if name == "keys_tensor" else ctx.raw_attr(name)  # type: ignore[index]
    if dtype is dtypes.string:
        return dtype, ctx.vocabulary.ids(np.asarray(list(raw), dtype=object).reshape(-1), f"attribute {name!r}")
    return dtype, np.asarray(list(raw), dtype=dtype.np).reshape(-1)


def _values(ctx: NodeContext, n_keys: int) -> tuple[DType, np.ndarray, int | float]:
    """(value dtype, values, default)."""
    if ctx.version == 1:  # strings -> their index in classes_strings (int64 -> strings: label_encoder)
        return _I64, np.arange(n_keys, dtype=np.int64), int(ctx.attr("default_int64", -1))
    if ctx.has_attr("values_strings"):
        values = ctx.vocabulary.ids(np.asarray(list(ctx.raw_attr("values_strings")), dtype=object), "values_strings")
        return dtypes.string, values, _default_string(ctx)
    given = [n for n in ("values_int64s", "values_floats", "values_tensor") if ctx.has_attr(n)]
    if len(given) != 1:
        raise Unsupported(f"exactly one values attribute must be set, got {given or 'none'}")
    if given[0] == "values_int64s":
        return _I64, np.asarray(ctx.ints("values_int64s"), np.int64), int(ctx.attr("default_int64", -1))
    if given[0] == "values_floats":
        return dtypes.float32, np.asarray(ctx.attr("values_floats"), np.float32), float(ctx.attr("default_float", -0.0))
    dtype, values = _tensor_attr(ctx, "values_tensor")  # type: ignore[misc]
    default = _tensor_attr(ctx, "default_tensor")
    if dtype is dtypes.string:
        values = ctx.vocabulary.ids(values, "values_tensor")
        if default is None:
            return dtype, values, int(ctx.vocabulary.intern("_Unused"))
        return dtype, values, int(ctx.vocabulary.ids(default[1][:1], "default_tensor")[0])
    if default is None:  # the schema's defaults: -1 for integers, -0.0 for floats
        return dtype, values, (-0.0 if dtype.is_float else -1)
    if default[0] is not dtype or default[1].size != 1:
        raise Unsupported(f"default_tensor must be one {dtype.name}, got {default[0].name}{list(default[1].shape)}")
    return dtype, values, default[1][0].item()


@onnx_op("LabelEncoder", 1, 2, 4, domain=ML, strings=True)
def label_encoder(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    key_dtype, keys = _keys(ctx)
    if x.dtype is not key_dtype:
        if ctx.version == 1 and x.dtype is _I64:  # index -> classes_strings[index], else default_string
            return _table(x, np.arange(len(keys), dtype=np.int64), keys.astype(np.int32), _default_string(ctx),
                          dtypes.string)
        raise Unsupported(f"the keys are {key_dtype.name}, the input is {x.dtype.name}: they must agree")
    value_dtype, values, default = _values(ctx, len(keys))
    if len(values) != len(keys):
        raise Unsupported(f"{len(keys)} keys but {len(values)} values")
    if key_dtype is dtypes.string:
        return _table(x, keys.astype(np.int64), values, default, value_dtype)
    if not key_dtype.is_float and len(keys) and int(keys.max()) - int(keys.min()) < max(_DENSE_MIN,
                                                                                      _DENSE_FACTOR * len(keys)):
        return _table(x, keys.astype(np.int64), values, default, value_dtype)
    return _chain(x, keys, values, default, value_dtype)


def _default_string(ctx: NodeContext) -> int:
    return int(ctx.vocabulary.intern(ctx.raw_attr("default_string", b"_Unused"), "attribute 'default_string'"))


def _table(x: UOp, keys: np.ndarray, values: np.ndarray, default: int | float, dtype: DType) -> UOp:
    """out = table[x - lo] for lo <= x <= hi, else the default (the table's last slot)."""
    lo, hi = (int(keys.min()), int(keys.max())) if len(keys) else (0, -1)
    table = np.full(hi - lo + 2, default, dtype=dtype.np)
    table[keys - lo] = values.astype(dtype.np)  # numpy assigns in order: a repeated key keeps its last value
    i = x.cast(_I64)
    below, above = T.alu(Ops.CMPLT, i, T.scalar_like(i, lo)), T.alu(Ops.CMPLT, T.scalar_like(i, hi), i)
    inside = UOp(Ops.NOT, dtypes.bool, (T.alu(Ops.OR, below, above),))  # no lo - 1: lo may be INT64_MIN
    j = T.alu(Ops.WHERE, inside, T.alu(Ops.SUB, i, T.scalar_like(i, lo)), T.scalar_like(i, hi - lo + 1))
    return gather_axis(UOp(Ops.WEIGHT, dtype, (), ConstData(table)), j, 0)


def _chain(x: UOp, keys: np.ndarray, values: np.ndarray, default: int | float, dtype: DType) -> UOp:
    out = T.const(default, dtype, x.shape)
    for k, v in zip(keys.tolist(), values.tolist(), strict=True):  # later keys override earlier ones
        hit = T.alu(Ops.CMPNE, x, x) if k != k else T.alu(Ops.CMPEQ, x, T.scalar_like(x, k))
        out = T.alu(Ops.WHERE, hit, T.const(v, dtype, x.shape), out)
    return out
