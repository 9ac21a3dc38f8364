"""The symbolic simplifier: bounds (vmin/vmax) and the rules that simplify integer and boolean
expressions -- symbolic shapes and loop indices alike.

Index expressions are normalized as sums of terms: sum(coef_i * term_i) + const, terms ordered by
structural hash (deterministic across processes). On that form, division and modulo by a constant
split off the terms whose coefficient the divisor divides, and the bounds of what is left decide the
rest: (a*c + b) // c == a when 0 <= b < c. Linearizing a delinearized index folds back:
(x//a)*a + x%a == x and (x//a % b)*a + x%a == x % (a*b).
"""

from __future__ import annotations

from typing import Any

from svodc.ir.alu import fold_scalar
from svodc.ir.dtypes import DType, dtypes, max_value, min_value
from svodc.ir.ops import ALU, Ops, VarArg
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.uop import UOp

INT_LIKE = tuple(d for d in dtypes.all() if d.is_int or d.kind == "bool")


# ------------------------------------------------------------------------------------- bounds
def compute_bounds(n: UOp) -> tuple[Any, Any]:
    dt = n.dtype
    if dt.kind == "ptr" or dt is dtypes.void:
        return (0, 0)
    full = (min_value(dt), max_value(dt))
    op = n.op
    if op is Ops.CONST:
        return (n.arg, n.arg)
    if op is Ops.RANGE:
        return (0, max(n.src[0].vmax - 1, 0))
    if op is Ops.DEFINE_VAR:
        assert isinstance(n.arg, VarArg)
        return (n.arg.lo, n.arg.hi)
    if dt.is_float or op not in ALU:
        return full
    b = [s.bounds for s in n.src]
    lo, hi = _alu_bounds(op, n, b)
    if lo is None or lo < full[0] or hi > full[1]:
        return full
    return (lo, hi)


def _alu_bounds(op: Ops, n: UOp, b: list[tuple[Any, Any]]) -> tuple[Any, Any]:
    if op is Ops.ADD:
        return (b[0][0] + b[1][0], b[0][1] + b[1][1])
    if op is Ops.SUB:
        return (b[0][0] - b[1][1], b[0][1] - b[1][0])
    if op is Ops.NEG:
        return (-b[0][1], -b[0][0])
    if op is Ops.MUL:
        ps = [x * y for x in b[0] for y in b[1]]
        return (min(ps), max(ps))
    if op in (Ops.IDIV, Ops.MOD) and n.src[1].op is Ops.CONST and n.src[1].arg > 0:
        c = n.src[1].arg
        if op is Ops.IDIV:
            return (b[0][0] // c, b[0][1] // c)
        if b[0][0] >= 0 and b[0][1] < c:
            return b[0]
        return (0, c - 1)
    if op is Ops.MAX:
        return (max(b[0][0], b[1][0]), max(b[0][1], b[1][1]))
    if op is Ops.MIN:
        return (min(b[0][0], b[1][0]), min(b[0][1], b[1][1]))
    if op is Ops.CMPLT:
        return (1, 1) if b[0][1] < b[1][0] else (0, 0) if b[0][0] >= b[1][1] else (0, 1)
    if op in (Ops.CMPEQ, Ops.CMPNE):
        same = b[0][0] == b[0][1] == b[1][0] == b[1][1]
        disjoint = b[0][1] < b[1][0] or b[1][1] < b[0][0]
        eq = (1, 1) if same else (0, 0) if disjoint else (0, 1)
        return eq if op is Ops.CMPEQ else (1 - eq[1], 1 - eq[0])
    if n.dtype.kind == "bool":
        if op is Ops.NOT:
            return (1 - b[0][1], 1 - b[0][0])
        if op is Ops.AND:
            return (min(b[0][0], b[1][0]), min(b[0][1], b[1][1]))
        if op is Ops.OR:
            return (max(b[0][0], b[1][0]), max(b[0][1], b[1][1]))
    if op is Ops.WHERE:
        c = b[0]
        if c == (1, 1):
            return b[1]
        if c == (0, 0):
            return b[2]
        return (min(b[1][0], b[2][0]), max(b[1][1], b[2][1]))
    if op is Ops.CAST and not n.src[0].dtype.is_float:
        return b[0]  # compute_bounds widens to the full range if it does not fit the target
    return (None, None)


# ------------------------------------------------------------------------------------- sums of terms
def _sum_terms(n: UOp) -> tuple[dict[UOp, int], int]:
    """n as sum(coef * term) + const, flattening ADD, SUB, NEG and MUL by a constant."""
    coefs: dict[UOp, int] = {}
    const = 0
    stack: list[tuple[UOp, int]] = [(n, 1)]
    while stack:
        x, k = stack.pop()
        if x.op is Ops.CONST:
            const += k * x.arg
        elif x.op is Ops.ADD:
            stack.extend(((x.src[0], k), (x.src[1], k)))
        elif x.op is Ops.SUB:
            stack.extend(((x.src[0], k), (x.src[1], -k)))
        elif x.op is Ops.NEG:
            stack.append((x.src[0], -k))
        elif x.op is Ops.MUL and x.src[1].op is Ops.CONST:
            stack.append((x.src[0], k * x.src[1].arg))
        elif x.op is Ops.MUL and x.src[0].op is Ops.CONST:
            stack.append((x.src[1], k * x.src[0].arg))
        else:
            coefs[x] = coefs.get(x, 0) + k
    return {t: c for t, c in coefs.items() if c != 0}, const


def _build_sum(dt: DType, coefs: dict[UOp, int], const: int) -> UOp:
    terms = sorted(coefs.items(), key=lambda tc: tc[0].structural_hash)
    out: UOp | None = None
    for t, c in terms:
        term = t if c == 1 else UOp(Ops.MUL, dt, (t, UOp.const(dt, c)))
        out = term if out is None else UOp(Ops.ADD, dt, (out, term))
    if out is None:
        return UOp.const(dt, const)
    return out if const == 0 else UOp(Ops.ADD, dt, (out, UOp.const(dt, const)))


def _merge_divmod_pairs(coefs: dict[UOp, int]) -> bool:
    """(x//a)*a*k + (x%a)*k -> x*k, (x//a % b)*a*k + (x%a)*k -> (x % (a*b))*k and
    ((x % m)//a)*a*k + (x%a)*k -> (x % m)*k (a divides m). True if merged."""
    for t2, k in list(coefs.items()):
        if t2.op is not Ops.MOD or t2.src[1].op is not Ops.CONST:
            continue
        x, a = t2.src[0], t2.src[1].arg
        whole = UOp(Ops.IDIV, x.dtype, (x, t2.src[1]))
        if coefs.get(whole) == k * a:
            del coefs[whole], coefs[t2]
            coefs[x] = coefs.get(x, 0) + k
            return True
        for t1, k1 in list(coefs.items()):
            if (t1.op is Ops.MOD and t1.src[0] is whole and t1.src[1].op is Ops.CONST and k1 == k * a):
                del coefs[t1], coefs[t2]
                merged = UOp(Ops.MOD, x.dtype, (x, UOp.const(x.dtype, a * t1.src[1].arg)))
                coefs[merged] = coefs.get(merged, 0) + k
                return True
            # (x % m)//a * a*k + (x%a)*k -> (x % m)*k when a divides m ((x % m) % a is x % a then)
            inner = t1.src[0] if t1.op is Ops.IDIV else None
            if (inner is not None and t1.src[1] is t2.src[1] and k1 == k * a and inner.op is Ops.MOD
                    and inner.src[0] is x and inner.src[1].op is Ops.CONST and inner.src[1].arg % a == 0):
                del coefs[t1], coefs[t2]
                coefs[inner] = coefs.get(inner, 0) + k
                return True
    return False


def normalize_sum(n: UOp) -> UOp | None:
    coefs, const = _sum_terms(n)
    while _merge_divmod_pairs(coefs):
        coefs = {t: c for t, c in coefs.items() if c != 0}
    out = _build_sum(n.dtype, coefs, const)
    return None if out is n else out


def simplify_idiv(x: UOp, c: UOp) -> UOp | None:
    d = c.arg
    if d <= 0:
        return None
    if d == 1:
        return x
    if x.vmin >= 0 and x.vmax < d:
        return x.const_like(0)
    if x.op is Ops.IDIV and x.src[1].op is Ops.CONST and x.src[1].arg > 0:
        return UOp(Ops.IDIV, x.dtype, (x.src[0], x.const_like(x.src[1].arg * d)))
    coefs, const = _sum_terms(x)
    quot = {t: k // d for t, k in coefs.items() if k % d == 0}
    rest = {t: k for t, k in coefs.items() if k % d != 0}
    qk, rk = divmod(const, d)
    if not quot and qk == 0:
        return None
    rest_expr = _build_sum(x.dtype, rest, rk)
    q = _build_sum(x.dtype, quot, qk)
    if rest_expr.vmin >= 0 and rest_expr.vmax < d:
        return q
    return UOp(Ops.ADD, x.dtype, (q, UOp(Ops.IDIV, x.dtype, (rest_expr, c))))


def simplify_mod(x: UOp, c: UOp) -> UOp | None:
    d = c.arg
    if d <= 0:
        return None
    if d == 1:
        return x.const_like(0)
    if x.vmin >= 0 and x.vmax < d:
        return x
    if x.op is Ops.MOD and x.src[1].op is Ops.CONST and x.src[1].arg % d == 0:
        return UOp(Ops.MOD, x.dtype, (x.src[0], c))
    coefs, const = _sum_terms(x)
    rest = {t: k % d for t, k in coefs.items() if k % d != 0}
    if len(rest) == len(coefs) and 0 <= const < d and all(rest[t] == coefs[t] for t in rest):
        return None
    return UOp(Ops.MOD, x.dtype, (_build_sum(x.dtype, rest, const % d), c))


# ------------------------------------------------------------------------------------- rules
def _fold_consts(n: UOp) -> UOp | None:
    if n.op in (Ops.CAST, Ops.BITCAST) or not all(s.op is Ops.CONST for s in n.src):
        return None
    try:
        v = fold_scalar(n.op, n.dtype, [s.arg for s in n.src], [s.dtype for s in n.src])
    except (NotImplementedError, OverflowError):
        return None
    return UOp.const(n.dtype, v)


def _fold_cast(x: UOp, n: UOp) -> UOp | None:
    try:
        return UOp.const(n.dtype, fold_scalar(Ops.CAST, n.dtype, [x.arg], [x.dtype]))
    except (NotImplementedError, OverflowError):
        return None


def _known_by_bounds(n: UOp) -> UOp | None:
    if n.op is Ops.CONST or n.dtype.is_float or n.dtype.kind == "ptr":
        return None
    lo, hi = n.bounds
    return UOp.const(n.dtype, lo) if lo == hi else None


def _index_sum(n: UOp) -> UOp | None:
    return normalize_sum(n) if n.dtype is dtypes.index else None


idx = UPat.var("x", dtypes.index)
cidx = UPat.cvar("c", dtypes.index)
ints = UPat.var("x", INT_LIKE)

pm_symbolic = PatternMatcher([
    # constant folding (every dtype: numpy gives the IR's exact semantics)
    (UPat(ALU - {Ops.CAST, Ops.BITCAST}, name="n"), _fold_consts),
    (UPat(Ops.CAST, src=(UPat.cvar("x"),), name="n"), _fold_cast),
    # integers whose bounds pin them to one value
    (UPat(ALU, INT_LIKE, name="n"), _known_by_bounds),
    # index division and modulo
    (UPat(Ops.IDIV, dtypes.index, src=(idx, cidx)), simplify_idiv),
    (UPat(Ops.MOD, dtypes.index, src=(idx, cidx)), simplify_mod),
    # sums of terms, canonical order
    (UPat((Ops.ADD, Ops.SUB, Ops.NEG), dtypes.index, name="n"), _index_sum),
    (UPat(Ops.MUL, dtypes.index, src=(UPat((Ops.ADD, Ops.SUB, Ops.MUL)), cidx), name="n"),
     lambda n, c: _index_sum(n)),
    # identities on integers (floats keep IEEE semantics: x+0 is not x for x = -0.0)
    (UPat(Ops.MUL, INT_LIKE, src=(ints, UPat.const(1))), lambda x: x),
    (UPat(Ops.MUL, INT_LIKE, src=(ints, UPat.const(0))), lambda x: x.const_like(0)),
    (UPat(Ops.ADD, INT_LIKE, src=(ints, UPat.const(0))), lambda x: x),
    # min/max decided by bounds (clamps of indices that are in range)
    (UPat(Ops.MAX, INT_LIKE, src=(UPat.var("x"), UPat.var("y"))),
     lambda x, y: x if x.vmin >= y.vmax else (y if y.vmin >= x.vmax else None)),
    (UPat(Ops.MIN, INT_LIKE, src=(UPat.var("x"), UPat.var("y"))),
     lambda x, y: x if x.vmax <= y.vmin else (y if y.vmax <= x.vmin else None)),
    # boolean logic
    (UPat(Ops.AND, dtypes.bool, src=(UPat.var("x"), UPat.const(True))), lambda x: x),
    (UPat(Ops.AND, dtypes.bool, src=(UPat.var("x"), UPat.const(False))), lambda x: x.const_like(False)),
    (UPat(Ops.OR, dtypes.bool, src=(UPat.var("x"), UPat.const(False))), lambda x: x),
    (UPat(Ops.OR, dtypes.bool, src=(UPat.var("x"), UPat.const(True))), lambda x: x.const_like(True)),
    (UPat(Ops.AND, dtypes.bool, src=(UPat.var("x"), UPat.var("x"))), lambda x: x),
    (UPat(Ops.NOT, src=(UPat(Ops.NOT, src=(UPat.var("x"),)),)), lambda x: x),
    (UPat(Ops.WHERE, src=(UPat.const(True), UPat.var("a"), UPat.var("b"))), lambda a, b: a),
    (UPat(Ops.WHERE, src=(UPat.const(False), UPat.var("a"), UPat.var("b"))), lambda a, b: b),
    (UPat(Ops.WHERE, src=(UPat.var("c"), UPat.var("a"), UPat.var("a"))), lambda c, a: a),
    # casts of a value to its own type
    (UPat(Ops.CAST, name="n", src=(UPat.var("x"),)), lambda n, x: x if x.dtype == n.dtype else None),
], name="symbolic", memoize=True)


def simplify(n: UOp) -> UOp:
    from svodc.ir.rewrite import graph_rewrite

    return graph_rewrite(n, pm_symbolic)
