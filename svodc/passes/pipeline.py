"""The pass pipeline: ImportedGraph -> Program.

fold constants -> split reductions over concatenations -> decompose contractions -> fold again -> share
windowed pads -> schedule into kernels -> lower each kernel to loops -> plan memory. Each step is a named
rule set or a function of one graph; with SVOD_DEBUG >= 2 the graph after each pass is printed, with
CompileOptions.check_ir it is verified.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.pattern import PatternMatcher, UPat
from svodc.ir.provenance import Provenance
from svodc.ir.rewrite import debug_level, graph_rewrite
from svodc.ir.spec import verify
from svodc.ir.symbolic import pm_symbolic
from svodc.ir.uop import UOp, pretty
from svodc.options import PRECISIONS, CompileOptions
from svodc.passes import value_dims, winograd
from svodc.passes.branches import ALWAYS, Guard, find_branch_selects
from svodc.passes.buffers import Buffers
from svodc.passes.concat import pm_reduce_concat
from svodc.passes.contraction import conv_to_row_matmuls, pm_conv_to_matmul, pm_fold_into_conv
from svodc.passes.decompose import decompose_conv, decompose_matmul, pm_decompose
from svodc.passes.dynamic import DynamicAxes, DynamicShapeError, dims_kernel, is_constant
from svodc.passes.fold import is_folded_constant, pm_fold
from svodc.passes.lower import lower_kernel
from svodc.passes.lower_gemm import find_matmul, lower_gemm_kernel
from svodc.passes.lower_gemm_int8 import c_scratch_shape, lower_int8_gemm_kernel
from svodc.passes.lower_memo import LoweringMemo
from svodc.passes.memory import plan_arena, plan_weights
from svodc.passes.pads import share_window_pads
from svodc.passes.schedule import KernelPlan, plan_kernels
from svodc.passes.steploop import StepLowering, lower_step_loop
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy
from svodc.program import Buffer, BufferKind, ImportedGraph, Kernel, KernelGuard, Program


def _after_pass(title: str, sink: UOp, options: CompileOptions) -> None:
    if options.check_ir:
        verify(sink)
    if debug_level() >= 2:
        print(f"===== after {title} =====\n{pretty(sink)}", file=sys.stderr)


def optimize(graph: ImportedGraph, options: CompileOptions, policy: OptimizationPolicy = DEFAULT_POLICY,
             dyn: DynamicAxes | None = None) -> UOp:
    """The tensor-level graph after folding and decomposition, as a SINK of the outputs."""
    prov = graph.provenance
    sink = UOp(Ops.SINK, dtypes.void, tuple(o for _, o in graph.outputs))
    fold = pm_fold(options.fold_limit)
    _after_pass("import", sink, options)
    sink = graph_rewrite(sink, fold, prov=prov)
    _after_pass("fold", sink, options)
    sink = graph_rewrite(sink, pm_reduce_concat, prov=prov)
    _after_pass("reduce over concat", sink, options)
    sink = graph_rewrite(sink, pm_fold_into_conv + fold, prov=prov)
    _after_pass("fold into conv", sink, options)
    if dyn:
        sink = graph_rewrite(sink, _runtime_convs(dyn, policy), prov=prov)
        _after_pass("run-time convs", sink, options)
    if policy.winograd and policy.gemm and policy.conv_to_matmul and not dyn:
        sink = winograd.rewrite_graph(sink, policy, prov)
        _after_pass("winograd", sink, options)
    sink = graph_rewrite(sink, pm_conv_to_matmul(policy), prov=prov)
    _after_pass("conv to matmul", sink, options)
    if dyn:
        sink = graph_rewrite(sink, _generic_runtime_matmuls(dyn, policy), prov=prov)
        _after_pass("run-time matmuls", sink, options)
    sink = graph_rewrite(sink, pm_decompose(policy), prov=prov)
    _after_pass("decompose", sink, options)
    sink = graph_rewrite(sink, fold, prov=prov)
    _after_pass("fold after decompose", sink, options)
    sink = share_window_pads(sink, dyn is not None, prov)
    _after_pass("shared window pads", sink, options)
    return sink


def _generic_runtime_matmuls(dyn: DynamicAxes, policy: OptimizationPolicy) -> PatternMatcher:
    """MATMULs with a run-time inner batch axis, or an axis of a multiple of a dim, go to the generic path
    (MUL + REDUCE, whose loops take run-time extents); the GEMM kernels take a run-time outermost batch
    axis, M, N and K (lower_gemm.py), K only with neither operand a constant (packed at compile time). The
    integer GEMM kernels (int32 products, lower_gemm_int8.py) take no run-time extent at all: an integer
    product with any bounded axis goes to the generic path (a static kernel would read the bound's rows
    past a smaller input)."""
    def rule(n: UOp) -> UOp | None:
        *batch, m, cols = dyn.axes(n)
        k = dyn.axes(n.src[0])[-1]
        lead = batch[0] if batch else None
        runtime = (any(batch[1:]) or any(a is not None and a.factor != 1 for a in (m, cols, k, lead))
                   or (k is not None and any(is_constant(s) for s in n.src))
                   or (n.dtype is dtypes.int32 and any(a is not None for a in (*batch, m, cols, k))))
        return decompose_matmul(n, policy, force=True) if runtime else None

    return PatternMatcher([(UPat(Ops.MATMUL, name="n"), rule)], name="runtime-matmul")


def _runtime_convs(dyn: DynamicAxes, policy: OptimizationPolicy) -> PatternMatcher:
    """CONVs over a bounded spatial dim: one image's as a GEMM per output row (contraction.conv_to_row_matmuls),
    the others on the generic path (PAD -> WINDOW -> MUL -> REDUCE, whose loops take run-time extents): the
    im2col GEMM merges the output's spatial axes, which a run-time extent cannot lead."""
    def rule(n: UOp) -> UOp | None:
        if not any(dyn.axes(n.src[0])[2:]):
            return None
        rows = conv_to_row_matmuls(n, policy.gemm_min_macs) if policy.conv_to_matmul and policy.gemm else None
        return rows if rows is not None else decompose_conv(n)

    return PatternMatcher([(UPat(Ops.CONV, name="n"), rule)], name="runtime-conv")


def _kernel_name(i: int, provenance: list[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_]+", "_", provenance[0] if provenance else "copy").strip("_")[:40]
    return f"k{i}_{base}" if base else f"k{i}"


def _provenance(root: UOp, realized: set[UOp], prov: Provenance) -> list[str]:
    names: set[str] = set()
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if n in seen or is_folded_constant(n):
            continue  # constants are shared by hash-consing: their provenance is any one producer
        seen.add(n)
        names |= prov.get(n)
        stack.extend(s for s in n.src if s not in realized)
    return sorted(names)


def build_program(graph: ImportedGraph, options: CompileOptions, policy: OptimizationPolicy = DEFAULT_POLICY,
                  on_kernel: Callable[[Kernel], None] | None = None) -> Program:
    """The program for the variants that share `policy` (svodc/policy.py). on_kernel(kernel): each kernel as it
    is lowered, in program order (codegen's KernelStream starts LLVM on them), where the lowered kernels are the
    program's: with static shapes (bounded dims insert a kernel first, run-time sizes rewrite some at the end)."""
    assert pm_symbolic.memo is not None
    with pm_symbolic.memo.held():  # kernels rebuild the same index expressions: simplified once per program
        return _build_program(graph, options, policy, on_kernel)


def _build_program(graph: ImportedGraph, options: CompileOptions, policy: OptimizationPolicy,
                   on_kernel: Callable[[Kernel], None] | None) -> Program:
    sized = value_dims.register([o for _, o in graph.outputs], None)
    dyn = DynamicAxes(graph.dims, graph.input_dims, graph.provenance) if graph.dims or sized else None
    if dyn is not None:
        on_kernel = None
    if sized:
        value_dims.register([o for _, o in graph.outputs], dyn)
    sink = optimize(graph, options, policy, dyn)
    values: list = []
    if sized:  # sizes run-time values decide (Ops.SIZED): their scalars are planned as pseudo outputs
        sink, values = value_dims.strip(sink, dyn)
    outputs = list(zip([name for name, _ in graph.outputs], sink.src, strict=True))
    out_axes = [dyn.axes(x) if dyn else () for _, x in outputs]  # also checks every node up front
    nodes = sink.toposort()
    selects = find_branch_selects(nodes, graph.provenance, graph.op_types)
    plans, realized = plan_kernels(outputs + [(value_dims.PREFIX + d.name, v) for d, v in values], policy, selects,
                                   graph.provenance.realize_asked(nodes),
                                   (lambda n: any(a is not None for a in dyn.axes(n))) if dyn else None)
    value_of = {value_dims.PREFIX + d.name: d for d, _ in values}
    writers: dict[str, int] = {}  # value dim -> the kernel that computes it

    next_id = iter(range(1 << 30))
    inputs = [Buffer(next(next_id), BufferKind.INPUT, x.dtype, x.shape, name, slot=i,
                     dims=dyn.axes(x) if dyn else ()) for i, (name, x) in enumerate(graph.inputs)]
    out_bufs = [Buffer(next(next_id), BufferKind.OUTPUT, x.dtype, x.shape, name, slot=i, dims=ax)
                for i, ((name, x), ax) in enumerate(zip(outputs, out_axes, strict=True))]
    out_by_name = {b.name: b for b in out_bufs}
    buffers = Buffers(inputs, next_id)
    scratch: list[Buffer] = []
    written: dict[UOp, Buffer] = {}  # kernel root -> the buffer its kernel wrote

    kernels: list[Kernel] = []
    memo = LoweringMemo()  # loop kernels equal but for their buffers are lowered once
    loops: list[tuple[int, int, int]] = []

    def lower(root: UOp, out: Buffer, copy_from: Buffer | None, stop: Callable[[UOp], bool],
              realized: set[UOp], guard: KernelGuard = (), stepped: bool = False, in_loop: bool = False) -> Kernel:
        """The kernel that computes root into out (copies copy_from there); stop(n): n is read from a buffer."""
        prov = _provenance(root, realized, graph.provenance)
        name = _kernel_name(len(kernels), prov)
        mm = None if copy_from is not None else find_matmul(root, stop)
        if mm is not None and mm.dtype is dtypes.int32:  # the integer GEMM: its epilogue reads C from a scratch
            c_buf = out
            if root is not mm:
                c_buf = Buffer(next(next_id), BufferKind.SCRATCH, dtypes.int32, c_scratch_shape(mm), f"t{len(scratch)}")
                scratch.append(c_buf)
            ast, params = lower_int8_gemm_kernel(name, root, mm, out, c_buf, buffers, policy)
        elif mm is not None:
            ast, params = lower_gemm_kernel(name, root, mm, out, buffers, policy, dyn,
                                            getattr(dtypes, PRECISIONS[options.precision]))
        elif copy_from is None and dyn is None and not in_loop:  # bounded dims: lowering reads dyn's per-node
            # tables; a step loop's kernels read buffer views that move per step, which the memo's stand-ins lack
            ast, params = memo.lower(name, root, out, buffers, lambda n, r, o, b: lower_kernel(n, r, o, b, policy))
        else:
            ast, params = lower_kernel(name, root, out, buffers, policy, copy_from=copy_from, dyn=dyn)
        kind = "copy" if copy_from is not None else "gemm" if mm is not None else "loop"
        _after_pass(f"lowering kernel {name}", ast, options)
        kernels.append(Kernel(name, ast, params, prov, kind, guard, stepped))
        if on_kernel is not None:
            on_kernel(kernels[-1])
        return kernels[-1]

    for plan in plans:
        if plan.root.op is Ops.STEP_LOOP:  # its kernels, the step graph's run once per step (steploop.py)
            hist = _plan_output(plan, {}, scratch, next_id)
            guard = _kernel_guard(plan.guard, written)
            loops.append(lower_step_loop(plan.root, hist, buffers, policy, StepLowering(
                lambda root, out, copy_from, stop, realized, stepped, guard=guard: lower(
                    root, out, copy_from, stop, realized, guard, stepped, in_loop=True),
                lambda x: _plan_output(KernelPlan(x, None), {}, scratch, next_id), lambda: next(next_id),
                lambda: len(kernels))))
            written[plan.root] = buffers.realized[plan.root] = hist
            if plan.output in out_by_name:  # the history itself is a graph output: copied out after the loop
                lower(plan.root, out_by_name[plan.output], hist, lambda n: False, realized, guard)
            continue
        if plan.output in value_of:
            writers[value_of[plan.output].name] = len(kernels)
        out = _plan_output(plan, {} if plan.output in value_of else out_by_name, scratch, next_id)
        lower(plan.root, out, written[plan.root] if plan.copy else None,
              lambda n: n in realized or n.op in (Ops.INPUT, Ops.WEIGHT), realized, _kernel_guard(plan.guard, written))
        if not plan.copy:
            written.setdefault(plan.root, out)
            if plan.root in realized:
                buffers.realized.setdefault(plan.root, out)

    status_slot = len(dyn.dims) if dyn else 0  # the status words follow the dims (svodrt/abi.py)
    for d, _ in values:
        k = kernels[writers[d.name]]
        kernels[writers[d.name]] = dataclasses.replace(k, ast=value_dims.write_dims(k.ast, d, dyn, status_slot))
    if values:
        if loops:  # hoisting would reorder kernels out of their loops
            raise DynamicShapeError(f"{len(loops)} recurrent layers compiled as step loops in a model with sizes "
                                    "decided by run-time values: compile with CompileOptions(step_loops=False) "
                                    "(svodc compile --no-step-loops)")
        writers = value_dims.hoist(kernels, writers)
        value_dims.check_order(kernels, writers, dyn)
    if dyn and dyn.computed():  # format 1.7: the computed dims, written before any kernel reads them
        kernels.insert(0, Kernel("k_dims", dims_kernel(dyn), [], [], "dims"))
        loops = [(first + 1, end + 1, trips) for first, end, trips in loops]
    weight_list = list(buffers.weights.values())
    program = Program(inputs, out_bufs, kernels, weight_list, scratch, producer=graph.producer,
                      vocabulary=graph.vocabulary, zipmaps=graph.zipmaps,
                      edge_outputs=graph.edge_outputs, dims=tuple(dyn.dims.values()) if dyn else (), loops=loops)
    program.arena_size = plan_arena(kernels, scratch, loops)
    program.weights_size = plan_weights(weight_list)
    return program


def _kernel_guard(guard: Guard, written: dict[UOp, Buffer]) -> KernelGuard:
    """The plan's guard over the flags' buffers, in a fixed order (bundles stay reproducible)."""
    if guard == ALWAYS:
        return ()
    terms = {tuple(sorted(((written[flag], value) for flag, value in term), key=lambda t: (t[0].id, t[1])))
             for term in guard}
    return tuple(sorted(terms, key=lambda t: [(b.id, v) for b, v in t]))


def _plan_output(plan: KernelPlan, out_by_name: dict[str, Buffer], scratch: list[Buffer], ids) -> Buffer:
    if plan.output in out_by_name:
        return out_by_name[plan.output]
    b = Buffer(next(ids), BufferKind.SCRATCH, plan.root.dtype, plan.root.shape, f"t{len(scratch)}")
    scratch.append(b)
    return b
