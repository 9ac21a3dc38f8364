"""ai.onnx.ml Binarizer and ArrayFeatureExtractor, and TfIdfVectorizer (trees: trees.py; the other
ai.onnx.ml predictors and transformers: ml_linear.py, ml_transforms.py)."""

from __future__ import annotations

import math

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ConstData, Ops
from svodc.ir.uop import UOp

ML = "ai.onnx.ml"


@onnx_op("Binarizer", 1, domain=ML)
def binarizer(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    above = T.alu(Ops.CMPLT, T.scalar_like(x, ctx.attr("threshold", 0.0)), x)
    return T.alu(Ops.WHERE, above, T.scalar_like(x, 1), T.scalar_like(x, 0))


@onnx_op("ArrayFeatureExtractor", 1, domain=ML)
def array_feature_extractor(ctx: NodeContext) -> UOp:
    """x[..., indices] with run-time indices, flattened into the last axis (a 1-D x gives [1, k]):
    a compare-and-sum over the last axis (exact; an index out of range picks nothing: 0)."""
    x, idx = ctx.input(0), ctx.input(1)
    k = math.prod(idx.shape)
    n = x.shape[-1]
    lead = x.shape[:-1] if x.ndim > 1 else (1,)
    xs = T.reshape(x, (*lead, 1, n))
    cols = UOp(Ops.WEIGHT, dtypes.int64, (), ConstData(np.arange(n, dtype=np.int64)))
    cols = T.reshape(cols, (1,) * len(lead) + (1, n))
    want = T.reshape(idx.cast(dtypes.int64), (1,) * len(lead) + (k, 1))
    hit = T.alu(Ops.CMPEQ, cols, want)
    picked = T.alu(Ops.WHERE, hit, T.expand(xs, (*lead, k, n)), T.const(0, x.dtype, ()))
    return T.reduce(picked, Ops.ADD, [len(lead) + 1], keepdims=False)


def _pool_ngrams(ctx: NodeContext) -> list[tuple[tuple[int, ...], int]]:
    """(n-gram, output index) for every pool n-gram whose length is in [min, max]."""
    pool = ctx.ints("pool_int64s")
    if pool is None and ctx.has_attr("pool_strings"):  # string tokens are ids: a pool string is its id
        pool = ctx.vocabulary.ids(np.asarray(list(ctx.raw_attr("pool_strings")), dtype=object)).tolist()
    if pool is None:
        raise Unsupported("pool_int64s or pool_strings is required")
    counts, indexes = ctx.ints("ngram_counts"), ctx.ints("ngram_indexes")
    lo, hi = int(ctx.attr("min_gram_length")), int(ctx.attr("max_gram_length"))
    out, ngram_id = [], 0
    for size, start in enumerate(counts, start=1):
        end = counts[size] if size < len(counts) else len(pool)
        for g in range(start, end, size):
            if lo <= size <= hi:
                out.append((tuple(pool[g:g + size]), indexes[ngram_id]))
            ngram_id += 1
    return out


@onnx_op("TfIdfVectorizer", 9, strings=True)
def tfidf_vectorizer(ctx: NodeContext) -> UOp:
    """Counts of the pool's n-grams in each row: an n-gram of n items with skip distance d (1 to
    max_skip_count+1; unigrams only with d = 1) matches at start s when x[s + k*d] == gram[k] for every
    k -- a comparison of shifted views of x, summed over s. Then TF, IDF or TFIDF weighting. String
    tokens compare as ids (frontend/strings.py), the pool's strings interned."""
    x = ctx.input(0)
    pool = "pool_strings" if ctx.has_attr("pool_strings") else "pool_int64s"
    if not x.dtype.is_int or (x.dtype is dtypes.string) != (pool == "pool_strings"):
        raise Unsupported(f"TfIdfVectorizer of {x.dtype.name} with {pool} is not supported")
    rows = T.reshape(x, (1, x.shape[0]) if x.ndim == 1 else x.shape)
    b, c = rows.shape
    grams = _pool_ngrams(ctx)
    size = max(ctx.ints("ngram_indexes")) + 1
    counts: list[UOp | None] = [None] * size
    for gram, out_index in grams:
        n = len(gram)
        for d in range(1, (int(ctx.attr("max_skip_count", 0)) + 2) if n > 1 else 2):
            starts = c - (n - 1) * d
            if starts <= 0:
                continue
            match = T.const(True, dtypes.bool, (b, starts))
            for k, item in enumerate(gram):
                view = T.shrink(rows, [(0, b), (k * d, k * d + starts)])
                match = T.alu(Ops.AND, match, T.alu(Ops.CMPEQ, view, T.scalar_like(view, item)))
            found = T.reduce(match.cast(dtypes.float32), Ops.ADD, [1])
            counts[out_index] = found if counts[out_index] is None else T.alu(Ops.ADD, counts[out_index], found)
    tf = T.concat([cnt if cnt is not None else T.const(0.0, dtypes.float32, (b, 1)) for cnt in counts], 1)
    mode = ctx.attr("mode")
    weights = ctx.attr("weights")
    w = None if weights is None or len(weights) == 0 else \
        T.reshape(UOp(Ops.WEIGHT, dtypes.float32, (), ConstData(np.asarray(weights, np.float32))), (1, size))
    if mode == "TF":
        y = tf
    elif mode == "IDF":
        present = T.alu(Ops.CMPLT, T.scalar_like(tf, 0.0), tf)
        y = T.alu(Ops.WHERE, present, T.expand(w, tf.shape) if w is not None else T.scalar_like(tf, 1.0),
                  T.scalar_like(tf, 0.0))
    elif mode == "TFIDF":
        y = T.alu(Ops.MUL, tf, w) if w is not None else tf
    else:
        raise Unsupported(f"mode={mode!r} is not TF, IDF or TFIDF")
    return T.reshape(y, (size,)) if x.ndim == 1 else y
