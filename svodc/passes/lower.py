"""Lowering: one kernel's tensor-level subgraph -> a loop-level AST.

The kernel iterates over the elements of its root tensor. Lowering a node means answering "what is
its value at output index idx?" as a scalar expression: movement ops transform the index (RESHAPE
through div/mod, PERMUTE by reordering, EXPAND by zeroing, PAD with a validity test, SLICE and WINDOW
with affine maps), ALU ops apply to their sources at the same index, a REDUCE opens new RANGEs and
becomes a LOOP_REDUCE, and a realized tensor (a buffer) becomes a LOAD at its linear index.

Invariant: a LOAD never reads outside its buffer. Where bounds analysis cannot prove an index in
range (padding, windows over padding), each axis index is clamped into the buffer first; the value
read there is discarded by the PAD's select. Index values read at run time (GATHER, SCATTER) are
normalized and clamped into their axis before use, so the invariant holds for any data.

A SCATTER kernel is the one kernel with two stores: it copies its source into the output, then
writes (or combines) each update at its run-time position, in order, on one thread (serial).
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Generator
from functools import reduce

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import (
    ALU,
    GatherArg,
    KernelArg,
    Ops,
    PadArg,
    ParamArg,
    PermuteArg,
    RangeArg,
    RangeKind,
    ReduceArg,
    ScatterArg,
    ShapeArg,
    SliceArg,
    WindowArg,
)
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.shapes import reshape_groups
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers, computed_nodes
from svodc.passes.dynamic import DynamicAxes
from svodc.passes.rows import row_axes, two_pass_softmax
from svodc.passes.split import split_kernel
from svodc.policy import OptimizationPolicy
from svodc.program import Buffer

_IDX = dtypes.index
_REDUCE_IDENTITY = {Ops.ADD: 0, Ops.MUL: 1}
# A node's lowering: yields the (source, index) pairs whose values it needs, returns its value.
Lowering = Generator[tuple[UOp, tuple[UOp, ...]], UOp, UOp]


def ic(v: int) -> UOp:
    return UOp.const(_IDX, v)


def _simplify(x: UOp) -> UOp:
    return graph_rewrite(x, pm_symbolic)


def reshape_index(idx: tuple[UOp, ...], out_shape: tuple[int, ...], src_shape: tuple[int, ...]) -> list[UOp]:
    """Map an index into out_shape to the index into src_shape with the same linear position.
    Axes are grouped where the running products of both shapes agree, so div/mod only appears
    inside a group that really merges or splits axes."""
    src_idx: list[UOp] = []
    for gi, gj in reshape_groups(out_shape, src_shape):
        flat = ic(0)
        for a in gi:
            flat = flat * out_shape[a] + idx[a]
        stride = 1
        parts = []
        for b in reversed(gj):
            parts.append(flat // stride % src_shape[b] if src_shape[b] != 1 else ic(0))
            stride *= src_shape[b]
        src_idx.extend(reversed(parts))
    return src_idx


class KernelLowerer:
    """Lowers one kernel. `buffers.get(node)` gives the buffer a node is read from (None when the node
    is computed in this kernel); `read_back` names nodes this kernel itself has already written to a
    buffer (a GEMM's product, which its epilogue reads back from C)."""

    def __init__(self, name: str, out: Buffer, buffers: Buffers, policy: OptimizationPolicy,
                 dyn: DynamicAxes | None = None):
        self.name = name
        self.dyn = dyn
        self.params: list[Buffer] = [out]
        self._param_uops: dict[int, UOp] = {}
        self.buffers = buffers
        self.policy = policy
        self.read_back: dict[UOp, Buffer] = {}
        self._ranges = 0
        self._memo: dict[tuple[UOp, tuple[UOp, ...]], UOp] = {}
        # A loop REDUCE over several static axes runs them as one range (lower_kernel keeps it where that
        # needs no div/mod): one long loop LLVM vectorizes, not nested short ones (GlobalAveragePool's 13 x 13).
        self.merge_reduce = False

    def extents(self, n: UOp) -> tuple[int | UOp, ...]:
        """n's axis sizes at run time: ints, or UOps where a bounded dim sizes the axis."""
        return self.dyn.extents(n) if self.dyn else n.shape

    def param(self, buf: Buffer) -> UOp:
        if buf.id not in self._param_uops:
            if buf is not self.params[0] and buf not in self.params:
                self.params.append(buf)
            i = self.params.index(buf)
            self._param_uops[buf.id] = UOp(Ops.PARAM, buf.dtype.ptr(), (), ParamArg(i, buf.name))
        return self._param_uops[buf.id]

    def new_range(self, size: int | UOp, kind: RangeKind) -> UOp:
        """A loop over [0, size); size is a UOp for a run-time extent (a bounded dim, passes/dynamic.py)."""
        r = UOp(Ops.RANGE, _IDX, (ic(size) if isinstance(size, int) else size,), RangeArg(self._ranges, kind))
        self._ranges += 1
        return r

    # ------------------------------------------------------------------ the kernel
    def lower_kernel(self, root: UOp, copy_from: Buffer | None = None, merge_inner: bool = False) -> UOp:
        if math.prod(root.shape) == 0:  # an empty tensor: nothing to store
            return UOp(Ops.SINK, dtypes.void, (), KernelArg(self.name))
        if root.op is Ops.SCATTER and copy_from is None:
            return self.lower_scatter(root)
        # A reshape keeps the linear order, so a kernel whose root is a reshape can iterate over the
        # shape before it and store at the same addresses: no div/mod to split merged axes (this
        # turns an im2col copy into affine loops over the window axes).
        while copy_from is None and root.op is Ops.RESHAPE and self.buffers.get(root.src[0]) is None:
            root = root.src[0]
        if copy_from is None and (two_pass := two_pass_softmax(self, root)) is not None:
            return split_kernel(_simplify(two_pass))
        shape = root.shape
        idx = self.output_index(shape, merge_inner, self.extents(root), row_axes(root, self.buffers))
        value = self.load(copy_from, idx) if copy_from is not None else self.lower(root, idx, top=True)
        out = self.params[0]
        store = UOp(Ops.STORE, dtypes.void, (self.param(out), self.linear(idx, shape), value))
        sink = UOp(Ops.SINK, dtypes.void, (store,), KernelArg(self.name))
        return split_kernel(_simplify(sink))

    def lower_scatter(self, root: UOp) -> UOp:
        """SINK(copy source -> out, then out[target(p)] = upd[p] for p in row-major order), serial.
        All loops are plain LOOPs: one thread runs the kernel, so the copy finishes before any
        update and repeated targets are written in order (the last wins, reductions accumulate)."""
        arg: ScatterArg = root.arg
        x, ix, upd = root.src
        shape = root.shape
        out = self.param(self.params[0])
        cidx = tuple(self.new_range(e, RangeKind.LOOP) if d != 1 else ic(0)
                     for d, e in zip(shape, self.extents(root), strict=True))
        copy = UOp(Ops.STORE, dtypes.void, (out, self.linear(cidx, shape), self.lower(x, cidx)))
        uidx = tuple(self.new_range(e, RangeKind.LOOP) if d != 1 else ic(0)
                     for d, e in zip(upd.shape, self.extents(upd), strict=True))
        target = list(uidx)
        target[arg.axis] = self.index_value(ix, uidx, shape[arg.axis])
        where = _simplify(self.linear(tuple(target), shape))
        value = self.lower(upd, uidx)
        if arg.reduce is not None:
            value = UOp(arg.reduce, root.dtype, (UOp(Ops.LOAD, root.dtype, (out, where), 0), value))
        update = UOp(Ops.STORE, dtypes.void, (out, where, value))
        return _simplify(UOp(Ops.SINK, dtypes.void, (copy, update), KernelArg(self.name, serial=True)))

    def index_value(self, ix: UOp, idx: tuple[UOp, ...], size: int) -> UOp:
        return self._drive(None, self._index_value(ix, idx, size))

    def _index_value(self, ix: UOp, idx: tuple[UOp, ...], size: int, extent: int | UOp | None = None) -> Lowering:
        """The index tensor's value at idx as a loop index: negative values count from the end, then
        clamped into [0, size) so a load or store through it stays inside the buffer; into [0, extent) for
        a run-time extent (a Resize's positions over a bounded dim, passes/dynamic.py: past it is garbage)."""
        v = (yield ix, idx).cast(_IDX)
        v = v.lt(ic(0)).where(v + size, v)
        top = extent - 1 if isinstance(extent, UOp) else ic(max(size - 1, 0))
        return _simplify(v.maximum(ic(0)).minimum(top))

    def output_index(self, shape: tuple[int, ...], merge_inner: bool = False,
                     extents: tuple[int | UOp, ...] | None = None, rows: int = 0) -> tuple[UOp, ...]:
        """Leading axes collapse into one PARALLEL range (split across threads); the rest loop, one
        range per axis, or all in one range when merge_inner (a long contiguous innermost loop).
        `extents` gives run-time sizes (passes/dynamic.py): a run-time axis only leads a collapsed
        group (its index is then the range divided by a constant) and is never merged. The last `rows`
        axes (row_axes) stay out of the parallel range and are merged only with each other."""
        ext = shape if extents is None else extents
        k, p = 0, 1
        lead_max = len(shape) - rows
        while k < lead_max and p < self.policy.parallel_min and (k == 0 or isinstance(ext[k], int)):
            p *= shape[k]
            k += 1
        idx: list[UOp] = []
        if k:
            size = p if isinstance(ext[0], int) else reduce(operator.mul, ext[1:k], ext[0])
            idx += self._split_range(self.new_range(size, RangeKind.PARALLEL), shape[:k], isinstance(ext[0], int))
        rest, rest_ext = shape[k:], ext[k:]
        if (merge_inner and (not rows or k == lead_max) and len([d for d in rest if d != 1]) > 1
                and all(isinstance(e, int) for e in rest_ext)):
            idx += self._split_range(self.new_range(math.prod(rest), RangeKind.LOOP), rest)
        else:
            idx += [self.new_range(e, RangeKind.LOOP) if d != 1 else ic(0) for d, e in zip(rest, rest_ext, strict=True)]
        return tuple(_simplify(i) for i in idx)

    @staticmethod
    def _split_range(r: UOp, dims: tuple[int, ...], static_lead: bool = True) -> list[UOp]:
        """r over the row-major product of dims -> one index per dim. The leading index needs no
        modulo (r < prod(dims)); a run-time leading extent gets none, as bounds could not drop it."""
        out, inner = [], math.prod(dims)
        for i, d in enumerate(dims):
            inner //= d
            out.append(ic(0) if d == 1 else r // inner if i == 0 and not static_lead else r // inner % d)
        return out

    @staticmethod
    def linear(idx: tuple[UOp, ...], shape: tuple[int, ...]) -> UOp:
        out, stride = ic(0), 1
        for i, s in zip(reversed(idx), reversed(shape), strict=True):
            out = out + i * stride
            stride *= s
        return out

    def load(self, buf: Buffer, idx: tuple[UOp, ...]) -> UOp:
        if math.prod(buf.shape) == 0:  # no element can be read; whatever selects this value discards it
            return UOp.const(buf.dtype, 0)
        clamped = []
        for i, size in zip(idx, buf.shape, strict=True):
            i = _simplify(i)
            if i.vmin < 0 or i.vmax >= size:
                i = i.maximum(ic(0)).minimum(ic(size - 1))
            clamped.append(i)
        index = _simplify(self.linear(tuple(clamped), buf.shape))
        return UOp(Ops.LOAD, buf.dtype, (self.param(buf), index), 0)

    # ------------------------------------------------------------------ values
    # Lowering a node needs its sources' values first, at indices that depend on the node (and, for
    # GATHER, on a source's lowered value). Each node's lowering is a generator that yields the
    # (source, index) pairs it needs and receives their values; `_drive` runs them on an explicit
    # stack, memoized on (node, index), so graph depth costs heap, not Python stack.
    def lower(self, n: UOp, idx: tuple[UOp, ...], top: bool = False) -> UOp:
        key = (n, idx)
        hit = self._memo.get(key)
        return hit if hit is not None else self._drive(key, self._lower_node(n, idx, top))

    def _drive(self, key: tuple[UOp, tuple[UOp, ...]] | None, gen: Lowering) -> UOp:
        stack: list[tuple[tuple[UOp, tuple[UOp, ...]] | None, Lowering]] = [(key, gen)]
        value: UOp | None = None
        while stack:
            key, gen = stack[-1]
            try:
                n, idx = gen.send(value)
            except StopIteration as done:
                stack.pop()
                value = done.value
                if key is not None:
                    self._memo[key] = value
                continue
            value = self._memo.get((n, idx))
            if value is None:
                stack.append(((n, idx), self._lower_node(n, idx, False)))
        assert value is not None
        return value

    def _lower_node(self, n: UOp, idx: tuple[UOp, ...], top: bool) -> Lowering:
        written = self.read_back.get(n)
        if written is not None:  # read at the same linear position of the buffer's own shape
            return self.load(written, idx if n.shape == written.shape else
                             tuple(reshape_index(idx, n.shape, written.shape)))
        if not top or n.op in (Ops.INPUT, Ops.WEIGHT):
            buf = self.buffers.get(n)
            if buf is not None:
                return self.load(buf, idx)
        return (yield from self._lower_op(n, idx))

    def _lower_op(self, n: UOp, idx: tuple[UOp, ...]) -> Lowering:
        op, arg = n.op, n.arg
        if op is Ops.CONST:
            return n
        if op in ALU:
            if self.dyn and n in self.dyn.means:  # a mean over a bounded dim: divided by the run-time count
                total = n.src[self.dyn.means[n]]
                extents = self.extents(total.src[0])
                count = reduce(operator.mul, [extents[a] for a in total.arg.axes if isinstance(extents[a], UOp)])
                count = count * math.prod(e for a in total.arg.axes if isinstance(e := extents[a], int))
                return UOp(Ops.DIV, n.dtype, ((yield total, idx), count.cast(n.dtype)))
            srcs = []
            for s in n.src:
                srcs.append((yield s, idx))
            return UOp(op, n.dtype, tuple(srcs))
        src = n.src[0] if n.src else None
        if op is Ops.RESHAPE:
            assert isinstance(arg, ShapeArg)
            return (yield src, tuple(reshape_index(idx, arg.shape, src.shape)))
        if op is Ops.PERMUTE:
            assert isinstance(arg, PermuteArg)
            sidx: list[UOp | None] = [None] * len(idx)
            for i, a in enumerate(arg.order):
                sidx[a] = idx[i]
            return (yield src, tuple(sidx))
        if op is Ops.EXPAND:
            return (yield src, tuple(ic(0) if s == 1 and d != 1 else i
                                     for i, s, d in zip(idx, src.shape, n.shape, strict=True)))
        if op is Ops.PAD:
            assert isinstance(arg, PadArg)
            valid: UOp = UOp.const(dtypes.bool, True)
            sidx = []
            # A run-time extent (a bounded dim): past it, the bound's layout holds garbage, not padding.
            for i, (b, _), size, extent in zip(idx, arg.pads, src.shape, self.extents(src), strict=True):
                j = _simplify(i - b) if b else i
                if j.vmin < 0:
                    valid = valid.logical_and(j.ge(0))
                if j.vmax >= size or (not isinstance(extent, int) and _simplify(j.lt(extent)).op is not Ops.CONST):
                    valid = valid.logical_and(j.lt(extent))
                sidx.append(j)
            inner = yield src, tuple(sidx)
            return _simplify(valid).where(inner, UOp.const(n.dtype, arg.value))
        if op is Ops.SLICE:
            assert isinstance(arg, SliceArg)
            return (yield src, tuple(_simplify(i * step + start) for i, start, step in
                                     zip(idx, arg.starts, arg.steps, strict=True)))
        if op is Ops.WINDOW:
            assert isinstance(arg, WindowArg)
            nd = src.ndim
            sidx = list(idx[:nd])
            for k, (a, s, d) in enumerate(zip(arg.axes, arg.strides, arg.dilations, strict=True)):
                sidx[a] = _simplify(idx[a] * s + idx[nd + k] * d)
            return (yield src, tuple(sidx))
        if op is Ops.GATHER:
            assert isinstance(arg, GatherArg)
            x, ix = n.src
            sidx = [ic(0) if d == 1 else i for i, d in zip(idx, x.shape, strict=True)]
            sidx[arg.axis] = yield from self._index_value(ix, idx, x.shape[arg.axis], self.extents(x)[arg.axis])
            return (yield x, tuple(sidx))
        if op is Ops.REDUCE:
            assert isinstance(arg, ReduceArg)
            if self._unrolls(n):
                return (yield from self._unrolled_reduce(n, idx))
            if math.prod(src.shape[a] for a in arg.axes) == 0:  # before any range: a merged one splits by each size
                return UOp.const(n.dtype, reduce_identity(arg.op, n.dtype))
            ranges = []
            sidx = list(idx)
            extents = self.extents(src)
            axes = [a for a in arg.axes if src.shape[a] != 1]
            for a in arg.axes:
                sidx[a] = ic(0)
            if self.merge_reduce and len(axes) > 1 and all(isinstance(extents[a], int) for a in axes):
                r = self.new_range(math.prod(src.shape[a] for a in axes), RangeKind.REDUCE)
                ranges.append(r)
                for a, i in zip(axes, self._split_range(r, tuple(src.shape[a] for a in axes)), strict=True):
                    sidx[a] = _simplify(i)
            else:
                for a in axes:
                    r = self.new_range(extents[a], RangeKind.REDUCE)
                    ranges.append(r)
                    sidx[a] = r
            inner = yield src, tuple(sidx)
            if not ranges:
                return inner
            return UOp(Ops.LOOP_REDUCE, n.dtype, (inner, *ranges), arg.op)
        raise NotImplementedError(f"cannot lower {op.name} (it should have been decomposed before lowering)")

    def _unrolls(self, n: UOp) -> bool:
        """A REDUCE over at most policy.unroll_reduce_max elements of static extent (a depthwise or
        grouped convolution's taps, a pooling window) is written out term by term: with no inner loop
        left, the output's innermost loop is the one LLVM vectorizes, each lane one output element.
        Not for floats narrower than float32: the loop accumulates those in float32 and rounds once
        (codegen), a written-out chain would round at every term."""
        extents = self.extents(n.src[0])
        return unrolls_reduce(n, self.policy) and all(isinstance(extents[a], int) for a in n.arg.axes)

    def _unrolled_reduce(self, n: UOp, idx: tuple[UOp, ...]) -> Lowering:
        """The reduction written out over the reduced axes in row-major order, as about sqrt(count)
        independent chains of consecutive terms (a 3x3 window: one per row) summed pairwise: a single
        chain of dependent FMAs would make each output wait count FMA latencies. A float sum of
        products becomes MULACCs (fused multiply-adds)."""
        src, op = n.src[0], n.arg.op
        axes = [a for a in n.arg.axes if src.shape[a] != 1]
        points = list(itertools.product(*(range(src.shape[a]) for a in axes)))
        per_chain = max(1, round(math.sqrt(len(points))))
        # A float max or min propagates NaN (numpy's): per pair, compare, check the first for NaN, or, select
        # (4 instructions on x86, each waiting for the last). Written as the machine's max (a compare and
        # select, which is maxps) over the terms, plus one NaN test over them all (pairs of self-compares
        # that LLVM fuses into one unordered compare per two terms), the window is a tree of 1-instruction
        # steps (MaxPool 3x3 stride 2 over 64 x 111 x 111: 0.161 -> 0.092 ms on one Zen 4 core; squeezenet 0.97x).
        nan_safe = op in (Ops.MAX, Ops.MIN) and n.dtype.is_float
        nans: list[UOp] = []

        def combine(a: UOp, b: UOp) -> UOp:
            if not nan_safe:
                return UOp(op, n.dtype, (a, b))
            better = UOp(Ops.CMPLT, dtypes.bool, (b, a) if op is Ops.MAX else (a, b))
            return UOp(Ops.WHERE, n.dtype, (better, a, b))

        chains: list[UOp] = []
        for start in range(0, len(points), per_chain):
            acc: UOp | None = None
            for point in points[start:start + per_chain]:
                sidx = list(idx)
                for a in n.arg.axes:
                    sidx[a] = ic(0)
                for a, v in zip(axes, point, strict=True):
                    sidx[a] = ic(v)
                term = yield src, tuple(_simplify(i) for i in sidx)
                if nan_safe:
                    nans.append(UOp(Ops.CMPNE, dtypes.bool, (term, term)))
                if acc is None:
                    acc = term
                elif op is Ops.ADD and n.dtype.is_float and term.op is Ops.MUL:
                    acc = UOp(Ops.MULACC, n.dtype, (*term.src, acc))
                else:
                    acc = combine(acc, term)
            assert acc is not None
            chains.append(acc)
        out = _pairwise(chains, combine)
        if not nan_safe:
            return out
        any_nan = _pairwise(nans, lambda a, b: UOp(Ops.OR, dtypes.bool, (a, b)))
        return UOp(Ops.WHERE, n.dtype, (any_nan, UOp.const(n.dtype, math.nan), out))


def _pairwise(xs: list[UOp], combine) -> UOp:
    """xs combined as a balanced tree (independent pairs first), in order."""
    while len(xs) > 1:
        pairs = [combine(a, b) for a, b in zip(xs[::2], xs[1::2], strict=False)]
        xs = pairs + xs[len(pairs) * 2:]
    return xs[0]


def unrolls_reduce(n: UOp, policy: OptimizationPolicy) -> bool:
    """Whether lowering writes REDUCE n out term by term where its extents are static (_unrolls): ADD, MAX or MIN
    over 2 .. policy.unroll_reduce_max elements, not a sum of a float narrower than float32."""
    count = math.prod(n.src[0].shape[a] for a in n.arg.axes)
    narrow = n.dtype.is_float and n.dtype.itemsize < 4
    return (1 < count <= policy.unroll_reduce_max and n.arg.op in (Ops.ADD, Ops.MAX, Ops.MIN)
            and not (narrow and n.arg.op is Ops.ADD))


def reduce_identity(op: Ops, dtype) -> int | float | bool:
    from svodc.ir.dtypes import max_value, min_value

    if op is Ops.MAX:
        return min_value(dtype)
    if op is Ops.MIN:
        return max_value(dtype)
    return _REDUCE_IDENTITY[op]


def lower_kernel(name: str, root: UOp, out: Buffer, buffers: Buffers, policy: OptimizationPolicy,
                 copy_from: Buffer | None = None, dyn: DynamicAxes | None = None) -> tuple[UOp, list[Buffer]]:
    """Lower one kernel. The inner output axes (and the axes of a loop REDUCE over several) are tried as
    one merged loop first: when that indexes every buffer without div/mod (the axes are contiguous
    everywhere), it gives the vectorizer one long loop instead of short nested ones; otherwise each
    axis keeps its own loop."""
    results = []
    tries = [(False, False)]
    if policy.merge_inner_loops:
        merged_reduce = _multi_axis_loop_reduce(root, buffers, policy)
        tries = [(True, True), (True, False), *tries] if merged_reduce else [(True, False), *tries]
    for merge, merge_reduce in tries:
        lowerer = KernelLowerer(name, out, buffers, policy, dyn)
        lowerer.merge_reduce = merge_reduce
        ast = lowerer.lower_kernel(root, copy_from, merge_inner=merge)
        results.append((_divmods(ast), ast, lowerer.params))
        if results[0][0] == 0:  # no div/mod: nothing can beat it (and the first wins a tie)
            break
    _, ast, params = min(results, key=lambda r: r[0])  # the first (merged) on a tie
    return ast, params


def _multi_axis_loop_reduce(root: UOp, buffers: Buffers, policy: OptimizationPolicy) -> bool:
    """Whether the kernel computes (not reads from a buffer) a REDUCE that runs as a loop (not written out)
    over more than one axis of size > 1: only then is a merged-reduce lowering worth a try."""
    return any(n.op is Ops.REDUCE and not unrolls_reduce(n, policy)
               and sum(1 for a in n.arg.axes if n.src[0].shape[a] != 1) > 1
               for n in computed_nodes(root, lambda x: buffers.get(x) is not None))


def _divmods(ast: UOp) -> int:
    from svodc.ir.uop import toposort

    return sum(1 for n in toposort([ast]) if n.op in (Ops.IDIV, Ops.MOD) and n.dtype is dtypes.index)
