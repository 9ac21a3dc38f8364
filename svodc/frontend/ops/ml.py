"""ai.onnx.ml operators of the node test suite (Binarizer, ArrayFeatureExtractor, TreeEnsemble) and TfIdfVectorizer.

TreeEnsemble: the trees are known at compile time, so each leaf's "reached" flag is the AND of the
branch conditions on its path (computed for the whole batch), and each target sums (averages, takes
the min or max of) the weights of its reached leaves -- no run-time tree walk, no branches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

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


@dataclass
class _Leaf:
    index: int
    path: list[tuple[int, bool]]  # (node, branch taken) from the root


def _leaves(ctx: NodeContext, root: int) -> list[_Leaf]:
    true_ids, false_ids = ctx.ints("nodes_truenodeids"), ctx.ints("nodes_falsenodeids")
    true_leaf, false_leaf = ctx.ints("nodes_trueleafs"), ctx.ints("nodes_falseleafs")
    if true_leaf[root] and false_leaf[root] and true_ids[root] == false_ids[root]:  # a tree that is one leaf
        return [_Leaf(true_ids[root], [])]
    out: list[_Leaf] = []
    stack: list[tuple[int, list[tuple[int, bool]]]] = [(root, [])]
    while stack:
        node, path = stack.pop()
        if len(path) > len(true_ids):
            raise Unsupported("the trees have a cycle")
        for branch, ids, is_leaf in ((True, true_ids, true_leaf), (False, false_ids, false_leaf)):
            step = [*path, (node, branch)]
            if is_leaf[node]:
                out.append(_Leaf(ids[node], step))
            else:
                stack.append((ids[node], step))
    return out


@onnx_op("TreeEnsemble", 5, domain=ML)
def tree_ensemble(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if x.ndim != 2:
        raise Unsupported(f"X must be [N, F], got {list(x.shape)}")
    if ctx.attr("post_transform", 0) != 0:
        raise Unsupported("post_transform other than NONE is not supported")
    agg = ctx.attr("aggregate_function", 1)
    modes = [int(m) for m in np.asarray(ctx.attr("nodes_modes")).reshape(-1)]
    splits = ctx.attr("nodes_splits")
    splits = None if splits is None else np.asarray(splits).reshape(-1)
    features = ctx.ints("nodes_featureids")
    missing_true = ctx.ints("nodes_missing_value_tracks_true", [0] * len(modes))
    members = ctx.attr("membership_values")
    sets: dict[int, list[float]] = {}
    if members is not None:
        values = iter(np.asarray(members).reshape(-1).tolist())
        for node, m in enumerate(modes):
            if m == 6:
                s = []
                for v in values:
                    if math.isnan(v):
                        break
                    s.append(v)
                sets[node] = s
    weights = np.asarray(ctx.attr("leaf_weights")).reshape(-1)
    targets = ctx.ints("leaf_targetids")
    n_targets = int(ctx.attr("n_targets"))
    roots = ctx.ints("tree_roots")
    n = x.shape[0]

    conds: dict[int, UOp] = {}

    def cond(node: int) -> UOp:
        if node not in conds:
            col = T.reshape(T.shrink(x, [(0, n), (features[node], features[node] + 1)]), (n,))
            m = modes[node]
            if m == 6:
                hit = T.const(False, dtypes.bool, (n,))
                for v in sets.get(node, []):
                    hit = T.alu(Ops.OR, hit, T.alu(Ops.CMPEQ, col, T.scalar_like(col, v)))
            else:
                s = T.scalar_like(col, float(splits[node]))
                hit = {0: lambda: T.alu(Ops.OR, T.alu(Ops.CMPLT, col, s), T.alu(Ops.CMPEQ, col, s)),
                       1: lambda: T.alu(Ops.CMPLT, col, s),
                       2: lambda: T.alu(Ops.OR, T.alu(Ops.CMPLT, s, col), T.alu(Ops.CMPEQ, col, s)),
                       3: lambda: T.alu(Ops.CMPLT, s, col),
                       4: lambda: T.alu(Ops.CMPEQ, col, s),
                       5: lambda: T.alu(Ops.CMPNE, col, s)}[m]()
            if missing_true[node]:
                hit = T.alu(Ops.OR, hit, T.alu(Ops.CMPNE, col, col))
            conds[node] = hit
        return conds[node]

    init = {0: 0.0, 1: 0.0, 2: float(np.finfo(x.dtype.np).max), 3: float(np.finfo(x.dtype.np).min)}[agg]
    combine = {0: Ops.ADD, 1: Ops.ADD, 2: Ops.MIN, 3: Ops.MAX}[agg]
    columns = [T.const(init, x.dtype, (n,)) for _ in range(n_targets)]
    for root in roots:
        for leaf in _leaves(ctx, root):
            reached = T.const(True, dtypes.bool, (n,))
            for node, branch in leaf.path:
                c = cond(node)
                reached = T.alu(Ops.AND, reached, c if branch else T.alu(Ops.NOT, c))
            w = float(weights[leaf.index]) / (len(roots) if agg == 0 else 1)
            neutral = init if agg >= 2 else 0.0
            value = T.alu(Ops.WHERE, reached, T.const(w, x.dtype, (n,)), T.const(neutral, x.dtype, (n,)))
            t = targets[leaf.index]
            columns[t] = T.alu(combine, columns[t], value)
    return T.concat([T.reshape(c, (n, 1)) for c in columns], 1)


def _pool_ngrams(ctx: NodeContext) -> list[tuple[tuple[int, ...], int]]:
    """(n-gram, output index) for every pool n-gram whose length is in [min, max]."""
    pool = ctx.ints("pool_int64s")
    if pool is None:
        raise Unsupported("pool_strings (string input) is not supported")
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


@onnx_op("TfIdfVectorizer", 9)
def tfidf_vectorizer(ctx: NodeContext) -> UOp:
    """Counts of the pool's n-grams in each row: an n-gram of n items with skip distance d (1 to
    max_skip_count+1; unigrams only with d = 1) matches at start s when x[s + k*d] == gram[k] for every
    k -- a comparison of shifted views of x, summed over s. Then TF, IDF or TFIDF weighting."""
    x = ctx.input(0)
    if not x.dtype.is_int:
        raise Unsupported(f"TfIdfVectorizer of {x.dtype.name} is not supported")
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
