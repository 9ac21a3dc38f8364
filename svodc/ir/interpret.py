"""A numpy reference interpreter for tensor-level graphs.

It defines what each tensor-level op means, and serves constant folding (evaluating subgraphs whose
leaves are all constants) and the tests (every pass must preserve what this computes).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping

import numpy as np

from svodc.ir.alu import cast_array, eval_alu, widen
from svodc.ir.ops import (
    ALU,
    ConstData,
    ConvArg,
    GatherArg,
    InputArg,
    Ops,
    PadArg,
    PermuteArg,
    ReduceArg,
    ScatterArg,
    ShapeArg,
    SliceArg,
    WindowArg,
)
from svodc.ir.steps import step_dependent
from svodc.ir.uop import UOp, toposort

_REDUCERS = {Ops.ADD: np.add, Ops.MUL: np.multiply, Ops.MAX: np.maximum, Ops.MIN: np.minimum}


class InterpretError(RuntimeError):
    pass


class EvaluationTimeout(Exception):
    """evaluate() passed its deadline (checked between nodes)."""


class EvaluationCancelled(Exception):
    """evaluate() was stopped by its caller (checked between nodes)."""


def evaluate(roots: list[UOp], inputs: Mapping[str, np.ndarray] | None = None,
             deadline: float | None = None, stop: threading.Event | None = None) -> list[np.ndarray]:
    """deadline: a time.monotonic() value; past it (checked between nodes) EvaluationTimeout is raised, and
    once stop is set (a run on another thread that its caller no longer needs), EvaluationCancelled."""
    inputs = inputs or {}
    values: dict[UOp, np.ndarray] = {}
    order = toposort(roots)
    inside = step_dependent(order)  # a step graph's nodes: their STEP_LOOP evaluates them once per step
    for i, n in enumerate(order):
        if n.op is Ops.SINK or n in inside:
            continue
        if deadline is not None and time.monotonic() > deadline:
            raise EvaluationTimeout(f"the reference interpreter ran out of time after {i} nodes")
        if stop is not None and stop.is_set():
            raise EvaluationCancelled(f"the reference interpreter was stopped after {i} nodes")
        if n.op is Ops.STEP_LOOP:
            values[n] = _step_loop(n, values, inputs)
            continue
        values[n] = eval_node(n, [values[s] for s in n.src], inputs)
    return [values[r] for r in roots]


def _step_loop(n: UOp, outer: dict[UOp, np.ndarray], inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    """STEP_LOOP (ops.StepLoopArg): the step graph's nodes evaluated once per step, the outer values they
    read as they are."""
    arg = n.arg
    init = outer[n.src[0]]
    xs = [outer[s] for s in n.src[1:1 + arg.steps]]
    roots = list(n.src[1 + arg.steps:])
    step = [m for m in toposort(roots) if m not in outer]
    hist = np.empty((arg.trips + 1, *init.shape), init.dtype)
    hist[0] = init
    for t in range(arg.trips):
        local: dict[UOp, np.ndarray] = {}
        for m in step:
            if m.op is Ops.STEP_IN:
                local[m] = hist[t][m.arg.index] if m.arg.kind == "state" else xs[m.arg.index][t]
            else:
                local[m] = eval_node(m, [local[s] if s in local else outer[s] for s in m.src], inputs)
        for k, r in enumerate(roots):
            hist[t + 1][k] = local[r] if r in local else outer[r]
    return hist


def window_view(x: np.ndarray, arg: WindowArg) -> np.ndarray:
    spans = [(k - 1) * d + 1 for k, d in zip(arg.kernel, arg.dilations, strict=True)]
    v = np.lib.stride_tricks.sliding_window_view(x, spans, axis=arg.axes)
    index: list[slice] = [slice(None)] * x.ndim
    for a, s in zip(arg.axes, arg.strides, strict=True):
        index[a] = slice(None, None, s)
    index += [slice(None, None, d) for d in arg.dilations]
    return v[tuple(index)]


def _slice(x: np.ndarray, arg: SliceArg) -> np.ndarray:
    index = []
    for start, step, size in zip(arg.starts, arg.steps, arg.shape, strict=True):
        stop = start + size * step
        index.append(slice(start, stop if stop >= 0 else None, step))
    out = x[tuple(index)]
    assert out.shape == tuple(arg.shape), (out.shape, arg)
    return out


def normalize_index(idx: np.ndarray, size: int) -> np.ndarray:
    """Index values as GATHER/SCATTER read them: negative counts from the end, then clamped into
    [0, size) (out-of-range indices are undefined in ONNX; clamping keeps every access in bounds)."""
    i = idx.astype(np.int64)
    i = np.where(i < 0, i + size, i)
    return np.clip(i, 0, max(size - 1, 0))


def _indexed_positions(shape: tuple[int, ...], idx: np.ndarray, axis: int) -> tuple[np.ndarray, ...]:
    """For every position p of idx: p with axis replaced by the index value there (axes of size 1
    in `shape` broadcast: read at 0)."""
    grid = list(np.indices(idx.shape, sparse=True))
    for a, size in enumerate(shape):
        if a != axis and size == 1:
            grid[a] = np.zeros_like(grid[a])
    grid[axis] = normalize_index(idx, shape[axis])
    return tuple(np.broadcast_arrays(*grid))


def conv_reference(x: np.ndarray, w: np.ndarray, arg: ConvArg) -> np.ndarray:
    nsp = x.ndim - 2
    xp = np.pad(x, [(0, 0), (0, 0), *arg.pads])
    win = window_view(xp, WindowArg(tuple(range(2, 2 + nsp)), tuple(w.shape[2:]), arg.strides, arg.dilations))
    n, c = x.shape[:2]
    g = arg.groups
    o = w.shape[0]
    out_sp = win.shape[2:2 + nsp]
    win = win.reshape(n, g, c // g, *out_sp, *w.shape[2:])
    wg = w.reshape(g, o // g, c // g, *w.shape[2:])
    letters = "hijklm"[:nsp]
    kl = "pqrstu"[:nsp]
    out = np.einsum(f"ngc{letters}{kl},goc{kl}->ngo{letters}", win, wg, optimize=True)
    return out.reshape(n, o, *out_sp).astype(x.dtype)


def eval_node(n: UOp, srcs: list[np.ndarray], inputs: Mapping[str, np.ndarray]) -> np.ndarray:
    op, arg = n.op, n.arg
    if op is Ops.INPUT:
        assert isinstance(arg, InputArg)
        if arg.name not in inputs:
            raise InterpretError(f"no value for input {arg.name!r}")
        return np.asarray(inputs[arg.name], dtype=n.dtype.np).reshape(arg.shape)
    if op is Ops.WEIGHT:
        assert isinstance(arg, ConstData)
        return arg.array
    if op is Ops.CONST:
        return np.asarray(arg, dtype=n.dtype.np)
    if op in ALU:
        return eval_alu(op, n.dtype, srcs)
    x = srcs[0] if srcs else None
    if op is Ops.RESHAPE:
        assert isinstance(arg, ShapeArg)
        return x.reshape(arg.shape)
    if op is Ops.PERMUTE:
        assert isinstance(arg, PermuteArg)
        return np.transpose(x, arg.order)
    if op is Ops.EXPAND:
        assert isinstance(arg, ShapeArg)
        return np.broadcast_to(x, arg.shape)
    if op is Ops.PAD:
        assert isinstance(arg, PadArg)
        return np.pad(x, arg.pads, constant_values=np.asarray(arg.value, dtype=x.dtype))
    if op is Ops.SLICE:
        assert isinstance(arg, SliceArg)
        return _slice(x, arg)
    if op is Ops.WINDOW:
        assert isinstance(arg, WindowArg)
        return window_view(x, arg)
    if op is Ops.REDUCE:
        assert isinstance(arg, ReduceArg)
        if n.dtype.emulated:  # accumulate in float32 / int32 and round once, as the generated code does
            wide = widen(x)
            with np.errstate(over="ignore"):
                out = _REDUCERS[arg.op].reduce(wide, axis=arg.axes, keepdims=True, dtype=wide.dtype)
            return cast_array(np.asarray(out), n.dtype)
        with np.errstate(over="ignore"):
            out = _REDUCERS[arg.op].reduce(x, axis=arg.axes, keepdims=True, dtype=x.dtype)
        return np.asarray(out, dtype=x.dtype)
    if op is Ops.CONV:
        assert isinstance(arg, ConvArg)
        return conv_reference(x, srcs[1], arg)
    if op is Ops.MATMUL:
        return np.matmul(x, srcs[1]).astype(n.dtype.np)
    if op is Ops.SIZED:  # the values at the bound (the real shape is the value dims' prefix)
        return x
    if op is Ops.GATHER:
        assert isinstance(arg, GatherArg)
        return x[_indexed_positions(x.shape, srcs[1], arg.axis)]
    if op is Ops.SCATTER:
        assert isinstance(arg, ScatterArg)
        out = x.copy()
        where = _indexed_positions(x.shape, srcs[1], arg.axis)
        if arg.reduce is None:
            out[where] = srcs[2]  # numpy assigns in row-major order: the last of repeated indices wins
        else:
            with np.errstate(over="ignore", invalid="ignore"):
                _REDUCERS[arg.reduce].at(out, where, srcs[2])
        return out
    raise InterpretError(f"cannot interpret {op.name}")
