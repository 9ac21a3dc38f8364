"""The pass pipeline: ImportedGraph -> Program.

fold constants -> decompose contractions -> fold again -> schedule into kernels -> lower each kernel
to loops -> plan memory. Each step is a named rule set or a function of one graph; with
SVOD_DEBUG >= 2 the graph after each pass is printed, with CompileOptions.check_ir it is verified.
"""

from __future__ import annotations

import re
import sys

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import Ops
from svodc.ir.provenance import Provenance
from svodc.ir.rewrite import debug_level, graph_rewrite
from svodc.ir.spec import verify
from svodc.ir.uop import UOp, pretty
from svodc.options import CompileOptions
from svodc.passes.buffers import Buffers
from svodc.passes.contraction import pm_conv_to_matmul, pm_fold_into_conv
from svodc.passes.decompose import pm_decompose
from svodc.passes.fold import is_folded_constant, pm_fold
from svodc.passes.lower import lower_kernel
from svodc.passes.lower_gemm import find_matmul, lower_gemm_kernel
from svodc.passes.memory import plan_arena, plan_weights
from svodc.passes.schedule import KernelPlan, plan_kernels
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy
from svodc.program import Buffer, BufferKind, ImportedGraph, Kernel, Program


def _after_pass(title: str, sink: UOp, options: CompileOptions) -> None:
    if options.check_ir:
        verify(sink)
    if debug_level() >= 2:
        print(f"===== after {title} =====\n{pretty(sink)}", file=sys.stderr)


def optimize(graph: ImportedGraph, options: CompileOptions, policy: OptimizationPolicy = DEFAULT_POLICY) -> UOp:
    """The tensor-level graph after folding and decomposition, as a SINK of the outputs."""
    prov = graph.provenance
    sink = UOp(Ops.SINK, dtypes.void, tuple(o for _, o in graph.outputs))
    fold = pm_fold(options.fold_limit)
    _after_pass("import", sink, options)
    sink = graph_rewrite(sink, fold, prov=prov)
    _after_pass("fold", sink, options)
    sink = graph_rewrite(sink, pm_fold_into_conv + fold, prov=prov)
    _after_pass("fold into conv", sink, options)
    sink = graph_rewrite(sink, pm_conv_to_matmul(policy), prov=prov)
    _after_pass("conv to matmul", sink, options)
    sink = graph_rewrite(sink, pm_decompose(policy), prov=prov)
    _after_pass("decompose", sink, options)
    sink = graph_rewrite(sink, fold, prov=prov)
    _after_pass("fold after decompose", sink, options)
    return sink


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


def build_program(graph: ImportedGraph, options: CompileOptions, policy: OptimizationPolicy = DEFAULT_POLICY
                  ) -> Program:
    """The program for the variants that share `policy` (svodc/policy.py)."""
    sink = optimize(graph, options, policy)
    outputs = list(zip([name for name, _ in graph.outputs], sink.src, strict=True))
    plans, realized = plan_kernels(outputs, policy)

    next_id = iter(range(1 << 30))
    inputs = [Buffer(next(next_id), BufferKind.INPUT, x.dtype, x.shape, name, slot=i)
              for i, (name, x) in enumerate(graph.inputs)]
    out_bufs = [Buffer(next(next_id), BufferKind.OUTPUT, x.dtype, x.shape, name, slot=i)
                for i, (name, x) in enumerate(outputs)]
    out_by_name = {b.name: b for b in out_bufs}
    buffers = Buffers(inputs, next_id)
    scratch: list[Buffer] = []
    written: dict[UOp, Buffer] = {}  # kernel root -> the buffer its kernel wrote

    kernels: list[Kernel] = []
    for plan in plans:
        out = _plan_output(plan, out_by_name, scratch, next_id)
        prov = _provenance(plan.root, realized, graph.provenance)
        name = _kernel_name(len(kernels), prov)
        copy_from = written[plan.root] if plan.copy else None
        mm = None if plan.copy else find_matmul(plan.root, lambda n: n in realized or n.op in (Ops.INPUT, Ops.WEIGHT))
        if mm is not None:
            ast, params = lower_gemm_kernel(name, plan.root, mm, out, buffers, policy)
        else:
            ast, params = lower_kernel(name, plan.root, out, buffers, policy, copy_from=copy_from)
        if not plan.copy:
            written.setdefault(plan.root, out)
            if plan.root in realized:
                buffers.realized.setdefault(plan.root, out)
        kind = "copy" if plan.copy else "gemm" if mm is not None else "loop"
        kernels.append(Kernel(name, ast, params, prov, kind))
        _after_pass(f"lowering kernel {name}", ast, options)

    weight_list = list(buffers.weights.values())
    program = Program(inputs, out_bufs, kernels, weight_list, scratch, producer=graph.producer,
                      vocabulary=graph.vocabulary)
    program.arena_size = plan_arena(kernels, scratch)
    program.weights_size = plan_weights(weight_list)
    return program


def _plan_output(plan: KernelPlan, out_by_name: dict[str, Buffer], scratch: list[Buffer], ids) -> Buffer:
    if plan.output is not None:
        return out_by_name[plan.output]
    b = Buffer(next(ids), BufferKind.SCRATCH, plan.root.dtype, plan.root.shape, f"t{len(scratch)}")
    scratch.append(b)
    return b
