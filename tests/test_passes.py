"""The passes on small hand-built graphs (no ONNX, no LLVM): fold, views, schedule, split and the
memory plan, each checked against what it promises in its docstring."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import ConstData, InputArg, Ops, ScatterArg
from svodc.ir.rewrite import graph_rewrite
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers
from svodc.passes.fold import pm_fold, splat_value
from svodc.passes.lower import lower_kernel
from svodc.passes.memory import ALIGN, plan_arena
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
