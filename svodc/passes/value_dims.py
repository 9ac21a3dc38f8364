"""Value dims (Ops.SIZED): sizes that run-time values decide, a Reshape's shape or NonZero's count.

The frontend computes such a tensor at its bound and wraps it in SIZED(x, value, ...), one int64 scalar
per axis it sizes (passes/dynamic.py ValueDim, a computed dim of format 1.7 whose value comes from data,
not from a map of input dims). Before scheduling, `strip` drops the wrappers (x is what the kernels
compute) and gives x's axes the value dims in the bounded-dim analysis, so consumers loop to the
run-time size and the runtime cuts outputs by it. Each value is realized by a kernel of its own (a
scalar), to which `write_dims` adds the stores into the `dims` array: the value clamped into its
range, and the status words (svodrt/abi.py) when it is outside (or -1: the deciding values are
invalid), unless an earlier kernel already reported one. Those kernels move as early as their inputs
allow (`hoist`); a kernel that reads a value dim must come after the one that writes it
(`check_order`): otherwise the model is refused, not run wrong.
"""

from __future__ import annotations

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops, VarArg
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.uop import UOp, toposort
from svodc.passes.dynamic import DynamicAxes, DynamicShapeError, ValueDim

PREFIX = "\0value dim "  # the pseudo output name under which a value dim's scalar is planned


def register(roots: list[UOp], dyn: DynamicAxes | None) -> bool:
    """Record every SIZED node's value dims in dyn (before any analysis); whether there is one."""
    found = False
    for n in toposort(roots):
        if n.op is Ops.SIZED:
            found = True
            if dyn is not None:
                for d in n.arg.dims:
                    if d is not None:
                        dyn.add_value_dim(ValueDim(*d))
    return found


def strip(sink: UOp, dyn: DynamicAxes) -> tuple[UOp, list[tuple[ValueDim, UOp]]]:
    """The sink without SIZED nodes (their x carrying the value dims), and each value dim with its scalar."""
    values: dict[str, tuple[ValueDim, UOp]] = {}
    overrides: dict[UOp, tuple] = {}
    for n in toposort([sink]):
        if n.op is not Ops.SIZED:
            continue
        axes = dyn.axes(n)
        named = [d for d in n.arg.dims if d is not None]
        for d, v in zip(named, n.src[1:], strict=True):
            values.setdefault(d[0], (dyn.dims[d[0]], v))
        overrides[n.src[0]] = axes

    def unwrap(n: UOp) -> UOp:
        return n.src[0]

    out = graph_rewrite(sink, PatternMatcher([(UPat(Ops.SIZED, name="n"), unwrap)], name="strip-sized"))
    for x, axes in overrides.items():
        dyn._memo[x] = axes  # x's axes are the value dims where SIZED named them
    return out, list(values.values())


def write_dims(ast: UOp, dim: ValueDim, dyn: DynamicAxes, status_slot: int) -> UOp:
    """The scalar kernel `ast` (SINK(STORE(p0, 0, v))) also writing v into dim's slot, clamped, with the
    status words when v is outside [lo, hi] and no earlier kernel reported a dim."""
    stores = [s for s in ast.src if s.op is Ops.STORE]
    if len(stores) != 1 or stores[0].src[0].op is not Ops.PARAM:
        raise DynamicShapeError(f"value dim {dim.name!r}: its value's kernel is not a scalar store")
    idx = dtypes.index
    v = stores[0].src[2].cast(idx)
    clamped = v.maximum(UOp.const(idx, dim.lo)).minimum(UOp.const(idx, dim.hi))

    def word(slot: int, name: str, hi: int = 0) -> UOp:
        return UOp(Ops.DEFINE_VAR, idx, (), VarArg(name, 0, hi, slot))

    old, old_value = word(status_slot, "status", 1 << 40), word(status_slot + 1, "status value", 1 << 62)
    report = clamped.ne(v).logical_and(old.eq(UOp.const(idx, 0)))
    zero = UOp.const(idx, 0)
    new = (UOp(Ops.STORE, dtypes.void, (word(dyn.slots[dim.name], dim.name), zero, clamped)),
           UOp(Ops.STORE, dtypes.void, (word(status_slot, "status"), zero,
                                         report.where(UOp.const(idx, dyn.slots[dim.name] + 1), old))),
           UOp(Ops.STORE, dtypes.void, (word(status_slot + 1, "status value"), zero, report.where(v, old_value))))
    return UOp(Ops.SINK, ast.dtype, ast.src + new, ast.arg)


def hoist(kernels: list, writers: dict[str, int]) -> dict[str, int]:
    """Run the values' kernels, and the kernels they depend on, first (values rarely depend on the
    tensors they size), so those tensors' own kernels can loop to the run-time size; reorders `kernels`
    in place and returns the writers' new positions."""
    producer = {k.params[0].id: i for i, k in enumerate(kernels) if k.params}
    needed: set[int] = set()
    stack = list(writers.values())
    while stack:
        i = stack.pop()
        if i not in needed:
            needed.add(i)
            reads = [*kernels[i].params[1:], *(b for term in kernels[i].guard for b, _ in term)]  # guards: flags
            stack.extend(producer[b.id] for b in reads if b.id in producer and producer[b.id] < i)
    order = sorted(needed) + [i for i in range(len(kernels)) if i not in needed]
    kernels[:] = [kernels[i] for i in order]
    return {name: order.index(i) for name, i in writers.items()}


def check_order(kernels: list, writers: dict[str, int], dyn: DynamicAxes) -> None:
    """Every kernel reading a value dim comes after the kernel writing it."""
    slots = {dyn.slots[name]: name for name in writers}
    for i, k in enumerate(kernels):
        for n in toposort([k.ast]):
            if n.op is Ops.DEFINE_VAR and n.arg.slot in slots and i < writers[slots[n.arg.slot]]:
                name = slots[n.arg.slot]
                raise DynamicShapeError(f"kernel {k.name} reads dim {name!r} before its value is computed: a "
                                        "tensor sized by a run-time value feeds work scheduled earlier; fix the "
                                        "values that decide it with --input-value")
