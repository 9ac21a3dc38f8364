"""Scheduling: decide which tensors are realized in memory, and cut the graph into kernels.

Everything not realized is fused into the kernels that consume it (movement ops become index
arithmetic, elementwise chains are recomputed in place). A compute node is realized when:
- it is a graph output;
- it contains an unrealized REDUCE and is reused element by element by a consumer (EXPAND, PAD,
  WINDOW: a broadcast or overlapping windows would recompute the reduction per use), or feeds
  another REDUCE, or has several consumers;
- it is an expensive elementwise chain (more than a few ops per element; a math function counts as
  its polynomial) that a consumer reuses, or that feeds a REDUCE and other consumers too (a
  normalization's input: each kernel after the reduction would recompute it), or a GATHER that a
  consumer reuses;
- its fused subgraph would grow past the policy's max_fused_ops (keeps kernels and compile time bounded);
- it is a SCATTER (always a kernel of its own: copy, then serial updates; see lower.py);
- the frontend asked for it (NodeContext.realize: a recurrent layer's state after each step, which
  every later step reads; fused, step t would recompute it from the first step on);
- (not) it is inside a softmax along trailing axes: its reductions are computed row by row in the
  softmax output's kernel (passes/rows.py);
- it is a STEP_LOOP (its step graph is scheduled on its own: passes/steploop.py; here the loop is a leaf
  that reads its init and step sources).
GATHER reads its source at run-time positions, so for the rules above it reuses elements like EXPAND.
Realizing a movement op realizes its source instead: views of a buffer cost nothing. A PAD that windows
read is realized (a padded copy) and reads each element of its source once: one such copy is no reuse, so
what it reads is computed in the copy's kernel (two copies of one node are reuse). Except (policy
fuse_window_pads): strided windows of a buffer into small written-out REDUCEs read the padding in place
(_windows_into_unrolled).

A MATMUL is the core of a contraction kernel. Its epilogue is the chain of single-consumer ALU ops
and reshapes above it that keep its memory layout (float32 throughout; for an integer GEMM any types,
up to and including the first cast to 8 bits: the requantized output); the top of that chain is
realized and the GEMM writes straight into it. Its operands must be affine views of buffers (or
constants, which are packed at compile time); a computed operand is realized, and a view that is not
affine (im2col of a padded input) or whose columns are not contiguous (B) is realized as a copy.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import ALU, MATH_UNARY, MOVEMENT, Ops
from svodc.ir.steps import outer_src, outer_toposort
from svodc.ir.uop import UOp
from svodc.passes.branches import ALWAYS, Guard, branch_roots, guards, order_for_guards
from svodc.passes.lower import unrolls_reduce
from svodc.passes.lower_gemm_int8 import BYTE_TYPES, int8_activation, int8_gemm_shape
from svodc.passes.rows import row_fused
from svodc.passes.views import affine_view
from svodc.policy import DEFAULT_POLICY, OptimizationPolicy

_REUSE = frozenset({Ops.EXPAND, Ops.PAD, Ops.WINDOW})
_VIEW_THROUGH = frozenset({Ops.RESHAPE, Ops.PERMUTE, Ops.SLICE})


@dataclass
class KernelPlan:
    root: UOp  # the tensor this kernel computes
    output: str | None  # graph output name written by this kernel, or None for a scratch buffer
    copy: bool = False  # the root is already realized elsewhere: this kernel only copies it
    guard: Guard = ALWAYS  # when the kernel must run (passes/branches.py)


def _reuse_consumers(n: UOp, consumers: dict[UOp, list[UOp]], copies: set[UOp]) -> tuple[bool, bool, int]:
    """(some consumer reuses elements, some consumer is a REDUCE, how many consumers), looking through pure
    views. A padded copy for windows (`copies`) reads each element once (the windows reuse the copy, not its
    source): only a second copy of the same node is reuse."""
    reuse = reduce_ = False
    count = 0
    stack, read_by_copies = [n], 0
    while stack:
        x = stack.pop()
        for c in consumers[x]:
            if c.op in _VIEW_THROUGH:
                stack.append(c)
                continue
            count += 1
            if c in copies:
                read_by_copies += 1
                reuse |= read_by_copies > 1
            elif c.op in _REUSE or (c.op is Ops.GATHER and c.src[0] is x):
                reuse = True
            elif c.op is Ops.REDUCE:
                reduce_ = True
    return reuse, reduce_, count


# Rewritten into polynomials (transcendental.py; POW too, but for small integer exponents).
_POLYNOMIAL = (MATH_UNARY - {Ops.ROUND, Ops.TRUNC, Ops.FLOOR}) | {Ops.POW}


# Nodes that are buffers before any kernel runs (a STEP_IN: a view the step loop binds).
_SOURCES = frozenset({Ops.INPUT, Ops.WEIGHT, Ops.CONST, Ops.STEP_IN})


def _base(n: UOp, copies: set[UOp]) -> UOp:
    while n.op in MOVEMENT and n not in copies:
        n = n.src[0]
    return n


def _plan_matmuls(nodes: list[UOp], consumers: dict[UOp, list[UOp]], output_roots: set[UOp],
                  copies: set[UOp], leaves: frozenset[UOp]) -> tuple[set[UOp], set[UOp]]:
    """(nodes that must be realized, nodes fused into a GEMM epilogue). An operand's base is the buffer it views:
    a padded copy for windows (`copies`, realized anyway) or the first non-movement node below it."""
    forced: set[UOp] = set()
    claimed: set[UOp] = set()
    for mm in nodes:
        if mm.op is not Ops.MATMUL:
            continue
        int8 = int8_gemm_shape(mm)  # its B is an 8-bit view read in place (the kernel packs any strides)
        for role, x in (("a", mm.src[0]), ("b", mm.src[1])):
            if int8 and role == "b":
                x = int8_activation(x).value
            base = _base(x, copies)
            if base.op in (Ops.WEIGHT, Ops.CONST):
                continue  # packed at compile time
            if base.op not in (Ops.INPUT, Ops.STEP_IN) and base not in leaves:
                forced.add(base)
            view = affine_view(x, lambda n, base=base: n is base)
            if view is None or (role == "b" and not int8 and view.strides[-1] != 1 and x.shape[-1] > 1):
                forced.add(x)
        top = mm
        while top not in output_roots and len(consumers[top]) == 1:
            c = consumers[top][0]
            if (c.op not in ALU and c.op is not Ops.RESHAPE) or c in claimed:
                break
            if not (c.dtype is dtypes.float32 or int8):
                break
            claimed.add(c)
            top = c
            if int8 and top.dtype in BYTE_TYPES:
                break  # requantized: the next integer GEMM reads these bytes in place
        forced.add(top)
    return forced, claimed - forced


def _window_copies(nodes: list[UOp], consumers: dict[UOp, list[UOp]]) -> set[UOp]:
    """PADs that windows (convolution, pooling) read: each is realized, a padded copy, so every tap is then in
    bounds and the kernels index it without clamps or selects and vectorize."""
    def windowed(n: UOp) -> bool:  # through slices: pads.py shares one copy among windows of different pads
        return any(c.op is Ops.WINDOW or (c.op is Ops.SLICE and windowed(c)) for c in consumers[n])

    return {n for n in nodes if n.op is Ops.PAD and windowed(n) and any(b or a for b, a in n.arg.pads)
            and n.src[0].op is not Ops.CONST}


def _windows_into_unrolled(pad: UOp, consumers: dict[UOp, list[UOp]], policy: OptimizationPolicy,
                           realized: set[UOp], copies: set[UOp]) -> bool:
    """The padded tensor is a view of a buffer and every use of it is a strided window whose taps a small
    REDUCE sums (a depthwise convolution, a pooling window: written out term by term, passes/lower.py).
    Such a kernel reads the padding in place: split.py cuts its output loops where taps leave the
    tensor, so the interior has neither clamps nor selects, and no padded copy is written and read
    again. (A computed source stays behind a padded copy: each tap would recompute it.)"""
    base = _base(pad.src[0], copies)
    if base not in realized and base.op is not Ops.INPUT:
        return False
    stack, seen = [pad], set()
    while stack:
        x = stack.pop()
        for c in consumers[x]:
            if c in seen:
                continue
            seen.add(c)
            if c.op is Ops.WINDOW and all(st == 1 for st in c.arg.strides):
                # Stride 1: the padded copy is about the size of the output, and the kernel over it runs
                # whole rows (no border pieces, no scalar remainders): the copy measured as fast.
                return False
            if c.op is Ops.REDUCE:
                if not unrolls_reduce(c, policy):  # (run-time extents: the caller has ruled them out)
                    return False
            elif c.op in MOVEMENT or c.op in (Ops.MUL, Ops.CAST):
                if not consumers[c]:
                    return False  # a graph output
                stack.append(c)
            else:
                return False
    return True


def plan_kernels(outputs: list[tuple[str, UOp]], policy: OptimizationPolicy = DEFAULT_POLICY,
                 selects: dict[UOp, UOp] | None = None, asked: set[UOp] | None = None,
                 runtime_sized: Callable[[UOp], bool] | None = None, leaves: frozenset[UOp] = frozenset()
                 ) -> tuple[list[KernelPlan], set[UOp]]:
    """The kernels in execution order, and the set of realized nodes (kernel roots). selects: the
    run-time branch selects and their flags (passes/branches.py), whose sides get guarded kernels.
    asked: nodes the frontend asked to realize (those that are views or sources need no kernel).
    runtime_sized(n): n has an axis sized at run time (passes/dynamic.py). leaves: nodes already in buffers
    (a step graph's schedule: what the kernels before its loop realized), read as they are."""
    roots = [o for _, o in outputs]
    nodes = outer_toposort(roots, leaves)
    consumers: dict[UOp, list[UOp]] = defaultdict(list)
    for n in nodes:
        for s in dict.fromkeys(() if n in leaves else outer_src(n)):
            consumers[s].append(n)
    output_roots = set(roots)
    copies = _window_copies(nodes, consumers)
    forced, epilogue = _plan_matmuls(nodes, consumers, output_roots, copies, leaves)
    if selects:
        branch_forced = branch_roots(selects)
        forced |= branch_forced
        epilogue -= branch_forced
    if asked:
        asked_compute = {n for n in asked if n.op in ALU}
        forced |= asked_compute
        epilogue -= asked_compute
    # A softmax along trailing axes: one kernel over its output, row by row (passes/rows.py)
    row_members, row_roots = row_fused(nodes, consumers, policy, forced | epilogue | output_roots)
    forced |= row_roots
    epilogue -= row_roots
    realized: set[UOp] = set()
    has_reduce: dict[UOp, bool] = {}
    fused_ops: dict[UOp, int] = {}  # ALU and REDUCE nodes fused into n (bounded by max_fused_ops)
    fused_cost: dict[UOp, int] = {}  # the same, a math function counted as its polynomial (cheap_to_repeat)

    def state(s: UOp) -> tuple[bool, int, int]:
        if s in realized or s.op in _SOURCES or s in leaves:
            return False, 0, 0
        return has_reduce[s], fused_ops[s], fused_cost[s]

    for n in nodes:
        if n.op in _SOURCES or n in leaves:
            continue
        if n in copies and not (policy.fuse_window_pads and not (runtime_sized and runtime_sized(n))
                                and _windows_into_unrolled(n, consumers, policy, realized, copies)):
            # Windows over a padded tensor (convolution, pooling) read a padded copy: every tap is then
            # in bounds, so the kernels index it without clamps or selects and vectorize. (Over a run-time
            # extent split.py cannot cut the borders off, so those read a copy too.)
            realized.add(n)
        srcs = [state(s) for s in outer_src(n)]
        hr = n.op in (Ops.REDUCE, Ops.MATMUL) or any(h for h, _, _ in srcs)
        own = 1 if n.op in ALU or n.op is Ops.REDUCE else 0
        ops = own + sum(k for _, k, _ in srcs)
        cost = (policy.math_op_cost if n.op in _POLYNOMIAL else own) + sum(c for _, _, c in srcs)
        has_reduce[n], fused_ops[n], fused_cost[n] = hr, ops, cost
        if n.op in (Ops.SCATTER, Ops.STEP_LOOP):
            realized.add(n)
            continue
        if n in forced:
            realized.add(n)
            continue
        if n in row_members:
            continue
        if n in epilogue or (n.op not in ALU and n.op not in (Ops.REDUCE, Ops.GATHER)):
            continue
        reuse, into_reduce, uses = _reuse_consumers(n, consumers, copies)
        many = len(consumers[n]) > 1
        if n.op is Ops.GATHER:
            # a gathered element costs an index load, wrap and clamp: a consumer that reuses elements
            # (a convolution's windows over a reflection pad done by Gather) reads a copy instead
            if reuse:
                realized.add(n)
            continue
        recomputed = reuse or (into_reduce and uses > 1)
        if (n in output_roots or (hr and (reuse or into_reduce or many))
                or (recomputed and cost > policy.cheap_to_repeat) or ops > policy.max_fused_ops):
            realized.add(n)
    plans: list[KernelPlan] = []
    names_by_root: dict[UOp, str] = {}
    for name, root in outputs:
        if root in names_by_root:
            continue
        names_by_root[root] = name
    done_outputs: set[str] = set()
    order = [n for n in nodes if n in realized]
    guard_of: dict[UOp, Guard] = {}
    if selects:
        guard_of = guards(nodes, roots, selects)
        reordered = order_for_guards(order, guard_of)
        order, guard_of = (order, {}) if reordered is None else (reordered, guard_of)
    for n in order:
        out = names_by_root.get(n)
        plans.append(KernelPlan(n, out, guard=guard_of.get(n, ALWAYS)))
        if out is not None:
            done_outputs.add(out)
    # Outputs that are views, inputs or constants, or that repeat another output, get a kernel of
    # their own that computes (or copies) them into the output buffer.
    for name, root in outputs:
        if name in done_outputs:
            continue
        first = names_by_root[root]
        plans.append(KernelPlan(root, name, copy=first != name))
        done_outputs.add(name)
    return plans, realized
