"""What the ai.onnx.ml predictors share: post transforms, argmax, class labels and their attributes.

The post transforms follow onnxruntime (which the onnx reference evaluator copies): LOGISTIC is
1 / (1 + e^-x); SOFTMAX subtracts the row's max; SOFTMAX_ZERO leaves (near-)zero scores out of the
exponentials (they become x * e^-max) and gives 0.5 everywhere to a row whose sum is 0; PROBIT is
sqrt(2) * erfinv(2x - 1) with Winitzki's closed-form erfinv (a = 0.147), onnxruntime's formula --
an approximation (about 1e-3 relative), kept so the scores are the ones onnxruntime gives.
"""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.indexing import gather_axis, iota_along
from svodc.ir import tensor as T
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

ML = "ai.onnx.ml"
POST_TRANSFORMS = ("NONE", "LOGISTIC", "SOFTMAX", "SOFTMAX_ZERO", "PROBIT")


def c(x: UOp, v: float) -> UOp:
    return T.scalar_like(x, v)


def logistic(x: UOp) -> UOp:
    return T.alu(Ops.RECIP, T.alu(Ops.ADD, c(x, 1.0), T.alu(Ops.EXP, T.alu(Ops.NEG, x))))


def probit(x: UOp) -> UOp:
    t = T.alu(Ops.SUB, T.alu(Ops.MUL, x, c(x, 2.0)), c(x, 1.0))
    sign = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, t, c(t, 0.0)), c(t, -1.0), c(t, 1.0))
    w = T.alu(Ops.LOG, T.alu(Ops.MUL, T.alu(Ops.SUB, c(t, 1.0), t), T.alu(Ops.ADD, c(t, 1.0), t)))
    v = T.alu(Ops.ADD, c(w, 2.0 / (math.pi * 0.147)), T.alu(Ops.MUL, w, c(w, 0.5)))
    v2 = T.alu(Ops.MUL, w, c(w, 1.0 / 0.147))
    v3 = T.alu(Ops.SUB, T.alu(Ops.SQRT, T.alu(Ops.SUB, T.alu(Ops.MUL, v, v), v2)), v)
    return T.alu(Ops.MUL, T.alu(Ops.MUL, sign, T.alu(Ops.SQRT, v3)), c(v3, 1.41421356))


def softmax(x: UOp, zero: bool = False) -> UOp:
    """Softmax over the last axis; zero: SOFTMAX_ZERO."""
    top = T.reduce(x, Ops.MAX, [-1])
    e = T.alu(Ops.EXP, T.alu(Ops.SUB, x, top))
    if zero:
        nonzero = T.alu(Ops.CMPLT, c(x, 1e-7), T.alu(Ops.ABS, x))
        e = T.alu(Ops.WHERE, nonzero, e, T.alu(Ops.MUL, x, T.alu(Ops.EXP, T.alu(Ops.NEG, top))))
    total = T.reduce(e, Ops.ADD, [-1])
    out = T.alu(Ops.DIV, e, total)
    if zero:
        out = T.alu(Ops.WHERE, T.alu(Ops.CMPEQ, total, c(total, 0.0)), c(out, 0.5), out)
    return out


def post_transform(scores: UOp, name: str) -> UOp:
    if name == "NONE":
        return scores
    if name == "LOGISTIC":
        return logistic(scores)
    if name in ("SOFTMAX", "SOFTMAX_ZERO"):
        return softmax(scores, zero=name == "SOFTMAX_ZERO")
    if name == "PROBIT":
        return probit(scores)
    raise Unsupported(f"post_transform={name!r} is not one of {', '.join(POST_TRANSFORMS)}")


def post_transform_name(ctx: NodeContext) -> str:
    """The attribute as a name: a string in the classic ops, an int (index in POST_TRANSFORMS) in TreeEnsemble."""
    v = ctx.attr("post_transform", "NONE")
    if isinstance(v, int):
        if not 0 <= v < len(POST_TRANSFORMS):
            raise Unsupported(f"post_transform={v} is not in [0, {len(POST_TRANSFORMS) - 1}]")
        return POST_TRANSFORMS[v]
    return v


def argmax(x: UOp) -> UOp:
    """Index of the largest value along the last axis (int64; ties: the first)."""
    n = x.shape[-1]
    hit = T.alu(Ops.CMPEQ, x, T.reduce(x, Ops.MAX, [-1]))
    pos = T.alu(Ops.WHERE, hit, iota_along(n, x.ndim - 1, x.ndim), T.const(n, dtypes.int64))
    return T.reduce(pos, Ops.MIN, [-1], keepdims=False)


def class_labels(ctx: NodeContext, ints: str = "classlabels_int64s",
                 strings: str = "classlabels_strings") -> np.ndarray:
    """The class labels as int64, or as string ids (dtype int32) for string labels."""
    if ctx.has_attr(strings) and ctx.raw_attr(strings):
        return ctx.vocabulary.ids(np.asarray(list(ctx.raw_attr(strings)), dtype=object), f"attribute {strings!r}")
    labels = ctx.ints(ints)
    if not labels:
        raise Unsupported(f"{ints} or {strings} is required")
    return np.asarray(labels, dtype=np.int64)


def label_of(labels: np.ndarray, index: UOp) -> UOp:
    """labels[index] as a tensor: int64 labels, or a string tensor (ids) for string labels."""
    dtype: DType = dtypes.string if labels.dtype == np.int32 else dtypes.int64
    return gather_axis(UOp(Ops.WEIGHT, dtype, (), ConstData(labels)), index, 0)


def floats(ctx: NodeContext, name: str, default: list[float] | None = None) -> np.ndarray | None:
    """A float list attribute, or its `<name>_as_tensor` twin (double), as a float64 array."""
    v = ctx.attr(f"{name}_as_tensor")
    if v is None:
        v = ctx.attr(name)
    if v is None:
        return None if default is None else np.asarray(default, np.float64)
    return np.asarray(v, np.float64).reshape(-1)


def as_float_rows(x: UOp) -> UOp:
    """The input of a predictor as [N, F] float32 (float64 stays float64): a 1-D input is one row."""
    if x.ndim == 1:
        x = T.reshape(x, (1, x.shape[0]))
    if x.ndim != 2:
        raise Unsupported(f"X must be [N, F] or [F], got {list(x.shape)}")
    return x if x.dtype in (dtypes.float32, dtypes.float64) else x.cast(dtypes.float32)
