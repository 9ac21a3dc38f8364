"""StringNormalizer, StringConcat, RegexFullMatch, StringSplit: string work, which native code never
does (docs/architecture.md "Weights and dtypes at the edges").

On strings known at compile time (initializers, constants, --input-value) the op runs here, at
import, and its string results are interned: a constant. On run-time strings (graph inputs and the
results of other string ops) it is a step of the string program that svodrt runs in Python before
native code (format 1.8; an EdgeStrings value): a result that code reads becomes a code input svodrt
fills, interned like a string input. A result whose shape depends on the strings has a bounded dim
where it can (StringNormalizer with stopwords: 1..C elements; StringSplit's substrings with maxsplit:
width 1..maxsplit + 1); otherwise (StringSplit without maxsplit) only a graph output takes it, and
svodrt returns it. Both paths compute with svodrt_strings.edge_value, so folding and run time agree.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported, is_constant
from svodc.frontend.re2 import python_pattern
from svodc.frontend.registry import onnx_op
from svodc.frontend.strings import edge_input
from svodc.frontend.values import EdgeStrings, describe
from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp
from svodrt_strings import edge_value

Source = str | list[str] | None  # a run-time value's name, a constant string as [s], or None: a constant input


def _strings(ctx: NodeContext, i: int) -> np.ndarray:
    """Constant string input i as an object array of str."""
    ids = ctx.const_input(i)
    vocab = ctx.vocabulary.strings
    out = np.empty(ids.shape, dtype=object)
    out.reshape(-1)[:] = [vocab[int(k)] for k in ids.reshape(-1)]
    return out


def _source(ctx: NodeContext, i: int) -> tuple[Source, tuple[int, ...]]:
    """String input i as the string program reads it, and its shape."""
    v = ctx.value(i)
    if isinstance(v, EdgeStrings):
        if v.shape is None or v.dtype is not dtypes.string:
            raise Unsupported(f"input {i} is {describe(v)}")
        edge_input(ctx.vocabulary, v)  # a later step reads it: svodrt keeps it as a code input
        return v.name, v.shape
    x = ctx.input(i)
    if x.dtype is not dtypes.string:
        raise Unsupported(f"input {i} must be a string tensor, got {x.dtype.name}")
    if is_constant(x):
        return None, x.shape
    if x.op is not Ops.INPUT:
        raise Unsupported(f"input {i} is computed from run-time strings by a {x.op.name} (the string program svodrt "
                          "runs reads graph inputs, constants and other string ops' results only)")
    return x.arg.name, x.shape


def _step(ctx: NodeContext, op: str, attrs: dict, dtype: DType, shape: object, result: int = 0,
          n_inputs: int = 1, bound: tuple[int, int] | None = None) -> UOp | EdgeStrings:
    """The op's result: folded when its inputs are constants, else a step of svodrt's string program.
    shape: a function of the input shapes, giving None when the strings decide it; bound: (axis, hi)
    when the strings decide that axis only, in 1..hi (a bounded dim; the shape has hi there)."""
    sources, shapes = zip(*[_source(ctx, i) for i in range(n_inputs)], strict=True)
    if all(s is None for s in sources):
        out = edge_value(op, [_strings(ctx, i) for i in range(n_inputs)], attrs)
        return ctx.vocabulary.constant(out, f"node {ctx.name!r}") if dtype is dtypes.string else \
            UOp(Ops.WEIGHT, dtype, (), ConstData(out))
    steps = list(sources)
    for i, s in enumerate(sources):
        if s is None:  # StringConcat with one run-time operand: the other must be one string
            c = _strings(ctx, i)
            if c.size != 1 or np.broadcast_shapes(*shapes) != shapes[1 - i]:
                raise Unsupported(f"input {i} is a constant of shape {list(c.shape)}: with a run-time other input, "
                                  "only one string that broadcasts to its shape is supported")
            steps[i] = [c.reshape(-1)[0]]
    name, bounded = ctx.node.output[result], ()
    if bound is not None and bound[1] >= 1:
        bounded = ((bound[0], f"{name}:{bound[0]}", 1, bound[1]),)
    return EdgeStrings(name, op, tuple(steps), attrs, dtype, shape(*shapes) if bounded or bound is None else None,
                       bounded)


@onnx_op("StringNormalizer", 10, strings=True)
def string_normalizer(ctx: NodeContext) -> UOp | EdgeStrings:
    shape = _source(ctx, 0)[1]
    if len(shape) not in (1, 2) or (len(shape) == 2 and shape[0] != 1):
        raise Unsupported(f"X must be [C] or [1, C], got {list(shape)}")
    case = ctx.attr("case_change_action", "NONE")
    if case not in ("NONE", "LOWER", "UPPER"):
        raise Unsupported(f"case_change_action={case!r} is not NONE, LOWER or UPPER")
    attrs = {"case": case, "case_sensitive": bool(ctx.attr("is_case_sensitive", 0)),
             "stopwords": list(ctx.attr("stopwords") or [])}
    # stopwords are dropped: how many elements remain (1..C: none left gives [""]) depends on the strings
    return _step(ctx, "StringNormalizer", attrs, dtypes.string, lambda s: s,
                 bound=(len(shape) - 1, shape[-1]) if attrs["stopwords"] else None)


@onnx_op("StringConcat", 20, strings=True)
def string_concat(ctx: NodeContext) -> UOp | EdgeStrings:
    return _step(ctx, "StringConcat", {}, dtypes.string, lambda a, b: tuple(np.broadcast_shapes(a, b)), n_inputs=2)


@onnx_op("RegexFullMatch", 20, strings=True)
def regex_full_match(ctx: NodeContext) -> UOp | EdgeStrings:
    """RE2 syntax, run by Python's re as frontend/re2.py rewrites it (or refuses it)."""
    return _step(ctx, "RegexFullMatch", {"pattern": python_pattern(ctx.attr("pattern", ""))}, dtypes.bool,
                 lambda s: s)


@onnx_op("StringSplit", 20, strings=True)
def string_split(ctx: NodeContext) -> list[UOp | EdgeStrings]:
    """[Y, Z]: Y = X's substrings in a new last axis padded with "" to the longest, Z = their counts. No
    (or an empty) delimiter splits at runs of whitespace. On run-time strings Y's width depends on them:
    with maxsplit it is a bounded dim 1..maxsplit + 1 (svodrt sets it per call; 0, all strings empty, is
    refused then), without it Y is only a graph output."""
    maxsplit = ctx.attr("maxsplit")
    if maxsplit is not None and maxsplit < 0:
        raise Unsupported(f"maxsplit={maxsplit} is negative")
    attrs = {"delimiter": ctx.attr("delimiter") or "", "maxsplit": -1 if maxsplit is None else int(maxsplit)}
    width = (len(_source(ctx, 0)[1]), attrs["maxsplit"] + 1) if maxsplit is not None else (0, 0)
    return [_step(ctx, "StringSplit", {**attrs, "result": 0}, dtypes.string, lambda s: (*s, width[1]), bound=width),
            _step(ctx, "StringSplit", {**attrs, "result": 1}, dtypes.int64, lambda s: s, result=1)]
