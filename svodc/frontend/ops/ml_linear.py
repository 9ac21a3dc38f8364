"""ai.onnx.ml LinearClassifier/Regressor and SVMClassifier/Regressor, as onnxruntime computes them
(the onnx reference evaluator copies it, quirks included: an SVM's label comes from the one-vs-one
votes even when the scores are probabilities).

Everything known at compile time becomes matrices, so a prediction is matmuls and elementwise ops:
the kernel values K [N, vectors] (dot products, or squared distances for RBF, computed as a
broadcast-and-reduce so they are exact), the one-vs-one decision values K @ W + rho with W [vectors,
pairs] holding each pair's coefficients, the votes as (decision > 0) @ A + (decision <= 0) @ B.
Probabilities (prob_a/prob_b): libsvm's pairwise coupling, an iterative solver (onnxruntime: at most
max(100, k) sweeps, stopping when the error is under 0.005 / k), unrolled with a per-row "still
iterating" mask, so every row stops where onnxruntime stops it -- within COUPLING_SWEEPS sweeps. Each
unrolled sweep costs ~13 kernels (over a second of compile time), and rows converge in a few sweeps
(a search over pairwise probabilities found none needing more than 6; docs/architecture.md "Classic
ML"); a row not converged after COUPLING_SWEEPS keeps that sweep's probabilities, where onnxruntime
would go on.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.ml_common import (
    ML,
    argmax,
    as_float_rows,
    c,
    class_labels,
    label_of,
    logistic,
    post_transform,
    post_transform_name,
)
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

COUPLING_SWEEPS = 20


def _floats(ctx: NodeContext, name: str) -> np.ndarray:
    return np.asarray(ctx.attr(name) or [], np.float64).reshape(-1)


def _const(x: UOp, a: np.ndarray) -> UOp:
    return weight(np.asarray(a, dtype=x.dtype.np))


def _affine(x: UOp, coefficients: np.ndarray, intercepts: np.ndarray, rows: int) -> UOp:
    """x @ coefficients.reshape(rows, F).T + intercepts: [N, rows]."""
    f = x.shape[1]
    if coefficients.size != rows * f:
        raise Unsupported(f"{coefficients.size} coefficients for {rows} outputs of {f} features")
    y = T.matmul(x, _const(x, coefficients.reshape(rows, f).T))
    if intercepts.size:
        if intercepts.size not in (1, rows):
            raise Unsupported(f"{intercepts.size} intercepts for {rows} outputs")
        y = T.alu(Ops.ADD, y, T.reshape(_const(x, intercepts), (1, intercepts.size)))
    return y


def _pair(s: UOp, transform: str) -> UOp:
    """One score for two classes: [-s, s], then the post transform (onnxruntime's 'binary' scores)."""
    if transform == "PROBIT":
        raise Unsupported("post_transform=PROBIT with one score for two classes is not supported")
    return post_transform(T.concat([T.alu(Ops.NEG, s), s], 1), transform)


@onnx_op("LinearRegressor", 1, domain=ML)
def linear_regressor(ctx: NodeContext) -> UOp:
    x = as_float_rows(ctx.input(0))
    y = _affine(x, _floats(ctx, "coefficients"), _floats(ctx, "intercepts"), int(ctx.attr("targets", 1)))
    return post_transform(y, post_transform_name(ctx)).cast(dtypes.float32)


@onnx_op("LinearClassifier", 1, domain=ML, strings=True)
def linear_classifier(ctx: NodeContext) -> list[UOp]:
    x = as_float_rows(ctx.input(0))
    labels = class_labels(ctx, "classlabels_ints")
    coefficients = _floats(ctx, "coefficients")
    rows = coefficients.size // x.shape[1]
    scores = _affine(x, coefficients, _floats(ctx, "intercepts"), rows)
    transform = post_transform_name(ctx)
    if rows == 1 and len(labels) == 2:
        scores = _pair(scores, transform)
    elif rows == len(labels):
        scores = post_transform(scores, transform)
    else:
        raise Unsupported(f"{rows} coefficient rows for {len(labels)} classes")
    return [label_of(labels, argmax(scores)), scores.cast(dtypes.float32)]


def _kernel(ctx: NodeContext, x: UOp, vectors: np.ndarray) -> UOp:
    """K [N, V]: the kernel of each row with each support vector."""
    kind = ctx.attr("kernel_type", "LINEAR")
    gamma, coef0, degree = (list(ctx.attr("kernel_params") or []) + [0.0, 0.0, 0.0])[:3]
    n, f = x.shape
    if vectors.size % f:
        raise Unsupported(f"{vectors.size} support vector values do not divide into rows of {f} features")
    sv = vectors.reshape(-1, f)
    if kind == "RBF":
        diff = T.alu(Ops.SUB, T.reshape(x, (n, 1, f)), T.reshape(_const(x, sv), (1, len(sv), f)))
        d2 = T.reduce(T.alu(Ops.MUL, diff, diff), Ops.ADD, [2], keepdims=False)
        return T.alu(Ops.EXP, T.alu(Ops.MUL, d2, c(d2, -gamma)))
    dot = T.matmul(x, _const(x, sv.T))
    if kind == "LINEAR":
        return dot
    s = T.alu(Ops.ADD, T.alu(Ops.MUL, dot, c(dot, gamma)), c(dot, coef0))
    if kind == "SIGMOID":
        return T.alu(Ops.TANH, s)
    if kind == "POLY":
        if int(degree) != degree or degree < 0:
            raise Unsupported(f"POLY kernel degree {degree} is not a non-negative integer")
        out = c(s, 1.0)
        for _ in range(int(degree)):
            out = T.alu(Ops.MUL, out, s)
        return out
    raise Unsupported(f"kernel_type={kind!r} is not LINEAR, POLY, RBF or SIGMOID")


@onnx_op("SVMRegressor", 1, domain=ML)
def svm_regressor(ctx: NodeContext) -> UOp:
    x = as_float_rows(ctx.input(0))
    coefficients, rho = _floats(ctx, "coefficients"), _floats(ctx, "rho")
    vectors = _floats(ctx, "support_vectors")
    if int(ctx.attr("n_supports", 0)) > 0:
        s = T.matmul(_kernel(ctx, x, vectors), _const(x, coefficients.reshape(-1, 1)))
    else:
        s = T.matmul(x, _const(x, coefficients.reshape(-1, 1)))
    s = T.alu(Ops.ADD, s, c(s, float(rho[0]) if rho.size else 0.0))
    if ctx.attr("one_class", 0):
        s = T.alu(Ops.WHERE, T.alu(Ops.CMPLT, c(s, 0.0), s), c(s, 1.0), c(s, -1.0))
    return post_transform(s, post_transform_name(ctx)).cast(dtypes.float32)


def _ovo(k: int) -> list[tuple[int, int]]:
    return [(i, j) for i in range(k) for j in range(i + 1, k)]


def _coupling(decisions: UOp, k: int, prob_a: np.ndarray, prob_b: np.ndarray) -> UOp:
    """libsvm's multiclass_probability for every row: [N, pairs] decision values -> [N, k]."""
    n = decisions.shape[0]

    def col(x: UOp, j: int) -> UOp:
        return T.shrink(x, [(0, n), (j, j + 1)])

    r = [[None] * k for _ in range(k)]
    for e, (i, j) in enumerate(_ovo(k)):
        d = col(decisions, e)
        p = T.alu(Ops.SUB, c(d, 1.0), logistic(T.alu(Ops.ADD, T.alu(Ops.MUL, d, c(d, prob_a[e])), c(d, prob_b[e]))))
        p = T.alu(Ops.MIN, T.alu(Ops.MAX, p, c(p, 1e-7)), c(p, 1 - 1e-7))
        r[i][j], r[j][i] = p, T.alu(Ops.SUB, c(p, 1.0), p)
    zero = T.const(0.0, decisions.dtype, (n, 1))
    q = [[zero] * k for _ in range(k)]
    for t in range(k):
        for j in range(k):
            if j != t:
                q[t][t] = T.alu(Ops.ADD, q[t][t], T.alu(Ops.MUL, r[j][t], r[j][t]))
                q[t][j] = T.alu(Ops.NEG, T.alu(Ops.MUL, r[j][t], r[t][j]))
    p = [c(zero, 1.0 / k)] * k
    active = T.const(True, dtypes.bool, (n, 1))
    for _ in range(min(COUPLING_SWEEPS, max(100, k))):
        qp = [_sum([T.alu(Ops.MUL, q[t][j], p[j]) for j in range(k)]) for t in range(k)]
        pqp = _sum([T.alu(Ops.MUL, p[t], qp[t]) for t in range(k)])
        err = _fold(Ops.MAX, [T.alu(Ops.ABS, T.alu(Ops.SUB, qp[t], pqp)) for t in range(k)])
        active = T.alu(Ops.AND, active, T.alu(Ops.NOT, T.alu(Ops.CMPLT, err, c(err, 0.005 / k))))
        new = list(p)
        for t in range(k):
            diff = T.alu(Ops.DIV, T.alu(Ops.SUB, pqp, qp[t]), q[t][t])
            new[t] = T.alu(Ops.ADD, new[t], diff)
            one_diff = T.alu(Ops.ADD, c(diff, 1.0), diff)
            pqp = T.alu(Ops.DIV, T.alu(Ops.ADD, pqp, T.alu(Ops.MUL, diff, T.alu(
                Ops.ADD, T.alu(Ops.MUL, diff, q[t][t]), T.alu(Ops.MUL, qp[t], c(diff, 2.0))))),
                T.alu(Ops.MUL, one_diff, one_diff))
            new = [T.alu(Ops.DIV, v, one_diff) for v in new]
            qp = [T.alu(Ops.DIV, T.alu(Ops.ADD, qp[j], T.alu(Ops.MUL, diff, q[t][j])), one_diff) for j in range(k)]
        p = [T.alu(Ops.WHERE, active, a, b) for a, b in zip(new, p, strict=True)]
    return T.concat(p, 1)


def _fold(op: Ops, xs: list[UOp]) -> UOp:
    out = xs[0]
    for x in xs[1:]:
        out = T.alu(op, out, x)
    return out


def _sum(xs: list[UOp]) -> UOp:
    return _fold(Ops.ADD, xs)


@onnx_op("SVMClassifier", 1, domain=ML, strings=True)
def svm_classifier(ctx: NodeContext) -> list[UOp]:
    x = as_float_rows(ctx.input(0))
    labels = class_labels(ctx, "classlabels_ints")
    k = len(labels)
    coefficients, rho = _floats(ctx, "coefficients"), _floats(ctx, "rho")
    per_class = ctx.ints("vectors_per_class") or []
    transform = post_transform_name(ctx)
    if sum(per_class) == 0:  # liblinear: one row of coefficients per class, rho[0] for all
        scores = _affine(x, coefficients, rho[:1], k)
        return [label_of(labels, argmax(scores)), post_transform(scores, transform).cast(dtypes.float32)]
    v = sum(per_class)
    if len(per_class) != k or coefficients.size != (k - 1) * v:
        raise Unsupported(f"vectors_per_class {per_class} and {coefficients.size} coefficients do not fit {k} classes")
    coefs = coefficients.reshape(k - 1, v)
    start = np.concatenate([[0], np.cumsum(per_class)])
    pairs = _ovo(k)
    w = np.zeros((v, len(pairs)))
    votes_pos, votes_neg = np.zeros((len(pairs), k)), np.zeros((len(pairs), k))
    for e, (i, j) in enumerate(pairs):
        w[start[i]:start[i + 1], e] = coefs[j - 1, start[i]:start[i + 1]]
        w[start[j]:start[j + 1], e] = coefs[i, start[j]:start[j + 1]]
        votes_pos[e, i] = votes_neg[e, j] = 1
    if rho.size != len(pairs):
        raise Unsupported(f"{rho.size} rho values for {len(pairs)} class pairs")
    decisions = T.alu(Ops.ADD, T.matmul(_kernel(ctx, x, _floats(ctx, "support_vectors")), _const(x, w)),
                      T.reshape(_const(x, rho), (1, len(pairs))))
    won = T.alu(Ops.CMPLT, c(decisions, 0.0), decisions).cast(x.dtype)
    votes = T.alu(Ops.ADD, T.matmul(won, _const(x, votes_pos)),
                  T.matmul(T.alu(Ops.SUB, c(won, 1.0), won), _const(x, votes_neg)))
    label = label_of(labels, argmax(votes))
    prob_a, prob_b = _floats(ctx, "prob_a"), _floats(ctx, "prob_b")
    if prob_a.size:
        if prob_a.size != len(pairs) or prob_b.size != len(pairs):
            raise Unsupported(f"prob_a and prob_b need {len(pairs)} values each")
        return [label, post_transform(_coupling(decisions, k, prob_a, prob_b), transform).cast(dtypes.float32)]
    if len(pairs) == 1:
        return [label, _pair(decisions, transform).cast(dtypes.float32)]
    return [label, post_transform(decisions, transform).cast(dtypes.float32)]
