"""Step loops (issue 13): a recurrent layer's step graph scheduled and lowered once, its kernels run once
per step by the entry (codegen/module.py).

A STEP_LOOP (ops.StepLoopArg) is a leaf of the enclosing schedule, realized into its state history
`hist` [trips + 1, S, ...] (slot 0 the init, slot t + 1 the states after step t). Its kernels, in order:
1. the init, computed (or copied) into hist[0];
2. each step source no kernel has realized yet (a mask of constants and inputs), into a scratch of its own;
3. the loop region (Program.loops): the step graph's own schedule (plan_kernels with every node already
   in a buffer as a leaf), lowered once over *views*: STEP_IN state k reads hist[0][k], step input j reads
   x_j[0], state root k writes hist[1][k]; each view moves one slot per step (Buffer.step_stride), which
   the stepped kernels' wrappers add to their pointers (llvm_ir.render_wrapper). Every other buffer of the
   step graph is an ordinary scratch, written and read within one step.
So what is scheduled, lowered and compiled does not grow with the trip count: the step graph is one
step, the loop is one branch in the entry. The history costs (trips + 1) * S * batch * hidden elements
(two swapped state buffers would cost 2 * S * batch * hidden, but Y is a view of the history).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from svodc.ir.ops import Ops
from svodc.ir.shapes import prod
from svodc.ir.steps import step_roots
from svodc.ir.uop import UOp, toposort
from svodc.passes.buffers import Buffers
from svodc.passes.schedule import plan_kernels
from svodc.policy import OptimizationPolicy
from svodc.program import Buffer, Kernel


@dataclass(frozen=True)
class StepLowering:
    """What build_program lends: lower(root, out, copy_from, stop, known, stepped) appends the kernel that
    computes root into out (stop(n): n is read from a buffer; known: where its provenance stops); scratch(x)
    is a new scratch buffer for x; new_id() a buffer id; count() how many kernels there are."""
    lower: Callable[[UOp, Buffer, Buffer | None, Callable[[UOp], bool], set[UOp], bool], Kernel]
    scratch: Callable[[UOp], Buffer]
    new_id: Callable[[], int]
    count: Callable[[], int]


def _view(of: Buffer, shape: tuple[int, ...], offset: int, stride: int, ids: Callable[[], int]) -> Buffer:
    storage = of.storage
    return Buffer(ids(), storage.kind, storage.dtype, shape, f"{storage.name}@{offset}", slot=storage.slot,
                  view_of=storage, view_offset=of.view_offset + offset, step_stride=stride)


def _leaves(roots: tuple[UOp, ...]) -> dict[tuple[str, int], UOp]:
    """The step graph's STEP_IN leaves by (kind, index)."""
    return {(n.arg.kind, n.arg.index): n for n in toposort(list(roots)) if n.op is Ops.STEP_IN}


def lower_step_loop(loop: UOp, hist: Buffer, buffers: Buffers, policy: OptimizationPolicy,
                    lw: StepLowering) -> tuple[int, int, int]:
    """The loop's kernels (module docstring), appended through lw; returns its Program.loops entry."""
    arg = loop.arg
    init, sources, roots = loop.src[0], loop.src[1:1 + arg.steps], step_roots(loop)
    states, per = init.shape[0], prod(init.shape[1:])

    def outside(n: UOp) -> bool:
        return n.op in (Ops.INPUT, Ops.WEIGHT) or buffers.get(n) is not None

    lw.lower(init, _view(hist, init.shape, 0, 0, lw.new_id), None, outside, set(buffers.realized), False)
    leaves = _leaves(roots)
    bound: dict[UOp, Buffer] = {}
    for j, x in enumerate(sources):
        buf = buffers.get(x)
        if buf is None:
            buf = lw.scratch(x)
            lw.lower(x, buf, None, outside, set(buffers.realized), False)
        if ("step", j) in leaves:
            bound[leaves["step", j]] = _view(buf, x.shape[1:], 0, prod(x.shape[1:]), lw.new_id)
    for k in range(states):
        if ("state", k) in leaves:
            bound[leaves["state", k]] = _view(hist, init.shape[1:], k * per, states * per, lw.new_id)
    outs = {f"state{k}": _view(hist, init.shape[1:], (states + k) * per, states * per, lw.new_id)
            for k in range(states)}

    # The step graph's nodes are realized for this loop only: an identical step graph elsewhere (a layer
    # applied twice) is lowered again over its own buffers.
    saved = dict(buffers.realized)
    buffers.realized.update(bound)
    plans, realized = plan_kernels([(f"state{k}", r) for k, r in enumerate(roots)], policy,
                                   leaves=frozenset(buffers.realized))
    first = lw.count()
    written: dict[UOp, Buffer] = {}
    known = realized | set(buffers.realized)  # where a kernel's provenance stops: what it reads from buffers
    for plan in plans:
        out = outs[plan.output] if plan.output is not None else lw.scratch(plan.root)
        lw.lower(plan.root, out, written[plan.root] if plan.copy else None,
                 lambda n: n in realized or outside(n), known, True)
        if not plan.copy:
            written.setdefault(plan.root, out)
            if plan.root in realized:
                buffers.realized.setdefault(plan.root, out)
    buffers.realized.clear()
    buffers.realized.update(saved)
    assert len(roots) == states
    return first, lw.count(), arg.trips
