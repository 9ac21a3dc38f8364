"""Tree ensembles (ai.onnx.ml TreeEnsembleRegressor/Classifier v1 and v3, TreeEnsemble v5), compiled
as a branch-free walk over a node table (docs/architecture.md "Tree ensembles").

Every version's attributes become one Forest: nodes keyed by whatever the version names them by,
split nodes (feature, mode, threshold or member set, missing-goes-true) and leaves (list of (target,
weight)). The forest is laid out as flat tables of "slots", numbered so that the two children of a
split are adjacent (true child at `base`, false child at `base + 1`). A slot's `code` is
base * 2 + 1 for a split and self * 2 for a leaf, so one step for every (row, tree) at once is

    f = feature[i]; v = X[row, f]; go_true = v MODE threshold[i] (or NaN and missing-true[i])
    i = (code[i] >> 1) + ((code[i] & 1) and not go_true)

(leaves map to themselves: extra steps are no-ops). After as many steps as the deepest tree, each
(row, tree) holds its leaf, whose row of the dense leaf table [slots, targets] is gathered and
reduced over the trees (sum, average, min or max). A [N, trees] int32 state, three gathers per step
(the feature index rides in the code's low bits when both fit 31 bits): the IR's GATHER, so the
existing kernels run it; the code does not grow with the number of trees.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from svodc.frontend.context import NodeContext, Unsupported
from svodc.frontend.ops.indexing import gather_axis, gather_batched
from svodc.frontend.ops.ml_common import (
    ML,
    argmax,
    as_float_rows,
    c,
    class_labels,
    floats,
    label_of,
    post_transform,
    post_transform_name,
)
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER = range(7)  # TreeEnsemble's nodes_modes numbering
_MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
               "BRANCH_NEQ": NEQ}
SUM, AVERAGE, MIN, MAX = "SUM", "AVERAGE", "MIN", "MAX"


@dataclass
class Split:
    feature: int
    mode: int
    threshold: float
    true: object  # child node keys
    false: object
    missing_true: bool = False
    members: tuple[float, ...] = ()


@dataclass
class Forest:
    nodes: dict[object, Split | list[tuple[int, float]]] = field(default_factory=dict)  # leaves: [(target, w)]
    roots: list[object] = field(default_factory=list)


def _classic_forest(ctx: NodeContext, leaf_prefix: str) -> Forest:
    """TreeEnsembleRegressor/Classifier: nodes keyed (tree id, node id); leaf weights in the
    `{target,class}_*` lists."""
    tree_ids, node_ids = ctx.ints("nodes_treeids"), ctx.ints("nodes_nodeids")
    if not tree_ids or not node_ids or len(tree_ids) != len(node_ids):
        raise Unsupported("nodes_treeids and nodes_nodeids are required and must have the same length")
    n = len(node_ids)
    features = ctx.ints("nodes_featureids", [0] * n)
    modes = ctx.attr("nodes_modes") or []
    values = floats(ctx, "nodes_values", [0.0] * n)
    true_ids, false_ids = ctx.ints("nodes_truenodeids", [0] * n), ctx.ints("nodes_falsenodeids", [0] * n)
    missing = ctx.ints("nodes_missing_value_tracks_true") or [0] * n
    if not len(modes) == len(values) == len(true_ids) == len(false_ids) == len(features) == len(missing) == n:
        raise Unsupported("the nodes_* attributes must all have one entry per node")
    forest = Forest()
    children: set[tuple[int, int]] = set()
    for i in range(n):
        key = (tree_ids[i], node_ids[i])
        if modes[i] == "LEAF":
            forest.nodes[key] = []
            continue
        if modes[i] not in _MODE_NAMES:
            raise Unsupported(f"node {key}: nodes_modes {modes[i]!r} is not LEAF or BRANCH_*")
        t, f = (tree_ids[i], true_ids[i]), (tree_ids[i], false_ids[i])
        forest.nodes[key] = Split(features[i], _MODE_NAMES[modes[i]], float(values[i]), t, f, bool(missing[i]))
        children |= {t, f}
    forest.roots = [k for k in forest.nodes if k not in children]
    l_trees, l_nodes = ctx.ints(f"{leaf_prefix}_treeids") or [], ctx.ints(f"{leaf_prefix}_nodeids") or []
    l_ids = ctx.ints(f"{leaf_prefix}_ids") or []
    l_weights = floats(ctx, f"{leaf_prefix}_weights", [])
    if not len(l_trees) == len(l_nodes) == len(l_ids) == len(l_weights):
        raise Unsupported(f"the {leaf_prefix}_* attributes must all have one entry per leaf weight")
    for t, nd, target, w in zip(l_trees, l_nodes, l_ids, l_weights.tolist(), strict=True):
        leaf = forest.nodes.get((t, nd))
        if not isinstance(leaf, list):
            raise Unsupported(f"{leaf_prefix}_nodeids names node ({t}, {nd}), which is no leaf")
        leaf.append((target, w))
    return forest


def _v5_forest(ctx: NodeContext) -> Forest:
    """TreeEnsemble (v5): nodes keyed by index; a child is a leaf index when nodes_*leafs says so."""
    features = ctx.ints("nodes_featureids")
    n = len(features)
    modes = [int(m) for m in np.asarray(ctx.attr("nodes_modes")).reshape(-1)]
    splits = np.asarray(ctx.attr("nodes_splits"), np.float64).reshape(-1)
    true_ids, false_ids = ctx.ints("nodes_truenodeids"), ctx.ints("nodes_falsenodeids")
    true_leaf, false_leaf = ctx.ints("nodes_trueleafs"), ctx.ints("nodes_falseleafs")
    missing = ctx.ints("nodes_missing_value_tracks_true") or [0] * n
    members = iter(np.asarray(ctx.attr("membership_values", [])).reshape(-1).tolist())
    forest = Forest()
    for i in range(n):
        sets: tuple[float, ...] = ()
        if modes[i] == MEMBER:  # each member node's set, in node order, ends with a NaN
            s = []
            for v in members:
                if math.isnan(v):
                    break
                s.append(v)
            sets = tuple(s)
        elif not 0 <= modes[i] < MEMBER:
            raise Unsupported(f"node {i}: nodes_modes {modes[i]} is not in [0, 6]")
        t = ("leaf", true_ids[i]) if true_leaf[i] else true_ids[i]
        f = ("leaf", false_ids[i]) if false_leaf[i] else false_ids[i]
        forest.nodes[i] = Split(features[i], modes[i], float(splits[i]), t, f, bool(missing[i]), sets)
    weights = np.asarray(ctx.attr("leaf_weights"), np.float64).reshape(-1)
    for j, (target, w) in enumerate(zip(ctx.ints("leaf_targetids"), weights.tolist(), strict=True)):
        forest.nodes[("leaf", j)] = [(target, w)]
    forest.roots = ctx.ints("tree_roots")
    return forest


@dataclass
class Layout:
    feature: np.ndarray  # [slots] int32
    threshold: np.ndarray  # [slots] float64 (cast to the input's type)
    code: np.ndarray  # [slots] int32: base * 2 + 1 (split), self * 2 (leaf)
    mode: np.ndarray  # [slots] int8
    missing_true: np.ndarray  # [slots] bool
    members: np.ndarray  # [slots, K] float64, NaN-padded (K = 0 without BRANCH_MEMBER)
    leaves: list[tuple[int, list[tuple[int, float]]]]  # (slot, weights)
    roots: np.ndarray  # [trees] int32
    depth: int  # steps that bring every tree to a leaf


def layout(forest: Forest) -> Layout:
    """Slots in breadth-first order per tree; a split's two children are appended together."""
    keys: list[object] = []
    bases: dict[int, int] = {}  # split slot -> slot of its true child
    roots, depth = [], 0
    for root in forest.roots:
        roots.append(len(keys))
        keys.append(root)
        level = deque([(len(keys) - 1, 0)])
        while level:
            s, d = level.popleft()
            node = forest.nodes.get(keys[s])
            if node is None:
                raise Unsupported(f"a tree refers to node {keys[s]}, which is not defined")
            if isinstance(node, Split):
                if len(keys) > 4 * len(forest.nodes) + 2:
                    raise Unsupported("the trees share nodes or have a cycle")
                depth = max(depth, d + 1)
                bases[s] = len(keys)
                keys += [node.true, node.false]
                level += [(len(keys) - 2, d + 1), (len(keys) - 1, d + 1)]
    n = len(keys)
    if n >= 1 << 30:
        raise Unsupported(f"{n} tree nodes: too many for int32 node indices")
    nodes = [forest.nodes[k] for k in keys]
    k = max((len(s.members) for s in nodes if isinstance(s, Split)), default=0)
    out = Layout(np.zeros(n, np.int32), np.zeros(n), np.arange(n, dtype=np.int32) * 2, np.zeros(n, np.int8),
                 np.zeros(n, bool), np.full((n, k), np.nan), [], np.asarray(roots, np.int32), depth)
    for s, node in enumerate(nodes):
        if isinstance(node, Split):
            out.feature[s], out.threshold[s], out.mode[s] = node.feature, node.threshold, node.mode
            out.missing_true[s] = node.missing_true
            out.members[s, :len(node.members)] = node.members
            out.code[s] = bases[s] * 2 + 1
        else:
            out.leaves.append((s, node))
    return out


def _compare(v: UOp, t: UOp, mode: int) -> UOp:
    lt, eq = (lambda a, b: T.alu(Ops.CMPLT, a, b)), (lambda a, b: T.alu(Ops.CMPEQ, a, b))
    return {LEQ: lambda: T.alu(Ops.OR, lt(v, t), eq(v, t)), LT: lambda: lt(v, t),
            GTE: lambda: T.alu(Ops.OR, lt(t, v), eq(v, t)), GT: lambda: lt(t, v), EQ: lambda: eq(v, t),
            NEQ: lambda: T.alu(Ops.CMPNE, v, t)}[mode]()


def leaves_reached(x: UOp, lay: Layout) -> UOp:
    """[N, trees] int32: the leaf slot each row reaches in each tree."""
    n, trees = x.shape[0], len(lay.roots)
    idx = T.expand(T.reshape(weight(lay.roots), (1, trees)), (n, trees))
    split_modes = sorted({int(m) for m, code in zip(lay.mode, lay.code, strict=True) if code & 1})
    # One table gather fewer per step: the feature index rides in the code's low bits when it fits.
    fbits = max(int(lay.feature.max(initial=0)).bit_length(), 1)
    packed = fbits + int(lay.code.max(initial=0)).bit_length() <= 31
    code = weight((lay.code << fbits) | lay.feature if packed else lay.code)
    feature = None if packed else weight(lay.feature)
    threshold = weight(lay.threshold.astype(x.dtype.np))
    mode = weight(lay.mode) if len(split_modes) > 1 else None
    missing = weight(lay.missing_true) if lay.missing_true.any() else None
    members = weight(lay.members.astype(x.dtype.np)) if lay.members.shape[1] else None
    one = T.const(1, dtypes.int32, (n, trees))
    for _ in range(lay.depth):
        k = gather_axis(code, idx, 0)
        if packed:
            f = T.alu(Ops.AND, k, T.const((1 << fbits) - 1, dtypes.int32, ()))
            k = T.alu(Ops.SHR, k, T.const(fbits, dtypes.int32, ()))
        else:
            f = gather_axis(feature, idx, 0)
        v = gather_batched(x, f, 1, (trees,), ())
        t = gather_axis(threshold, idx, 0)
        go: UOp | None = None
        for m in split_modes:
            if m == MEMBER:
                hit = T.alu(Ops.CMPEQ, T.reshape(v, (n, trees, 1)), gather_axis(members, idx, 0))
                cond = T.alu(Ops.CMPLT, T.const(0, dtypes.int32, ()),
                             T.reduce(hit.cast(dtypes.int32), Ops.MAX, [2], keepdims=False))
            else:
                cond = _compare(v, t, m)
            if mode is not None:
                cond = T.alu(Ops.AND, cond, T.alu(Ops.CMPEQ, gather_axis(mode, idx, 0), T.const(m, dtypes.int8, ())))
            go = cond if go is None else T.alu(Ops.OR, go, cond)
        if missing is not None:
            go = T.alu(Ops.OR, go, T.alu(Ops.AND, T.alu(Ops.CMPNE, v, v), gather_axis(missing, idx, 0)))
        base = T.alu(Ops.SHR, k, one)
        step = T.alu(Ops.WHERE, go, T.const(0, dtypes.int32, (n, trees)), T.alu(Ops.AND, k, one))
        idx = T.alu(Ops.ADD, base, step)
    return idx


def aggregate(x: UOp, lay: Layout, n_targets: int, how: str) -> tuple[UOp, UOp]:
    """([N, n_targets] in x's float type: the leaves' weights per target, combined over the trees,
    [N, n_targets] bool: some reached leaf has a weight for the target). A target without one gets 0
    under MIN and MAX (onnxruntime's rule)."""
    big = float(np.finfo(x.dtype.np).max)
    neutral = {SUM: 0.0, AVERAGE: 0.0, MIN: big, MAX: -big}[how]
    table = np.full((len(lay.code), n_targets), neutral)
    scored = np.zeros((len(lay.code), n_targets), np.int8)
    for slot, weights in lay.leaves:
        for target, w in weights:
            if not 0 <= target < n_targets:
                raise Unsupported(f"a leaf weight is for target {target}, outside [0, {n_targets})")
            old = table[slot, target]
            table[slot, target] = {MIN: min, MAX: max}.get(how, lambda a, b: a + b)(old, w)
            scored[slot, target] = 1
    reached = leaves_reached(x, lay)
    picked = gather_axis(weight(table.astype(x.dtype.np)), reached, 0)  # [N, trees, targets]
    out = T.reduce(picked, {MIN: Ops.MIN, MAX: Ops.MAX}.get(how, Ops.ADD), [1], keepdims=False)
    if how == AVERAGE:
        out = T.alu(Ops.DIV, out, c(out, float(len(lay.roots))))
    has = T.alu(Ops.CMPLT, T.const(0, dtypes.int8, ()), T.reduce(gather_axis(weight(scored), reached, 0), Ops.MAX, [1],
                                                                 keepdims=False))
    if how in (MIN, MAX):
        out = T.alu(Ops.WHERE, has, out, c(out, 0.0))
    return out, has


def _with_base(scores: UOp, base: np.ndarray | None, has: UOp | None = None) -> UOp:
    """scores + base_values; with `has`, only where a leaf gave the target a score (onnxruntime's
    regressor leaves the others at 0; its classifier adds the base to every class)."""
    if base is None or not len(base):
        return scores
    if len(base) != scores.shape[1]:
        raise Unsupported(f"base_values has {len(base)} values for {scores.shape[1]} targets")
    out = T.alu(Ops.ADD, scores, T.reshape(weight(base.astype(scores.dtype.np)), (1, len(base))))
    return out if has is None else T.alu(Ops.WHERE, has, out, c(out, 0.0))


@onnx_op("TreeEnsembleRegressor", 1, 3, domain=ML)
def tree_ensemble_regressor(ctx: NodeContext) -> UOp:
    x = as_float_rows(ctx.input(0))
    how = ctx.attr("aggregate_function", SUM)
    if how not in (SUM, AVERAGE, MIN, MAX):
        raise Unsupported(f"aggregate_function={how!r} is not SUM, AVERAGE, MIN or MAX")
    scores, has = aggregate(x, layout(_classic_forest(ctx, "target")), int(ctx.attr("n_targets", 1)), how)
    scores = post_transform(_with_base(scores, floats(ctx, "base_values"), has), post_transform_name(ctx))
    return scores.cast(dtypes.float32)


@onnx_op("TreeEnsemble", 5, domain=ML)
def tree_ensemble(ctx: NodeContext) -> UOp:
    x = ctx.input(0)
    if x.ndim != 2 or not x.dtype.is_float:
        raise Unsupported(f"X must be a float [N, F] tensor, got {x.dtype.name}{list(x.shape)}")
    how = {0: AVERAGE, 1: SUM, 2: MIN, 3: MAX}.get(int(ctx.attr("aggregate_function", 1)))
    if how is None:
        raise Unsupported(f"aggregate_function={ctx.attr('aggregate_function')} is not in [0, 3]")
    scores, _ = aggregate(x if x.dtype in (dtypes.float32, dtypes.float64) else x.cast(dtypes.float32),
                          layout(_v5_forest(ctx)), int(ctx.attr("n_targets")), how)
    return post_transform(scores, post_transform_name(ctx)).cast(x.dtype)


@onnx_op("TreeEnsembleClassifier", 1, 3, domain=ML, strings=True)
def tree_ensemble_classifier(ctx: NodeContext) -> list[UOp]:
    """[label, scores], as onnxruntime computes them. Two classes with weights for only one of them
    (gradient boosting) is onnxruntime's "binary case": s = that class's score; the label is class 1
    when s > 0.5 if all weights are non-negative, else when s > 0. Weights on class 0 (sklearn-onnx):
    s includes base_values[0]; with non-negative weights the scores are [1 - s, s], else [-s, s]
    (LOGISTIC: [logistic(-s), logistic(s)]); LOGISTIC with non-negative weights gives [1 - logistic(s),
    logistic(s)]; SOFTMAX and SOFTMAX_ZERO change nothing. Weights on class 1: class 0 has no score
    and stays 0, base_values are not added, and the post transform applies to [0, s] as to any two
    scores (onnxruntime's tree_ensemble_aggregator writes both scores when class 1 has one)."""
    x = as_float_rows(ctx.input(0))
    labels = class_labels(ctx)
    n_classes = len(labels)
    scores, _ = aggregate(x, layout(_classic_forest(ctx, "class")), n_classes, SUM)
    base = floats(ctx, "base_values")
    transform = post_transform_name(ctx)
    present = set(ctx.ints("class_ids") or [])
    if n_classes == 2 and len(present) == 1:
        k = present.pop()
        if base is not None and len(base) > 1:  # (onnxruntime then drops the trees' score when k == 1)
            raise Unsupported("two classes, weights for one, and two base_values: onnxruntime's meaning is ambiguous")
        if transform == "PROBIT":
            raise Unsupported("post_transform=PROBIT with one score for two classes is not supported")
        s = T.reshape(T.shrink(scores, [(0, scores.shape[0]), (k, k + 1)]), (scores.shape[0], 1))
        positive_weights = bool((floats(ctx, "class_weights", []) >= 0).all())
        if k == 1:
            positive = T.alu(Ops.CMPLT, c(s, 0.5 if positive_weights else 0.0), s)
            pair = post_transform(T.concat([c(s, 0.0), s], 1), transform)
            return [label_of(labels, T.reshape(positive.cast(dtypes.int64), (s.shape[0],))), pair.cast(dtypes.float32)]
        if base is not None and len(base):
            s = T.alu(Ops.ADD, s, c(s, float(base[0])))
        if positive_weights:  # LOGISTIC applies to s; SOFTMAX* do nothing
            positive = T.alu(Ops.CMPLT, c(s, 0.5), s)
            v = post_transform(s, transform) if transform == "LOGISTIC" else s
            pair = T.concat([T.alu(Ops.SUB, c(v, 1.0), v), v], 1)
        else:
            positive = T.alu(Ops.CMPLT, c(s, 0.0), s)
            pair = T.concat([T.alu(Ops.NEG, s), s], 1)  # onnxruntime: only LOGISTIC transforms it
            pair = post_transform(pair, transform) if transform == "LOGISTIC" else pair
        index = T.reshape(positive.cast(dtypes.int64), (s.shape[0],))
        return [label_of(labels, index), pair.cast(dtypes.float32)]
    scores = _with_base(scores, base)
    return [label_of(labels, argmax(scores)), post_transform(scores, transform).cast(dtypes.float32)]
