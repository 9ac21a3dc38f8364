"""The passes on small hand-built graphs (no ONNX, no LLVM): fold, views, schedule, split and the
memory plan, each checked against what it promises in its docstring."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ConstData, InputArg, Ops, ScatterArg
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.uop import UOp, output_ranges
from svodc.passes.buffers import Buffers
from svodc.passes.concat import pm_reduce_concat
from svodc.passes.fold import pm_fold, splat_value
from svodc.passes.lower import lower_kernel
from svodc.passes.memory import ALIGN, plan_arena
from svodc.passes.pads import share_window_pads
from svodc.passes.schedule import plan_kernels
from svodc.passes.views import affine_view, contiguous_strides
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy
from svodc.program import Buffer, BufferKind, Kernel


def _input(name: str, shape: tuple[int, ...], dtype=dtypes.float32) -> UOp:
    return UOp(Ops.INPUT, dtype, (), InputArg(name, shape))


def _weight(a: np.ndarray) -> UOp:
    return UOp(Ops.WEIGHT, dtypes.from_numpy(a.dtype), (), ConstData(a))


def test_passes_import_without_onnx_or_the_frontend():
    code = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "onnx" or name.startswith(("onnx.", "svodc.frontend", "svodc.api")):
            raise ImportError(f"{name} is blocked")
sys.meta_path.insert(0, Block())
import svodc.passes.pipeline, svodc.codegen.compile, svodc.codegen.gpu_compile, svodc.testvec, svodc.bundle
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


# ---------------------------------------------------------------------------------------------- fold
def test_fold_keeps_splats_splats_and_evaluates_small_constant_subgraphs():
    fold = pm_fold(1 << 10)
    two = T.const(2.0, dtypes.float32, (64, 64))
    splat = graph_rewrite(T.alu(Ops.MUL, two, T.const(3.0, dtypes.float32, (64, 64))), fold)
    assert splat_value(splat) is not None and float(splat_value(splat).arg) == 6.0  # no 64x64 weight
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    folded = graph_rewrite(T.alu(Ops.EXP, _weight(w)), fold)
    assert all(n.op is not Ops.EXP for n in folded.toposort())
    np.testing.assert_allclose(evaluate([folded])[0], np.exp(w), rtol=1e-6)


def test_fold_leaves_constants_over_the_limit_to_the_kernels():
    w = np.ones((64, 64), np.float32) * np.arange(64, dtype=np.float32)
    big = T.alu(Ops.EXP, _weight(w))
    assert graph_rewrite(big, pm_fold(100)) is big


# --------------------------------------------------------------------------------------------- views
def test_affine_view_strides_match_numpy():
    x = _input("x", (2, 3, 4))
    view = T.slice_axes(T.permute(T.reshape(x, (6, 4)), (1, 0)), (1, 0), (2, 1), (2, 6))
    got = affine_view(view, lambda n: n is x)
    ref = np.arange(24).reshape(6, 4).T[1::2, :]
    assert got is not None and got.base is x and got.shape == ref.shape
    assert got.strides == tuple(s // ref.itemsize for s in ref.strides)
    assert got.offset == ref[0, 0]


def test_a_merge_of_axes_that_are_not_contiguous_is_not_affine():
    x = _input("x", (2, 3))
    assert affine_view(T.reshape(T.permute(x, (1, 0)), (6,)), lambda n: n is x) is None
    assert contiguous_strides((2, 3, 4)) == tuple(s // 8 for s in np.zeros((2, 3, 4)).strides)


# ------------------------------------------------------------------------------------------ schedule
def test_elementwise_chains_fuse_into_one_kernel():
    x = _input("x", (8, 8))
    y = T.alu(Ops.ADD, T.alu(Ops.EXP, x), T.alu(Ops.NEG, x))
    plans, realized = plan_kernels([("y", y)])
    assert [p.root for p in plans] == [y] and realized == {y}


def test_a_reduction_that_is_broadcast_back_is_realized_once():
    x = _input("x", (8, 16))
    m = T.reduce(x, Ops.MAX, [1])
    y = T.alu(Ops.SUB, x, T.expand(m, (8, 16)))
    plans, realized = plan_kernels([("y", y)])
    assert m in realized and [p.root for p in plans] == [m, y]


def test_a_padded_copy_for_windows_computes_its_source_in_place():
    """schedule.py: the padded copy that windows read is realized and reads each element of its source once,
    so an expensive chain (or a gather) under it is computed in the copy's kernel, not realized first; the
    same chain read by a broadcast, or by two padded copies, is realized (it would be recomputed)."""
    x = _input("x", (1, 2, 10))
    y = x
    for _ in range(DEFAULT_POLICY.cheap_to_repeat + 4):
        y = T.alu(Ops.SIN, y)
    padded = T.pad(y, ((0, 0), (0, 0), (2, 2)))
    pooled = T.reduce(T.window(padded, [2], [3], [1], [1]), Ops.MAX, [3])
    plans, realized = plan_kernels([("p", pooled)])
    assert [p.root for p in plans] == [padded, pooled] and y not in realized
    _, realized = plan_kernels([("p", pooled), ("b", T.alu(Ops.ADD, T.expand(y, (3, 2, 10)), x))])
    assert y in realized
    other = T.reduce(T.window(T.pad(y, ((0, 0), (0, 0), (1, 1))), [2], [3], [1], [1]), Ops.MAX, [3])
    _, realized = plan_kernels([("p", pooled), ("q", other)])
    assert y in realized


def test_windowed_pads_of_one_tensor_share_one_padded_copy():
    """passes/pads.py: three windows over pads 1, 2 and (0, 3) of x read slices of one PAD (the widest per side),
    one kernel; the values are the same. Bounded dims (dynamic) leave the graph alone, as does a lone pad."""
    x = _input("x", (1, 2, 10))
    pads = [(1, 1), (2, 2), (0, 3)]
    outs = [T.reduce(T.window(T.pad(x, ((0, 0), (0, 0), p)), [2], [3], [1], [1]), Ops.MAX, [3]) for p in pads]
    sink = UOp(Ops.SINK, dtypes.void, tuple(outs))
    shared = share_window_pads(sink, dynamic=False)
    padded = [n for n in shared.toposort() if n.op is Ops.PAD]
    assert len(padded) == 1 and padded[0].arg.pads[2] == (2, 3)
    xs = {"x": np.random.default_rng(1).standard_normal((1, 2, 10)).astype(np.float32)}
    for got, want in zip(evaluate(list(shared.src), xs), evaluate(outs, xs), strict=True):
        np.testing.assert_array_equal(got, want)
    plans, _ = plan_kernels([(f"y{i}", y) for i, y in enumerate(shared.src)])
    assert [p.root for p in plans].count(padded[0]) == 1 and len(plans) == 4  # the copy, then the three windows
    assert share_window_pads(sink, dynamic=True) is sink
    lone = UOp(Ops.SINK, dtypes.void, (outs[0],))
    assert share_window_pads(lone, dynamic=False) is lone


def test_fusion_stops_at_the_policys_limit_and_a_scatter_is_its_own_kernel():
    x = _input("x", (4,))
    y = x
    for _ in range(30):
        y = T.alu(Ops.SIN, y)
    plans, _ = plan_kernels([("y", y)], OptimizationPolicy(max_fused_ops=10))
    assert len(plans) >= 3
    idx = _weight(np.array([2, 0], np.int32))
    upd = T.alu(Ops.EXP, _input("u", (2,)))
    s = UOp(Ops.SCATTER, dtypes.float32, (T.alu(Ops.EXP, x), idx, upd), ScatterArg(0))
    _, realized = plan_kernels([("s", T.alu(Ops.NEG, s))])
    assert s in realized


def test_a_max_or_min_over_a_concatenation_reduces_each_piece_and_selects_nothing():
    """passes/concat.py: stack-then-max (pieces one wide: no reduction left) and concat-then-min over two axes
    (pieces reduced each); the same values as before the rewrite, NaN included. A sum is left alone."""
    r = np.random.default_rng(0)
    xs = {n: r.standard_normal((2, 5, 3)).astype(np.float32) for n in "abc"}
    xs["a"][0, 1, 2] = np.nan
    a, b, c = (_input(n, (2, 5, 3)) for n in "abc")
    stacked = T.concat([T.reshape(x, (2, 5, 3, 1)) for x in (a, b, c)], 3)
    wide = T.concat([a, b, c], 1)  # widths 5, 5, 5 along the reduced axis 1
    cases = [(T.reduce(stacked, Ops.MAX, [3]), 0), (T.reduce(wide, Ops.MIN, [1, 2]), 3),
             (T.reduce(stacked, Ops.ADD, [3]), None)]
    for y, reduces in cases:
        z = graph_rewrite(y, pm_reduce_concat)
        ops = [n.op for n in z.toposort()]
        if reduces is None:
            assert z is y
            continue
        assert Ops.WHERE not in ops and ops.count(Ops.REDUCE) == reduces and z.shape == y.shape
        np.testing.assert_array_equal(evaluate([z], xs)[0], evaluate([y], xs)[0])
    assert graph_rewrite(T.reduce(stacked, Ops.MAX, [1]), pm_reduce_concat).src[0] is stacked  # not the cat axis


# ----------------------------------------------------------------------------------- split, lowering
def _lower(root: UOp, inputs: list[UOp]):
    ids = iter(range(1 << 20))
    bufs = [Buffer(next(ids), BufferKind.INPUT, x.dtype, x.shape, x.arg.name, slot=i) for i, x in enumerate(inputs)]
    out = Buffer(next(ids), BufferKind.OUTPUT, root.dtype, root.shape, "y", slot=0)
    return lower_kernel("k", root, out, Buffers(bufs, ids), DEFAULT_POLICY)


def test_a_concatenation_is_split_into_one_store_per_source():
    a, b = _input("a", (40, 3)), _input("b", (40, 4))  # rows parallel, the concatenated axis a loop
    ast, params = _lower(T.concat([a, b], 1), [a, b])
    stores = [s for s in ast.src if s.op is Ops.STORE]
    assert len(stores) == 2
    for st in stores:  # each piece reads exactly one source, without a select
        assert sum(1 for n in st.toposort() if n.op is Ops.LOAD) == 1
        assert all(n.op is not Ops.WHERE for n in st.toposort())
    assert [p.name for p in params] == ["y", "a", "b"]


@pytest.mark.parametrize("width,split", [(28, False), (56, True)])
def test_a_padded_copy_is_split_only_where_its_rows_are_long(width, split):
    """split.LONG_ROW: a padded copy (one clamped load) of long rows gets a piece whose rows are the source's whole
    rows, loaded without a clamp on the row index (a vector copy); short rows stay one statement (LLVM unrolls them
    whole and decides the clamps itself)."""
    from svodc.passes.split import LONG_ROW

    x = _input("x", (4, width, width))
    ast, _ = _lower(T.pad(x, [(0, 0), (1, 1), (1, 1)], 0.0), [x])
    stores = [s for s in ast.src if s.op is Ops.STORE]
    assert (width + 2 >= LONG_ROW) == split

    def row_copy(st: UOp) -> bool:
        inner = output_ranges(st)[-1]
        loads = [n for n in st.toposort() if n.op is Ops.LOAD]
        clamped = [n for n in st.toposort() if n.op in (Ops.MIN, Ops.MAX) and inner in n.toposort()]
        return inner.src[0].arg == width and len(loads) == 1 and not clamped

    assert any(row_copy(st) for st in stores) == split
    assert (len(stores) > 1) == split


def test_a_padded_copy_that_converts_is_split_at_any_width():
    """An int8 depthwise convolution's padded copy stores u8 - zero as float32: LLVM vectorized neither its short
    rows unrolled nor its long ones clamped (split.LONG_ROW), so it is split whatever its width."""
    x = _input("x", (4, 14, 14), dtypes.uint8)
    converted = T.alu(Ops.SUB, T.cast(x, dtypes.float32), T.const(3.0, dtypes.float32, (4, 14, 14)))
    ast, _ = _lower(T.pad(converted, [(0, 0), (1, 1), (1, 1)], 0.0), [x])
    assert len([s for s in ast.src if s.op is Ops.STORE]) > 1


def test_a_split_piece_equals_the_plain_substitution_simplified():
    # split._restrict walks only the branches the piece's interval takes; simplified, the piece must be
    # exactly what substituting the range everywhere and simplifying gives.
    from svodc.ir.ops import RangeArg, RangeKind
    from svodc.ir.symbolic import simplify
    from svodc.passes.split import _restrict, thresholds

    def ic(v: int) -> UOp:
        return UOp.const(dtypes.index, v)

    r = UOp(Ops.RANGE, dtypes.index, (ic(12),), RangeArg(0, RangeKind.LOOP))
    x = _input("x", (12,))
    value = x.alu(Ops.MUL, 2.0)
    for t in (9, 6, 3):  # a concatenation's select chain: r < 3 ? .. : r < 6 ? .. : ..
        value = UOp(Ops.WHERE, dtypes.float32, (r.alu(Ops.CMPLT, ic(t)), x.alu(Ops.ADD, float(t)), value))
    assert thresholds(value, r) == {3, 6, 9}

    def plain(root: UOp, old: UOp, new: UOp) -> UOp:
        done = {old: new}
        for n in root.toposort():
            if n not in done:
                done[n] = n.replace(src=tuple(done.get(s, s) for s in n.src)) if n.src else n
        return done[root]

    for lo, hi in ((0, 3), (3, 6), (6, 9), (9, 12), (0, 12), (2, 5)):
        sub = UOp(Ops.RANGE, dtypes.index, (ic(hi - lo),), r.arg)
        new = sub if lo == 0 else sub.alu(Ops.ADD, ic(lo))
        restricted = _restrict(value, r, new)
        assert simplify(restricted) is simplify(plain(value, r, new))
        decided = (lo, hi) in ((0, 3), (3, 6), (6, 9), (9, 12))
        assert decided == all(n.op is not Ops.WHERE for n in restricted.toposort())


def test_lowering_clamps_only_what_bounds_analysis_cannot_prove():
    x = _input("x", (6,))
    plain, _ = _lower(T.alu(Ops.NEG, x), [x])
    padded, _ = _lower(T.pad(x, [(2, 2)], 0.0), [x])

    def clamps(ast):
        return sum(1 for n in ast.toposort() if n.op in (Ops.MAX, Ops.MIN) and n.dtype is dtypes.index)

    assert clamps(plain) == 0 and clamps(padded) > 0


# --------------------------------------------------------------------------------------- memory plan
def test_arena_shares_memory_only_between_buffers_that_are_never_live_together():
    ids = iter(range(100))
    bufs = [Buffer(next(ids), BufferKind.SCRATCH, dtypes.float32, (n,), f"t{i}") for i, n in enumerate((100, 50, 100))]
    a, b, c = bufs
    sink = UOp(Ops.SINK, dtypes.void, ())
    kernels = [Kernel("k0", sink, [a]), Kernel("k1", sink, [b, a]), Kernel("k2", sink, [c, b])]
    size = plan_arena(kernels, bufs)
    assert all(x.offset % ALIGN == 0 for x in bufs)
    live = {"a": (0, 1), "b": (1, 2), "c": (2, 2)}
    spans = {name: (x.offset, x.offset + x.nbytes) for name, x in zip("abc", bufs, strict=True)}
    for p in "abc":
        for q in "abc":
            if p < q and not (live[p][1] < live[q][0] or live[q][1] < live[p][0]):
                assert spans[p][1] <= spans[q][0] or spans[q][1] <= spans[p][0], (p, q)
    assert spans["a"][0] == spans["c"][0]  # a is dead when c is born: same place
    assert size < sum(x.nbytes for x in bufs) and size >= max(e for _, e in spans.values())
