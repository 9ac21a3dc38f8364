"""Control flow: If, Loop, Scan, by importing their subgraphs at compile time.

- If: a condition known at compile time picks its branch; otherwise both branches are imported and
  each output is a select (which needs both branches to give one shape and type per output).
- Loop and Scan are unrolled: the body is imported once per iteration with that iteration's values.
  Scan's length and a Loop's scan outputs must be known at compile time; a Loop whose trip count or
  condition is known only at run time is unrolled to a bound (CompileOptions.loop_bounds) with each
  iteration's update a run-time branch, skipped when the iteration does not run.
- A run-time If and those loop updates are selects that passes/branches.py recognizes by the If or
  Loop node that made them: only the taken side's kernels run.
Subgraphs read outer values through the importer's nested scopes.
"""

from __future__ import annotations

import numpy as np

from svodc.frontend.context import NeedsConstant, NodeContext, Unsupported, constant_value, is_constant
from svodc.frontend.ops.shape_ops import weight
from svodc.frontend.registry import onnx_op
from svodc.frontend.values import OptionalValue, SequenceValue, Value, describe
from svodc.ir import tensor as T
from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.uop import UOp, toposort

MAX_UNROLL = 4096  # iterations; a bound on compile time and code size


def _graph_inputs(x: UOp) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.arg.name for n in toposort([x]) if n.op is Ops.INPUT))


def select(cond: UOp, a: Value | None, b: Value | None, what: str) -> Value | None:
    """cond ? a : b for values of one structure (a scalar bool tensor condition)."""
    if isinstance(a, UOp) and isinstance(b, UOp):
        if a.shape != b.shape or a.dtype != b.dtype:
            raise NeedsConstant(f"{what}: the branches give {describe(a)} and {describe(b)}; with different shapes "
                                "the condition must be known at compile time", _graph_inputs(cond))
        return T.alu(Ops.WHERE, T.broadcast_to(cond, a.shape), a, b)
    if isinstance(a, SequenceValue) and isinstance(b, SequenceValue) and len(a) == len(b):
        return SequenceValue(tuple(select(cond, x, y, what) for x, y in zip(a.items, b.items, strict=True)), a.dtype)
    if isinstance(a, OptionalValue) and isinstance(b, OptionalValue) and a.has_element == b.has_element:
        return OptionalValue(select(cond, a.value, b.value, what) if a.has_element else None)
    raise NeedsConstant(f"{what}: the branches give {describe(a)} and {describe(b)}; the condition must be known "
                        "at compile time", _graph_inputs(cond))


def _scalar_bool(x: UOp) -> UOp:
    return T.reshape(x.cast(dtypes.bool), ())


@onnx_op("If", 1, 11, 13, 16, 19, 21, 23, 24, 25)
def if_(ctx: NodeContext) -> list[Value | None]:
    cond = _scalar_bool(ctx.input(0))
    then_g, else_g = ctx.subgraph("then_branch"), ctx.subgraph("else_branch")
    if is_constant(cond):
        return ctx.run_subgraph(then_g if bool(constant_value(cond)) else else_g, [])
    branches = []
    for name, g in (("then", then_g), ("else", else_g)):
        try:
            branches.append(ctx.run_subgraph(g, []))
        except Unsupported as e:  # e.g. a branch that is invalid for these input shapes (it fails in ORT too)
            needs = tuple(dict.fromkeys(_graph_inputs(cond) + tuple(n for p in getattr(e, "problems", ())
                                                                    for n in p.needs_values)))
            fix = " ".join(f"--input-value {n}=FILE.npy" for n in needs) or "--input-value"
            raise NeedsConstant(f"the condition depends on run-time values{f' ({list(needs)})' if needs else ''}, so "
                                f"both branches are compiled, and the {name} branch cannot be: {e}. With the "
                                f"condition known at compile time only the branch it takes is compiled: {fix}",
                                needs) from e
    a, b = branches
    return [select(cond, x, y, f"output {i}") for i, (x, y) in enumerate(zip(a, b, strict=True))]


def _stack(items: list[UOp], axis: int = 0) -> UOp:
    parts = [T.reshape(v, v.shape[:axis] + (1,) + v.shape[axis:]) for v in items]
    return T.concat(parts, axis)


def _loop_bound(ctx: NodeContext, why: str, inputs: tuple[str, ...]) -> int:
    """The most iterations of a loop whose count is known only at run time: CompileOptions.loop_bounds."""
    if ctx.name in ctx.loop_bounds:
        return ctx.loop_bounds[ctx.name]
    raise NeedsConstant(f"{why}: give the most iterations it can run with --loop-bound {ctx.name}=N (it runs "
                        "the call's count up to N), or fix the inputs it depends on with --input-value", inputs)


@onnx_op("Loop", 1, 11, 13, 16, 19, 21, 23, 24, 25)
def loop(ctx: NodeContext) -> list[Value | None]:
    """Unrolled. A run-time trip count or condition needs a bound (`_loop_bound`): the body is imported
    that many times, and iteration i's carried values are select(live_i, body, previous) with live_i a
    run-time flag, so passes/branches.py skips the body's kernels in the iterations that do not run."""
    body = ctx.subgraph("body")
    trip = ctx.optional_input(0)
    run_time_trips = None if trip is None or is_constant(trip) else T.reshape(trip.cast(dtypes.int64), ())
    cond_in = ctx.optional_input(1)
    carried: list[Value | None] = [ctx.value(i) for i in range(2, len(ctx.inputs))]
    n_carried = len(carried)
    n_scan = len(body.output) - 1 - n_carried
    cond = None if cond_in is None else _scalar_bool(cond_in)
    runtime_cond = cond is not None and not is_constant(cond)
    if run_time_trips is not None or (trip is None and runtime_cond):
        why = ("the trip count depends on run-time values" if run_time_trips is not None
               else "the loop condition depends on run-time values and there is no trip count")
        inputs = _graph_inputs(run_time_trips if run_time_trips is not None else cond)
        if n_scan:
            raise NeedsConstant(f"{why}, so its {n_scan} scan output(s) would have a run-time length", inputs)
        max_trips = _loop_bound(ctx, why, inputs)
    else:
        max_trips = None if trip is None else int(np.asarray(ctx.const_input(0, "M (trip count)")).reshape(-1)[0])
    live: UOp | None = None  # whether this iteration runs, when only known at run time (None: it does)
    scans: list[list[Value]] = [[] for _ in range(n_scan)]
    i = 0
    while max_trips is None or i < max_trips:
        if cond is not None and is_constant(cond):
            if not bool(constant_value(cond)):
                break
        elif cond is not None and n_scan:
            raise NeedsConstant("the loop condition depends on run-time values: the length of its scan outputs "
                                "would not be known at compile time", _graph_inputs(cond))
        if i >= MAX_UNROLL:
            raise Unsupported(f"the loop runs more than {MAX_UNROLL} iterations (unrolled at compile time)")
        it = weight(np.array(i, dtype=np.int64))
        step = [c for c in (None if cond is None or is_constant(cond) else cond,
                            None if run_time_trips is None else T.alu(Ops.CMPLT, it, run_time_trips)) if c is not None]
        if step:
            now = step[0] if len(step) == 1 else T.alu(Ops.AND, *step)
            # a select (a branch flag): the body's condition is computed only in iterations that run
            live = now if live is None else T.alu(Ops.WHERE, live, now, T.const(False, dtypes.bool))
        cond_value = cond if cond is not None else T.const(True, dtypes.bool)
        outs = ctx.run_subgraph(body, [it, cond_value, *carried])
        new = outs[1:1 + n_carried]
        carried = new if live is None else [select(live, n, o, "a loop-carried value")
                                            for n, o in zip(new, carried, strict=True)]
        for k in range(n_scan):
            scans[k].append(outs[1 + n_carried + k])
        cond_out = outs[0]
        cond = None if cond_out is None else _scalar_bool(cond_out)
        i += 1
    results: list[Value | None] = list(carried)
    for k, items in enumerate(scans):
        if not items:
            raise Unsupported(f"scan output {k} of a loop that runs no iteration has no known shape")
        if all(isinstance(v, UOp) for v in items):
            if len({v.shape for v in items}) > 1:
                raise Unsupported(f"scan output {k} changes shape between iterations")
            results.append(_stack(items))
        else:
            raise Unsupported(f"scan output {k} is {describe(items[0])}: only tensors can be stacked")
    return results


@onnx_op("Scan", 8, 9, 11, 16, 19, 21, 23, 24, 25)
def scan(ctx: NodeContext) -> list[UOp]:
    body = ctx.subgraph("body")
    n_scan_in = int(ctx.attr("num_scan_inputs"))
    first = 1 if ctx.version == 8 else 0  # Scan-8: input 0 is sequence_lens, and axis 0 is a batch axis
    values = [ctx.input(i) for i in range(first, len(ctx.inputs))]
    n_state = len(values) - n_scan_in
    states, xs = values[:n_state], values[n_state:]
    n_out = len(body.output) - n_state
    if ctx.version == 8:
        if ctx.optional_input(0) is not None:
            lens = np.asarray(ctx.const_input(0, "sequence_lens"))
            if xs and (lens != xs[0].shape[1]).any():
                raise Unsupported("sequence_lens shorter than the scan axis are not supported")
        directions = ctx.ints("directions", [0] * n_scan_in)
        batch = states[0].shape[0] if states else xs[0].shape[0]
        per_batch = [_scan_once(ctx, body, [_index(s, 0, b) for s in states], [_index(x, 0, b) for x in xs],
                                [0] * n_scan_in, directions, [0] * n_out, [0] * n_out) for b in range(batch)]
        return [_stack([r[k] for r in per_batch]) for k in range(n_state + n_out)]
    in_axes = [T.norm_axis(a, x.ndim) for a, x in zip(ctx.ints("scan_input_axes", [0] * n_scan_in), xs,
                                                         strict=True)]
    in_dirs = ctx.ints("scan_input_directions", [0] * n_scan_in)
    out_axes = ctx.ints("scan_output_axes", [0] * n_out)
    out_dirs = ctx.ints("scan_output_directions", [0] * n_out)
    return _scan_once(ctx, body, states, xs, in_axes, in_dirs, out_axes, out_dirs)


def _index(x: UOp, axis: int, i: int) -> UOp:
    bounds = [(0, d) for d in x.shape]
    bounds[axis] = (i, i + 1)
    return T.reshape(T.shrink(x, bounds), x.shape[:axis] + x.shape[axis + 1:])


def _scan_once(ctx: NodeContext, body, states: list[UOp], xs: list[UOp], in_axes, in_dirs, out_axes,
               out_dirs) -> list[UOp]:
    if not xs:
        raise Unsupported("Scan without scan inputs has no iteration count")
    n = xs[0].shape[in_axes[0]]
    if any(x.shape[a] != n for x, a in zip(xs, in_axes, strict=True)):
        raise Unsupported("scan inputs differ in length along their scan axes")
    if n > MAX_UNROLL:
        raise Unsupported(f"the scan runs {n} iterations, more than {MAX_UNROLL} (unrolled at compile time)")
    outs: list[list[UOp]] = []
    for t in range(n):
        slices = [_index(x, a, n - 1 - t if d else t) for x, a, d in zip(xs, in_axes, in_dirs, strict=True)]
        res = ctx.run_subgraph(body, [*states, *slices])
        states = res[:len(states)]
        outs.append(res[len(states):])
    stacked = []
    for k in range(len(out_axes)):
        items = [o[k] for o in outs]
        if out_dirs[k]:
            items.reverse()
        axis = T.norm_axis(out_axes[k], items[0].ndim + 1)
        stacked.append(_stack(items, axis))
    return [*states, *stacked]
