"""Loop kernels equal but for their buffers are lowered once per program (passes/lower_memo.py, issue 13):
each gets the AST and parameters its own lowering gives, and the program's buffers come out the same."""

from __future__ import annotations

import numpy as np
from onnx import helper

from svodc.frontend.importer import import_model
from svodc.options import CompileOptions
from svodc.passes import lower_memo
from svodc.passes.pipeline import build_program
from tests.onnx_util import compile_and_run, make_model, reference


def _blocks_model(n: int = 4):
    """n softmax blocks over different weights (kernels equal but for their buffers), a transpose between
    two of them (a structure of its own), and a concat of everything (one kernel reading every block)."""
    rng = np.random.default_rng(0)
    nodes, inits, h = [], {}, "x"
    for i in range(n):
        inits[f"w{i}"] = rng.standard_normal((8, 16)).astype(np.float32)
        nodes += [helper.make_node("Add", [h, f"w{i}"], [f"a{i}"]),
                  helper.make_node("Softmax", [f"a{i}"], [f"s{i}"], axis=-1)]
        h = f"s{i}"
        if i == 1:
            nodes.append(helper.make_node("Transpose", [h], [f"t{i}"], perm=[1, 0]))
            nodes.append(helper.make_node("Transpose", [f"t{i}"], [f"u{i}"], perm=[1, 0]))
            h = f"u{i}"
    nodes.append(helper.make_node("Concat", [f"s{i}" for i in range(n)], ["y"], axis=0))
    return make_model(nodes, {"x": (np.float32, [8, 16])}, ["y"], inits)


def _program(model, memo: bool, monkeypatch):
    if not memo:
        monkeypatch.setattr(lower_memo.LoweringMemo, "lower",
                            lambda self, name, root, out, buffers, fn: fn(name, root, out, buffers))
    hits = []
    original = lower_memo.LoweringMemo.lower

    def counted(self, *args):
        result = original(self, *args)
        hits.append(self.hits)
        return result

    monkeypatch.setattr(lower_memo.LoweringMemo, "lower", counted)
    program = build_program(import_model(model), CompileOptions())
    monkeypatch.undo()
    return program, max(hits, default=0)


def _buffer(b):
    return b.id, b.kind, b.name, b.dtype, b.shape, b.offset


def test_a_memoized_lowering_is_the_lowering_node_for_node(monkeypatch):
    model = _blocks_model()
    memoized, hits = _program(model, True, monkeypatch)
    fresh, _ = _program(model, False, monkeypatch)
    assert hits >= 2  # the blocks after the first were not lowered again
    assert [k.name for k in memoized.kernels] == [k.name for k in fresh.kernels]
    for a, b in zip(memoized.kernels, fresh.kernels, strict=True):
        assert a.ast is b.ast, a.name  # hash-consed: the same node is the same AST
        assert [_buffer(p) for p in a.params] == [_buffer(p) for p in b.params], a.name
    # the weights got their buffers in the same order (ids, names, layout)
    assert [_buffer(w) for w in memoized.weights] == [_buffer(w) for w in fresh.weights]
    assert [_buffer(s) for s in memoized.scratch] == [_buffer(s) for s in fresh.scratch]


def test_memoized_kernels_compute_what_onnxruntime_does():
    model = _blocks_model()
    x = np.random.default_rng(1).standard_normal((8, 16)).astype(np.float32)
    np.testing.assert_allclose(compile_and_run(model, {"x": x})["y"], reference(model, {"x": x})[0],
                               rtol=1e-5, atol=1e-6)
