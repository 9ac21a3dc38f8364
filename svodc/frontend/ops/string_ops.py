"""StringNormalizer, StringConcat, RegexFullMatch, StringSplit: string work, which native code never
does (docs/architecture.md "Weights and dtypes at the edges").

On strings known at compile time (initializers, constants, --input-value) the op runs here, at
import, on the vocabulary's strings, and its string results are interned: a constant. On a run-time
string input, StringNormalizer is a pure function of the input's strings with a data-dependent
shape: when its result is a graph output, svodrt computes it at the edge (EdgeStrings, format 1.6
`edge_outputs`, with the same function, svodrt.strings.normalize). Everything else on run-time
strings is refused with the reason.
"""

from __future__ import annotations

import re

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, is_constant
from svodc.frontend.registry import onnx_op
from svodc.frontend.values import EdgeStrings
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp
from svodrt.strings import normalize


def _runtime(ctx: NodeContext, what: str) -> Unsupported:
    return Unsupported(f"{what} of run-time strings is not supported: svod does no string work in compiled code "
                       "(fix the input with --input-value to fold it at compile time)")


def _strings(ctx: NodeContext, i: int) -> np.ndarray:
    """Constant string input i as an object array of str."""
    ids = ctx.const_input(i)
    vocab = ctx.vocabulary.strings
    out = np.empty(ids.shape, dtype=object)
    out.reshape(-1)[:] = [vocab[int(k)] for k in ids.reshape(-1)]
    return out


def _constant(ctx: NodeContext, strings: np.ndarray) -> UOp:
    return ctx.vocabulary.constant(strings, f"node {ctx.name!r}")


def _check_strings(ctx: NodeContext, *xs: UOp) -> None:
    for i, x in enumerate(xs):
        if x.dtype is not dtypes.string:
            raise Unsupported(f"input {i} must be a string tensor, got {x.dtype.name}")


@onnx_op("StringNormalizer", 10, strings=True)
def string_normalizer(ctx: NodeContext) -> UOp | EdgeStrings:
    x = ctx.input(0)
    _check_strings(ctx, x)
    if x.ndim not in (1, 2) or (x.ndim == 2 and x.shape[0] != 1):
        raise Unsupported(f"X must be [C] or [1, C], got {list(x.shape)}")
    case = ctx.attr("case_change_action", "NONE")
    if case not in ("NONE", "LOWER", "UPPER"):
        raise Unsupported(f"case_change_action={case!r} is not NONE, LOWER or UPPER")
    attrs = {"case": case, "case_sensitive": bool(ctx.attr("is_case_sensitive", 0)),
             "stopwords": list(ctx.attr("stopwords") or [])}
    if is_constant(x):
        return _constant(ctx, normalize(_strings(ctx, 0), **attrs))
    if x.op is Ops.INPUT:
        return EdgeStrings("StringNormalizer", x.arg.name, attrs)
    raise _runtime(ctx, "StringNormalizer (other than of a graph input, as a graph output)")


@onnx_op("StringConcat", 20, strings=True)
def string_concat(ctx: NodeContext) -> UOp:
    x, y = ctx.input(0), ctx.input(1)
    _check_strings(ctx, x, y)
    if not (is_constant(x) and is_constant(y)):
        raise _runtime(ctx, "StringConcat")
    a, b = np.broadcast_arrays(_strings(ctx, 0), _strings(ctx, 1))
    return _constant(ctx, np.frompyfunc(lambda p, q: p + q, 2, 1)(a, b))


@onnx_op("RegexFullMatch", 20, strings=True)
def regex_full_match(ctx: NodeContext) -> UOp:
    """Python's re stands in for RE2 (the onnx reference evaluator does the same)."""
    x = ctx.input(0)
    _check_strings(ctx, x)
    if not is_constant(x):
        raise _runtime(ctx, "RegexFullMatch")
    try:
        pattern = re.compile(ctx.attr("pattern", ""))
    except re.error as e:
        raise Unsupported(f"pattern {ctx.attr('pattern')!r} is not a valid regular expression: {e}") from None
    s = _strings(ctx, 0)
    hit = np.array([pattern.fullmatch(v) is not None for v in s.reshape(-1)], dtype=bool).reshape(s.shape)
    return UOp(Ops.WEIGHT, dtypes.bool, (), ConstData(hit))


@onnx_op("StringSplit", 20, strings=True)
def string_split(ctx: NodeContext) -> list[UOp]:
    """[Y, Z]: Y = X's substrings in a new last axis padded with "" to the longest, Z = their counts.
    No (or an empty) delimiter splits at runs of whitespace."""
    x = ctx.input(0)
    _check_strings(ctx, x)
    if not is_constant(x):
        raise _runtime(ctx, "StringSplit (its output shape depends on the strings)")
    delimiter = ctx.attr("delimiter") or None
    maxsplit = ctx.attr("maxsplit")
    s = _strings(ctx, 0)
    parts = [v.split(delimiter, -1 if maxsplit is None else int(maxsplit)) for v in s.reshape(-1)]
    width = max((len(p) for p in parts), default=0)
    y = np.empty((len(parts), width), dtype=object)
    for i, p in enumerate(parts):
        y[i] = p + [""] * (width - len(p))
    counts = np.array([len(p) for p in parts], dtype=np.int64).reshape(s.shape)
    return [_constant(ctx, y.reshape(*s.shape, width)), UOp(Ops.WEIGHT, dtypes.int64, (), ConstData(counts))]
