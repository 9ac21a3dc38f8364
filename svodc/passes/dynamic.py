"""Bounded symbolic dims through the tensor graph: which axis of each tensor a run-time dim sizes.

The graph is built at the dims' upper bounds (frontend/dims.py) and memory is planned there; this
analysis finds, for every tensor, the axes whose size is a run-time dim times a constant (`SymAxis`).
Lowering then gives those axes' loops the run-time extent (a DEFINE_VAR the kernel reads from the
entry's `dims` argument), so a call at a small size runs only the iterations it needs, in the
upper-bound layout: element i of a dim axis sits where it sits at the bound.

A dim is an input dim (its value comes with the inputs) or a computed dim (format 1.7): an output
size of padding, a sliding window, a convolution, a slice from the front or a Resize by scales (a
positional gather) over a dim axis, `(value(src) * mul + add) // div + off` of another dim
(`ComputedDim`; chains fold into one map of an input dim where they can). The code computes them
(`dims_kernel`: the first kernel) into the `dims` array after the input dims, so later kernels, and
the runtime for the outputs' real shapes, read them like any dim.

That is exact for prefix-consistent ops: the value at index i < n along a dim axis depends only on
indices < n of that axis in the sources (elementwise, broadcasts, reshapes that keep the dim the
outermost axis of its group, permutes, movement on other axes, contractions and reductions over it,
whose loops run to the run-time size), and for windows, slices from the front and padding, whose output
index i reads source indices fixed by i and whose padding tests compare with the source's run-time
extent. Anything else on a dim axis -- slices relative to its end, gathering along it, a sum over it
scaled by a constant other than 1 / the bound's count (a mean: divided by the run-time count) -- is
refused with a DynamicShapeError naming the node, instead of computing a wrong value.
Not detected: a size read with Shape and folded into a value (x / Cast(Shape(x)[0])) is the upper
bound's; such models need the dim fixed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from svodc.errors import SvodcError
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import (
    ALU,
    MOVEMENT,
    ConvArg,
    Ops,
    PadArg,
    PermuteArg,
    ReduceArg,
    ShapeArg,
    SliceArg,
    VarArg,
    WindowArg,
)
from svodc.ir.provenance import Provenance
from svodc.ir.shapes import reshape_groups
from svodc.ir.uop import UOp, toposort

if TYPE_CHECKING:  # an annotation only: the passes import neither the frontend nor onnx
    from svodc.frontend.dims import DimSpec


class DynamicShapeError(SvodcError):
    """An op uses a bounded dim in a way that does not yet follow the run-time size."""


@dataclass(frozen=True)
class ComputedDim:
    """A dim the code computes: (value(src) * mul + add) // div + off, src another dim (0 <= add < div,
    mul and div >= 1: the map is non-decreasing, so lo and hi are the map of src's lo and hi)."""

    name: str
    lo: int
    hi: int
    src: str
    mul: int = 1
    add: int = 0
    div: int = 1
    off: int = 0

    def of(self, v: int) -> int:
        return (v * self.mul + self.add) // self.div + self.off


@dataclass(frozen=True)
class ValueDim:
    """A dim a run-time value decides (a Reshape's shape, NonZero's count: Ops.SIZED), in [lo, hi] (lo may
    be 0). The kernel that computes the value writes it into the `dims` array (clamped, with the status
    words for a value outside the range or invalid: passes/value_dims.py); the runtime cuts outputs by it."""

    name: str
    lo: int
    hi: int


@dataclass(frozen=True)
class SymAxis:
    """An axis of run-time size value(dim) * factor (its compile-time size is hi * factor)."""

    dim: str
    factor: int = 1


Axes = tuple[SymAxis | None, ...]


class DynamicAxes:
    """Memoized per node. `dims` in the order of the entry's `dims` array; `input_axes` from the frontend."""

    def __init__(self, dims: tuple[DimSpec, ...], input_axes: dict[str, dict[int, str]], prov: Provenance | None):
        self.dims: dict[str, DimSpec | ComputedDim | ValueDim] = {d.name: d for d in dims}  # input, then computed
        self.slots = {d.name: i for i, d in enumerate(dims)}
        self._computed: dict[tuple, str] = {}  # (src, mul, add, div, off) -> its dim's name
        self._inputs = input_axes
        self._prov = prov
        self._memo: dict[UOp, Axes] = {}
        self._sums: set[UOp] = set()  # REDUCE(ADD)s over a bounded dim: a constant divisor would be a mean
        self.means: dict[UOp, int] = {}  # sum over a bounded dim scaled by 1/count at the bound -> the sum's src index
        # Axes of two dims that meet (broadcasting needs equal sizes): (kept, other); checked by dims_kernel.
        self.equal: dict[tuple[SymAxis, SymAxis], None] = {}

    def __bool__(self) -> bool:
        return bool(self.dims)

    def var(self, dim: str) -> UOp:
        d = self.dims[dim]
        return UOp(Ops.DEFINE_VAR, dtypes.index, (), VarArg(d.name, d.lo, d.hi, self.slots[dim]))

    def extent(self, ax: SymAxis | None, size: int) -> UOp | int:
        """The run-time size of an axis of compile-time size `size` (an int when it is static)."""
        if ax is None:
            return size
        v = self.var(ax.dim)
        return v if ax.factor == 1 else v * ax.factor

    def extents(self, n: UOp) -> tuple[UOp | int, ...]:
        return tuple(self.extent(a, s) for a, s in zip(self.axes(n), n.shape, strict=True))

    def axes(self, n: UOp) -> Axes:
        if not self.dims:
            return (None,) * len(n.shape)
        hit = self._memo.get(n)
        if hit is None:
            for m in toposort([n]):
                if m not in self._memo:
                    self._memo[m] = self._rule(m)
            hit = self._memo[n]
        return hit

    # ------------------------------------------------------------------ rules
    def _where(self, n: UOp) -> str:
        names = sorted(self._prov.get(n)) if self._prov is not None else []
        return f"node {names[0]!r}" if names else f"a {n.op.name}"

    def _fail(self, n: UOp, what: str) -> DynamicShapeError:
        where = self._where(n)
        dims = sorted({self.root(a.dim) for s in n.src for a in self._memo.get(s, ()) if a is not None})
        flags = " ".join(f"--dim {d}=SIZE" for d in dims)
        return DynamicShapeError(f"{where} ({n.op.name}) {what}: not supported for a bounded dim yet; fix the dim "
                                 f"with {flags or '--dim NAME=SIZE'}")

    def _rule(self, n: UOp) -> Axes:
        op, arg = n.op, n.arg
        nd = len(n.shape)
        if op is Ops.INPUT:
            named = self._inputs.get(arg.name, {})
            return tuple(SymAxis(named[i]) if i in named else None for i in range(nd))
        if op in (Ops.WEIGHT, Ops.CONST, Ops.STEP_IN) or nd == 0:  # (a step loop's leaves are static)
            return (None,) * nd
        if op is Ops.SIZED:  # value dims where named, else what x has (a bounded input dim stays itself)
            for d in arg.dims:
                if d is not None:
                    self.add_value_dim(ValueDim(*d))
            return tuple(a if d is None else SymAxis(d[0]) for a, d in zip(self._memo[n.src[0]], arg.dims, strict=True))
        src = [self._memo[s] for s in n.src]
        if op in ALU:
            if op in (Ops.MUL, Ops.DIV) and any(s in self._sums for s in n.src) and any(is_constant(s) for s in n.src):
                self._mean(n)
            return self._merge(n, [(a, s.shape) for a, s in zip(src, n.src, strict=True)])
        a0 = src[0]
        if not any(a0) and not any(any(a) for a in src[1:]):
            return (None,) * nd
        if op is Ops.RESHAPE:
            return self._reshape(n, a0)
        if op is Ops.PERMUTE:
            assert isinstance(arg, PermuteArg)
            return tuple(a0[i] for i in arg.order)
        if op is Ops.EXPAND:
            assert isinstance(arg, ShapeArg)
            return a0
        if op is Ops.PAD:
            assert isinstance(arg, PadArg)
            return tuple(a if a is None or p == (0, 0) else self._sized(n, a, size, add=p[0] + p[1])
                         for a, p, size in zip(a0, arg.pads, n.shape, strict=True))
        if op is Ops.SLICE:
            assert isinstance(arg, SliceArg)
            return tuple(self._slice(n, a, st, sp, sz, size, arg.from_front) for a, st, sp, sz, size in
                         zip(a0, arg.starts, arg.steps, arg.shape, n.src[0].shape, strict=True))
        if op is Ops.WINDOW:
            assert isinstance(arg, WindowArg)
            out = list(a0)
            for a, k, s, d in zip(arg.axes, arg.kernel, arg.strides, arg.dilations, strict=True):
                if a0[a] is not None:
                    out[a] = self._sized(n, a0[a], n.shape[a], add=-(k - 1) * d - 1, div=s, off=1)
            return (*out, *(None,) * len(arg.kernel))
        if op is Ops.REDUCE:
            assert isinstance(arg, ReduceArg)
            if any(a0[i] is not None for i in arg.axes):  # the loop runs to the run-time size
                if arg.op is Ops.ADD:
                    self._sums.add(n)
                return tuple(None if i in arg.axes else a for i, a in enumerate(a0))
            return a0
        if op is Ops.CONV:
            assert isinstance(arg, ConvArg)
            self._untouched(n, a0, [1], "convolves over a bounded channel dim")
            if any(src[1]):
                raise self._fail(n, "has a weight sized by a bounded dim")
            spatial = [None if a is None else
                       self._sized(n, a, size, add=p0 + p1 - (k - 1) * d - 1, div=s, off=1)
                       for a, size, k, s, d, (p0, p1) in zip(a0[2:], n.shape[2:], n.src[1].shape[2:], arg.strides,
                                                             arg.dilations, arg.pads, strict=True)]
            return (a0[0], None, *spatial)
        if op is Ops.MATMUL:
            a, b = src  # a run-time K: the generic path reduces over it (pipeline.py)
            batch = self._merge(n, [(a[:-2], n.src[0].shape[:-2]), (b[:-2], n.src[1].shape[:-2])], n.shape[:-2])
            return (*batch, a[-2], b[-1])
        if op is Ops.GATHER:
            axis = arg.axis
            if arg.sized is None or any(src[1]):
                self._untouched(n, a0, [axis], "gathers along a bounded dim")
            x = tuple(None if i == axis else a for i, a in enumerate(a0))
            out = list(self._merge(n, [(x, n.src[0].shape), (src[1], n.src[1].shape)]))
            if arg.sized is not None and a0[axis] is not None:  # positions along out_axis, by a scale
                at, mul, div = arg.sized
                out[at] = self._sized(n, a0[axis], n.shape[at], mul=mul, div=div)
            return tuple(out)
        if op is Ops.SCATTER:
            axis = arg.axis
            for a in src:
                self._untouched(n, a, [axis], "scatters along a bounded dim")
            return self._merge(n, [(a0, n.src[0].shape), (src[2], n.src[2].shape)])
        raise self._fail(n, "is an op the bounded-dim analysis does not know")

    def _slice(self, n: UOp, a: SymAxis | None, start: int, step: int, size: int, src: int, from_front: bool
               ) -> SymAxis | None:
        """A slice of a dim axis: only an ONNX Slice's own (`from_front`: its start and step count from the
        front, the frontend refuses others), not positions the bound's size resolved (a reflect pad's). One
        that reaches the bound's end runs to the real end: ceil((value - start) / step) elements; at any
        original end past the bound's last element taken, that is what ONNX takes too. One that stops
        before must stop inside every size: then its size is fixed."""
        if a is None or (start, step, size) == (0, 1, src):
            return a
        if not from_front:
            raise self._fail(n, "slices a bounded dim")
        if size == len(range(start, src, step)):
            return self._sized(n, a, size, add=step - 1 - start, div=step)
        if a.factor == 1 and start + (size - 1) * step < self.dims[a.dim].lo:
            return None
        raise self._fail(n, "slices a bounded dim to a fixed end that some sizes in its range do not reach")

    def _mean(self, n: UOp) -> None:
        """sum / count or sum * (1 / count), count the bound's number of elements summed: a mean, which
        lowering divides by the run-time count. Any other constant is refused."""
        i = 0 if n.src[0] in self._sums else 1
        total, c = n.src[i], constant_value(n.src[1 - i])
        count = math.prod(total.src[0].shape[a] for a in total.arg.axes)
        if c is None or not (c == count if n.op is Ops.DIV and i == 0 else
                             n.op is Ops.MUL and math.isclose(c, 1 / count, rel_tol=1e-6)):
            raise self._fail(n, "scales a sum over a bounded dim by a constant (a mean over the bound's count)")
        self.means[n] = i

    # ------------------------------------------------------------------ computed dims
    def _sized(self, n: UOp, ax: SymAxis, size: int, mul: int = 1, add: int = 0, div: int = 1, off: int = 0
               ) -> SymAxis | None:
        """The axis of compile-time size `size` whose run-time size is (value(ax) * mul + add) // div + off:
        a computed dim (one per distinct map), or None where the map is constant over ax's range."""
        if ax.factor != 1:
            raise self._fail(n, f"changes the size of an axis of {ax.factor} times dim {ax.dim!r}")
        src = self.dims[ax.dim]
        if isinstance(src, ComputedDim) and mul == 1:  # floor((floor(x / q1) + c) / q2) = floor((x + c q1) / (q1 q2))
            key = (src.src, src.mul, src.add + (src.off + add) * src.div, src.div * div, off)
        elif isinstance(src, ComputedDim) and src.div == 1:
            key = (src.src, src.mul * mul, (src.add + src.off) * mul + add, div, off)
        else:
            key = (ax.dim, mul, add, div, off)
        name, m, a, q, o = key
        key = (name, m, a % q, q, o + a // q)  # 0 <= add < div
        if key[1:] == (1, 0, 1, 0):  # the identity: that dim itself
            return SymAxis(name)
        if key not in self._computed:
            base = self.dims[name]
            d = ComputedDim(_formula(*key), 0, 0, *key)
            d = ComputedDim(d.name, d.of(base.lo), d.of(base.hi), *key)
            if d.hi != size:
                raise self._fail(n, f"has size {size} at the bounds, but {d.name} = {d.hi} there (an analysis bug)")
            if d.lo < 1:
                raise self._too_small(n, d)
            if d.lo == d.hi:
                return None
            self.slots[d.name] = len(self.dims)
            self.dims[d.name] = d
            self._computed[key] = d.name
        return SymAxis(self._computed[key])

    def root(self, name: str) -> str:
        """The input dim a dim is computed from (itself for an input dim)."""
        while isinstance(d := self.dims[name], ComputedDim):
            name = d.src
        return name

    def _too_small(self, n: UOp, d: ComputedDim) -> DynamicShapeError:
        """A computed dim < 1 at the input dim's lower bound: the smallest size that works, for the message."""
        root = self.dims[d.src]
        chain = [d]
        while isinstance(root, ComputedDim):
            chain.append(root)
            root = self.dims[root.src]

        def value(v: int) -> int:
            for c in reversed(chain):
                v = c.of(v)
            return v

        ok = next((v for v in range(root.lo, root.hi + 1) if value(v) >= 1), None)
        fix = f"the smallest size it takes is {ok}: give dim {root.name!r} the range {ok}..{root.hi}" if ok else \
            "no size in its range works"
        return DynamicShapeError(f"{self._where(n)}: at dim {root.name!r} = {root.lo} (its lower bound) "
                                 f"its output size {d.name} is {value(root.lo)}, below 1; {fix}")

    def add_value_dim(self, d: ValueDim) -> None:
        if d.name not in self.dims:
            self.slots[d.name] = len(self.dims)
            self.dims[d.name] = d

    def computed(self) -> list[ComputedDim]:
        return [d for d in self.dims.values() if isinstance(d, ComputedDim)]

    def value_of(self, name: str) -> UOp:
        """A dim's value as an index expression of the input dims (a computed dim's map, unfolded)."""
        d = self.dims[name]
        if not isinstance(d, ComputedDim):
            return self.var(name)
        return (self.value_of(d.src) * d.mul + d.add) // d.div + d.off

    def _untouched(self, n: UOp, axes: Axes, which: list[int], what: str) -> None:
        if any(axes[i] is not None for i in which):
            raise self._fail(n, what)

    def _merge(self, n: UOp, parts: list[tuple[Axes, tuple]], shape: tuple | None = None) -> Axes:
        """Broadcasting sources: an axis is a dim where a source of the full size says so (a size-1
        source broadcasts; a full-size source with no dim -- a constant -- is read at the same indices)."""
        shape = n.shape if shape is None else shape
        out: list[SymAxis | None] = [None] * len(shape)
        for axes, s in parts:
            off = len(shape) - len(axes)
            for i, a in enumerate(axes):
                if a is None or s[i] != shape[off + i]:
                    continue
                kept = out[off + i]
                if kept is not None and kept != a:  # equal at the bounds; at run time dims_kernel checks
                    if a.factor == 1 and kept.factor != 1:
                        kept, a = a, kept
                    self.equal[(kept, a)] = None
                    a = kept
                out[off + i] = a
        return tuple(out)

    def _reshape(self, n: UOp, a0: Axes) -> Axes:
        """Axes grouped as lowering groups them (lower.reshape_index); a dim must be the outermost
        non-1 axis of its group, and then sizes the outermost non-1 axis of the output group."""
        src_shape, out_shape = n.src[0].shape, n.shape
        out: list[SymAxis | None] = [None] * len(out_shape)
        for gi, gj in reshape_groups(out_shape, src_shape):
            gi = [a for a in gi if out_shape[a] != 1]
            gj = [a for a in gj if src_shape[a] != 1]
            dims = [(k, a0[a]) for k, a in enumerate(gj) if a0[a] is not None]
            if not dims:
                continue
            k, ax = dims[0]
            if len(dims) > 1 or k != 0 or not gi:
                raise self._fail(n, f"merges dim {ax.dim!r} with an outer axis")
            total = ax.factor * math.prod(src_shape[a] for a in gj[1:])
            inner = math.prod(out_shape[a] for a in gi[1:])
            if total % inner:
                raise self._fail(n, f"splits dim {ax.dim!r}")
            out[gi[0]] = SymAxis(ax.dim, total // inner)
        return tuple(out)


def _formula(src: str, mul: int, add: int, div: int, off: int) -> str:
    """A computed dim's name: its map as a formula of its source's name ("M1-2", "(M1+1)//2-1")."""
    t = src if not any(c in src for c in "+-*/() ") else f"({src})"
    if mul != 1:
        t = f"{t}*{mul}"
    if add:
        t = f"{t}+{add}"
    if div != 1:
        t = f"({t})//{div}" if mul != 1 or add or t[0] == "(" else f"{t}//{div}"
    return f"{t}{off:+d}" if off else t


def dims_kernel(dyn: DynamicAxes) -> UOp:
    """The kernel that writes each computed dim into the `dims` array, clamped into its range, and the
    status words (svodrt/abi.py): 1 + the slot of the first dim found outside its range and its value,
    or of the first dim whose axis disagrees with one it meets, that axis' size and the size it meets.
    (Maps of input dims in range stay in range: the simplifier folds those clamps and checks away.)"""
    from svodc.ir.ops import KernelArg
    from svodc.ir.rewrite import graph_rewrite
    from svodc.ir.symbolic import pm_symbolic

    def word(slot: int, name: str) -> UOp:
        return UOp(Ops.DEFINE_VAR, dtypes.index, (), VarArg(name, 0, 0, slot))

    def ic(v: int) -> UOp:
        return UOp.const(dtypes.index, v)

    status, got, want = ic(0), ic(0), ic(0)  # the first failure wins: checks are folded in from the last
    for kept, other in reversed(dyn.equal):
        size, need = dyn.value_of(other.dim) * other.factor, dyn.value_of(kept.dim) * kept.factor
        bad = size.ne(need)
        status, got, want = (bad.where(ic(dyn.slots[other.dim] + 1), status), bad.where(size, got),
                             bad.where(need, want))
    stores = []
    for d in reversed(dyn.computed()):
        v = (dyn.value_of(d.src) * d.mul + d.add) // d.div + d.off
        clamped = v.maximum(ic(d.lo)).minimum(ic(d.hi))
        bad = clamped.ne(v)
        status, got, want = bad.where(ic(dyn.slots[d.name] + 1), status), bad.where(v, got), bad.where(ic(0), want)
        stores.insert(0, UOp(Ops.STORE, dtypes.void, (word(dyn.slots[d.name], d.name), ic(0), clamped)))
    stores += [UOp(Ops.STORE, dtypes.void, (word(len(dyn.dims) + k, "status"), ic(0), v))
               for k, v in enumerate((status, got, want))]
    return graph_rewrite(UOp(Ops.SINK, dtypes.void, tuple(stores), KernelArg("k_dims", serial=True)), pm_symbolic)


def constant_value(n: UOp) -> float | None:
    """The value of a constant that is one value everywhere (a CONST or splat WEIGHT, viewed), else None."""
    while n.op in MOVEMENT:
        n = n.src[0]
    if n.op is Ops.CONST:
        return n.arg
    if n.op is Ops.WEIGHT:
        data = n.arg.array.ravel()
        return float(data[0]) if data.size and (data == data[0]).all() else None
    return None


def is_constant(n: UOp) -> bool:
    while n.op in MOVEMENT:
        n = n.src[0]
    return n.op in (Ops.WEIGHT, Ops.CONST)
