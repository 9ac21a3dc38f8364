"""Static memory planning: scratch buffers share one arena, weights are laid out in one section.

Lifetimes come from the linear kernel order: a scratch buffer lives from the kernel that writes it
to the last kernel that reads it. Buffers are placed largest first at the lowest offset that does
not overlap a placed buffer with an overlapping lifetime (greedy by size). Offsets are aligned to
ALIGN bytes so vector loads are aligned and no two buffers share a cache line.
"""

from __future__ import annotations

from svodc.program import Buffer, Kernel

ALIGN = 64


def align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def plan_arena(kernels: list[Kernel], scratch: list[Buffer], loops: list[tuple[int, int, int]] = ()) -> int:
    """Assign buffer.offset for every scratch buffer; returns the arena size in bytes. A view lives as its
    storage. loops: Program.loops."""
    first: dict[int, int] = {}
    last: dict[int, int] = {}
    for k, kernel in enumerate(kernels):
        for b in kernel.params:
            first.setdefault(b.storage.id, k)
            last[b.storage.id] = max(k, last.get(b.storage.id, k))
    for start, end, _ in loops:
        # A buffer made before a step loop and read in it (a step source, the state history, a weight's
        # copy) is read again by every step: live to the loop's end. One the loop's kernels make is
        # remade each step before it is read, so its range inside one step holds for every step.
        for b in {b.storage.id for kernel in kernels[start:end] for b in kernel.params}:
            if first[b] < start:
                last[b] = max(last[b], end - 1)
        for flag in (flag for term in kernel.guard for flag, _ in term):
            # a branch flag lives to the end: a thread the OS held back reads it when it reaches the kernel
            # it guards, maybe after faster threads have run every later kernel (codegen/module.py)
            last[flag.id] = len(kernels)
    placed: list[tuple[int, int, int, int]] = []  # (offset, end, first, last)
    size = 0
    order = sorted(scratch, key=lambda b: (-b.nbytes, first.get(b.id, 0), b.id))
    for b in order:
        lo, hi = first.get(b.id, 0), last.get(b.id, 0)
        need = max(align(b.nbytes), ALIGN)
        conflicts = sorted((o, e) for o, e, f, l in placed if not (l < lo or hi < f))
        offset = 0
        for o, e in conflicts:
            if offset + need <= o:
                break
            offset = max(offset, align(e))
        b.offset = offset
        placed.append((offset, offset + need, lo, hi))
        size = max(size, offset + need)
    return size


def plan_weights(weights: list[Buffer]) -> int:
    """Lay weights out back to back, aligned; returns the section size."""
    offset = 0
    for b in weights:
        b.offset = offset
        offset = align(offset + max(b.nbytes, 1))
    return offset
