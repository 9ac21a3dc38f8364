"""Kernels equal but for a few constants, compiled as one body (issue 13).

A recurrent layer unrolled over its sequence makes one kernel per step, and the steps' kernels differ
only in (a) where in a buffer they read and write (step t reads x[t]: the index is `rest + t * stride`)
and (b) the step index compared with the run-time sequence lengths (`t < lens[b]`). A kernel's
*template* takes both out of its body:

- index constants: for a buffer parameter read and written only through LOAD/STORE indices
  `rest_i + c_i` with every `rest_i >= 0`, m = min c_i moves into the parameter's pointer (the
  kernel's wrapper adds m elements to the buffer's offset) and the body indexes `rest_i + (c_i - m)`.
  The addresses are the same; the moved pointer is at or before every address the kernel touches
  (rest_i >= 0, c_i >= m) and not before the buffer (m > 0), so it stays inside the buffer.
- compared constants: an integer constant compared with a value computed from data the kernel reads
  (a sequence length) becomes a body argument (`body_arg`) that the wrapper passes. Index arithmetic (loop
  bounds, pad masks) compares no loaded value, so the body's loops and masks compile as before.

Kernels whose templates render alike share one body (module.py). A kernel whose template matches no
other kernel's keeps its own rendering, so a model without such kernels compiles to the same code as
before. GEMM kernels are left alone: their operands are addressed through the GemmArg and their
epilogues match indices by identity (llvm_gemm_epilogue.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from svodc.ir.dtypes import dtypes
from svodc.ir.ops import COMPARE, Ops, VarArg
from svodc.ir.shapes import prod
from svodc.ir.uop import UOp, toposort
from svodc.program import Kernel

# A lifted constant in a template's AST: DEFINE_VAR slot -1 - j is the body's argument %k<j> (the entry's
# bounded dims have slots >= 0). Its bounds are any int64's: the same for every kernel sharing the body.
ARG_LO, ARG_HI = -(1 << 63), (1 << 63) - 1


def body_arg(dtype, j: int) -> UOp:
    return UOp(Ops.DEFINE_VAR, dtype, (), VarArg(f"k{j}", ARG_LO, ARG_HI, -1 - j))


def body_arg_index(n: UOp) -> int | None:
    """j for the body argument %k<j>, None for any other node."""
    return -1 - n.arg.slot if n.op is Ops.DEFINE_VAR and n.arg.slot < 0 else None


@dataclass(frozen=True)
class Template:
    """A kernel as a shared body sees it: `ast` (indices shifted, lifted constants replaced by body
    arguments), `shifts` (elements the kernel's wrapper adds to each parameter's pointer) and `values`
    (the constant the wrapper passes as each body argument). Kernels with equal templates share a body;
    a template's AST is interned, so equal templates are one object."""
    ast: UOp
    shifts: tuple[int, ...]
    values: tuple[UOp, ...] = ()

    @property
    def changed(self) -> bool:
        return bool(self.values) or any(self.shifts)


def _terms(idx: UOp) -> tuple[list[UOp], int]:
    """idx as (non-constant terms of its top-level sum, in order; the sum of its constant terms)."""
    terms, c, stack = [], 0, [idx]
    while stack:
        n = stack.pop()
        if n.op is Ops.ADD and n.dtype is dtypes.index:
            stack.extend(reversed(n.src))
        elif n.op is Ops.CONST:
            c += n.arg
        else:
            terms.append(n)
    return terms, c


def _sum(terms: list[UOp], c: int) -> UOp:
    acc = terms[0] if terms else UOp.const(dtypes.index, c)
    for t in terms[1:]:
        acc = acc + t
    return acc + c if terms and c else acc


def _index_shifts(kernel: Kernel, nodes: list[UOp]) -> dict[int, int]:
    """Per parameter index, the elements its accesses' constants can move into its pointer."""
    accesses: dict[int, list[tuple[list[UOp], int]]] = {}
    other_uses: set[int] = set()
    for n in nodes:
        for pos, s in enumerate(n.src):
            if s.op is Ops.PARAM and not (n.op in (Ops.LOAD, Ops.STORE) and pos == 0):
                other_uses.add(s.arg.index)
        if n.op in (Ops.LOAD, Ops.STORE) and n.src[0].op is Ops.PARAM and n.src[1].dtype is dtypes.index:
            accesses.setdefault(n.src[0].arg.index, []).append(_terms(n.src[1]))
    shifts = {}
    for p, acc in accesses.items():
        m = min(c for _, c in acc)
        if p in other_uses or m <= 0 or m >= prod(kernel.params[p].shape):
            continue
        if all(t.vmin >= 0 for terms, _ in acc for t in terms):  # each term >= 0: so is their sum
            shifts[p] = m
    return shifts


def _loaded(nodes: list[UOp]) -> set[UOp]:
    """The nodes whose value depends on data the kernel reads (some LOAD reaches them)."""
    out: set[UOp] = set()
    for n in nodes:
        if n.op is Ops.LOAD or any(s in out for s in n.src):
            out.add(n)
    return out


def template(kernel: Kernel) -> Template:
    """One bottom-up pass: each node is rebuilt from its already-rebuilt sources, then its own index shifted
    or its compared constant lifted, so a change below a changed node is kept (a STORE of a shifted LOAD, a
    LOAD indexed by a shifted LOAD, a compare of a value holding a lifted compare)."""
    nodes = toposort([kernel.ast])
    if any(n.op is Ops.GEMM for n in nodes):
        return Template(kernel.ast, (0,) * len(kernel.params))
    shifts = _index_shifts(kernel, nodes)
    loaded = _loaded(nodes)
    new: dict[UOp, UOp] = {}
    values: list[UOp] = []
    for n in nodes:
        src = tuple(new.get(s, s) for s in n.src)
        if n.op in (Ops.LOAD, Ops.STORE) and n.src[0].op is Ops.PARAM and n.src[0].arg.index in shifts:
            terms, c = _terms(src[1])  # the top-level constant: rebuilding inside a term leaves it as it was
            src = (src[0], _sum(terms, c - shifts[n.src[0].arg.index]), *src[2:])
        elif n.op in COMPARE and not (n.src[0].dtype.is_float or n.src[0].dtype is dtypes.bool):
            for pos, (s, o) in enumerate((n.src, n.src[::-1])):
                if s.op is Ops.CONST and o in loaded:
                    arg = body_arg(s.dtype, len(values))
                    values.append(s)
                    src = (arg, src[1]) if pos == 0 else (src[0], arg)
                    break
        if any(a is not b for a, b in zip(src, n.src, strict=True)):
            new[n] = n.replace(src=src)
    ast = new.get(nodes[-1], nodes[-1])
    if values:  # the wrapper passes one value per body argument: the body must declare each, in order
        declared = sorted(j for n in toposort([ast]) if (j := body_arg_index(n)) is not None)
        assert declared == list(range(len(values))), (declared, len(values))
    return Template(ast, tuple(shifts.get(i, 0) for i in range(len(kernel.params))), tuple(values))
