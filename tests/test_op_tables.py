"""Every op of `Ops` through every table that must know it: the checklist for adding an IR op.

A tensor-level op must have an example here and pass: the spec (ir/spec.py), shape inference
(ir/shapes.py), the reference interpreter (ir/interpret.py), the passes down to lowering
(passes/lower*.py), the target rewrites (codegen/transcendental.py, codegen/emulate.py for the
emulated dtypes) and LLVM IR emission (codegen/llvm_ir.py, llvm_alu.py, llvm_gemm.py). A new op
without an example fails `test_every_op_is_covered`. No LLVM runs here: the emitters raise on an op
they lack, so rendering the IR text is the check (milliseconds per op).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from svodc.codegen.compile import prepare_kernel
from svodc.codegen.llvm_ir import render_body
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.interpret import evaluate
from svodc.ir.ops import (
    ALU,
    BINARY,
    COMPARE,
    UNARY,
    ConstData,
    GatherArg,
    InputArg,
    Ops,
    ScatterArg,
    SizedArg,
    StepInArg,
    StepLoopArg,
)
from svodc.ir.provenance import Provenance
from svodc.ir.spec import _SPEC, verify
from svodc.ir.uop import UOp
from svodc.options import CompileOptions
from svodc.passes.pipeline import build_program
from svodc.policy import gemm_blocking
from svodc.program import ImportedGraph
from svodc.target import parse_target

SHAPE = (2, 3)
# Ops that exist only inside kernels (made by lowering) or as graph roots, never in an imported graph;
# the end-to-end tests and test_gemm.py cover them through the examples below.
LOOP_LEVEL = frozenset({Ops.SINK, Ops.DEFINE_VAR, Ops.PARAM, Ops.RANGE, Ops.LOAD, Ops.STORE, Ops.LOOP_REDUCE,
                        Ops.GEMM})
INT_ONLY = frozenset({Ops.IDIV, Ops.MOD, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR, Ops.NOT})


def _input(name: str, dtype=dtypes.float32, shape=SHAPE) -> UOp:
    return UOp(Ops.INPUT, dtype, (), InputArg(name, shape))


def _weight(a: np.ndarray) -> UOp:
    return UOp(Ops.WEIGHT, dtypes.from_numpy(a.dtype), (), ConstData(a))


def _alu(op: Ops, dtype) -> UOp:
    xs = [_input(n, dtypes.int32 if op in INT_ONLY else dtype) for n in "xyz"]
    if op is Ops.CAST:
        return UOp(op, dtypes.int32, (xs[0],))
    if op is Ops.BITCAST:
        return UOp(op, dtypes.int32 if dtype is dtypes.float32 else dtypes.int16, (xs[0],))
    if op in UNARY:
        return UOp(op, xs[0].dtype, (xs[0],))
    if op in COMPARE:
        return UOp(op, dtypes.bool, (xs[0], xs[1]))
    if op in BINARY:
        return UOp(op, xs[0].dtype, (xs[0], xs[1]))
    if op is Ops.WHERE:
        return UOp(op, dtype, (_input("c", dtypes.bool), xs[0], xs[1]))
    return UOp(op, dtype, tuple(xs))  # MULACC


def _step_loop() -> UOp:
    """h[t + 1] = 0.5 * h[t] + x[t] over 4 steps: a STEP_LOOP and its step graph's STEP_IN leaves."""
    h = UOp(Ops.STEP_IN, dtypes.float32, (), StepInArg("state", 0, SHAPE, "example"))
    xt = UOp(Ops.STEP_IN, dtypes.float32, (), StepInArg("step", 0, SHAPE, "example"))
    root = T.alu(Ops.ADD, T.alu(Ops.MUL, h, T.const(0.5, dtypes.float32, SHAPE)), xt)
    init = T.reshape(_input("h0"), (1, *SHAPE))
    return UOp(Ops.STEP_LOOP, dtypes.float32, (init, _input("x", shape=(4, *SHAPE)), root), StepLoopArg(4, 1))


def _idx() -> UOp:
    return _weight(np.array([[0, 2, 1], [1, 1, 0]], np.int32))


EXAMPLES: dict[Ops, Callable[[], UOp]] = {
    Ops.INPUT: lambda: _input("x"),
    Ops.WEIGHT: lambda: _weight(np.arange(6, dtype=np.float32).reshape(SHAPE)),
    Ops.CONST: lambda: T.const(1.5, dtypes.float32, SHAPE),
    Ops.RESHAPE: lambda: T.reshape(_input("x"), (3, 2)),
    Ops.PERMUTE: lambda: T.permute(_input("x"), (1, 0)),
    Ops.EXPAND: lambda: T.expand(T.reshape(_input("x"), (2, 3, 1)), (2, 3, 4)),
    Ops.PAD: lambda: T.pad(_input("x"), [(1, 0), (0, 2)], 7.0),
    Ops.SLICE: lambda: T.slice_axes(_input("x"), (1, 2), (-1, -1), (2, 3)),
    Ops.WINDOW: lambda: T.window(_input("x"), (1,), (2,), (1,), (1,)),
    Ops.REDUCE: lambda: T.reduce(_input("x"), Ops.MAX, [1]),
    Ops.CONV: lambda: T.conv(_input("x", shape=(1, 2, 5, 5)), _weight(np.ones((4, 2, 3, 3), np.float32)),
                             (1, 1), (1, 1), [(1, 1), (1, 1)], 1),
    Ops.MATMUL: lambda: T.matmul(_input("x"), _weight(np.ones((3, 4), np.float32))),
    Ops.GATHER: lambda: UOp(Ops.GATHER, dtypes.float32, (_input("x"), _idx()), GatherArg(1)),
    Ops.SCATTER: lambda: UOp(Ops.SCATTER, dtypes.float32, (_input("x"), _idx(), _input("u")), ScatterArg(1, Ops.ADD)),
    # axis 1 of x sized at run time by the int64 scalar n (a value dim, passes/value_dims.py)
    Ops.SIZED: lambda: UOp(Ops.SIZED, dtypes.float32, (_input("x"), _input("n", dtypes.int64, ())),
                           SizedArg((None, ("y:1", 0, SHAPE[1])))),
    Ops.STEP_LOOP: _step_loop,
    Ops.STEP_IN: _step_loop,  # a leaf of a step graph: checked through its loop
    **{op: (lambda op=op: _alu(op, dtypes.float32)) for op in ALU},
}


def test_every_op_is_covered():
    missing = set(Ops) - LOOP_LEVEL - EXAMPLES.keys()
    assert not missing, f"add an example for {sorted(o.name for o in missing)} (and teach every table it)"
    assert not (LOOP_LEVEL & EXAMPLES.keys())
    assert set(_SPEC) == set(Ops), f"ir/spec.py lacks {sorted(o.name for o in set(Ops) - set(_SPEC))}"


def _feeds(node: UOp) -> dict[str, np.ndarray]:
    r = np.random.default_rng(0)
    out = {}
    for n in node.toposort():
        if n.op is Ops.INPUT:
            dt = n.dtype.np
            if dt == np.bool_:
                out[n.arg.name] = r.uniform(size=n.arg.shape) > 0.5
            elif np.issubdtype(dt, np.integer):
                out[n.arg.name] = r.integers(1, 5, n.arg.shape).astype(dt)
            else:
                out[n.arg.name] = r.uniform(0.1, 0.9, n.arg.shape).astype(dt)
    return out


@pytest.mark.parametrize("op", sorted(EXAMPLES, key=lambda o: o.value), ids=lambda o: o.name)
def test_op_goes_through_every_table(op):
    node = EXAMPLES[op]()
    # a broadcast CONST is RESHAPE + EXPAND of it; a STEP_IN is checked through its STEP_LOOP
    assert node.op is op or op in (Ops.CONST, Ops.EXPAND) or (op is Ops.STEP_IN and node.op is Ops.STEP_LOOP)
    verify(node)  # spec and shapes
    (value,) = evaluate([node], _feeds(node))
    assert value.shape == node.shape
    target = parse_target("x86_64:x86-64")[0]
    dtypes_to_try = [dtypes.float32]
    if op in ALU and op not in INT_ONLY and op is not Ops.BITCAST:
        dtypes_to_try.append(dtypes.bfloat16)  # emulated in float32 (codegen/emulate.py)
    for dt in dtypes_to_try:
        root = node if dt is dtypes.float32 else _alu(op, dt)
        inputs = [(n.arg.name, n) for n in root.toposort() if n.op is Ops.INPUT]
        graph = ImportedGraph(inputs, [("y", root)], Provenance(), "test")
        program = build_program(graph, CompileOptions(check_ir=True))
        for kernel in program.kernels:
            text, _, _ = render_body(prepare_kernel(kernel, target, check_ir=True), target, gemm_blocking(target))
            assert f"define internal void @{kernel.name}.body(" in text
