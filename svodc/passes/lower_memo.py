"""Loop kernels lowered once per structure within one program (issue 13, compile time).

Lowering a loop kernel (lower.py) is a function of the kernel's subgraph up to the buffers it reads, of
those buffers' shapes and dtypes, and of the output buffer's: never of the buffers' identity or data.
Repeated blocks (ResNet-50's bottlenecks, Inception's towers) have many kernels equal but for the buffers
they read. So each kernel's subgraph is first made *canonical*: every node read from a buffer becomes a
placeholder numbered by first encounter (with the node's and the buffer's shape), which hash-consing turns
into one node per structure. The canonical graph is lowered once, over stand-in buffers; each kernel of
that structure gets the canonical loop AST with its own PARAMs and name put in.

Invariant: the result is the AST and parameter list that lowering the kernel itself gives, node for node
(tests/test_lower_memo.py compares them), and the program's buffers see the same `get` calls in the same
order (weights get their buffers, and so their ids and layout, in first-use order: reproducible bundles).
"""

from __future__ import annotations

import dataclasses

from svodc.ir.ops import InputArg, Ops, ParamArg
from svodc.ir.uop import UOp
from svodc.passes.buffers import Buffers
from svodc.program import Buffer, BufferKind

# Placeholder inputs carry this prefix in their InputArg name; no ONNX input name starts with a NUL.
_PLACEHOLDER = "\0buf"
_OUT = "\0out"  # the stand-in output buffer's name


class _StandIns(Buffers):
    """The canonical graph's buffers: placeholder j reads stand-in buffer j. Records the order of the
    placeholders `get` was asked for, which the program's Buffers then replays on the real nodes."""

    def __init__(self, stand_ins: dict[str, Buffer]):
        self._by_name = stand_ins
        self.asked: list[str] = []
        self.weights, self.realized = {}, {}

    def get(self, n: UOp) -> Buffer | None:
        if n.op is Ops.INPUT and n.arg.name in self._by_name:
            self.asked.append(n.arg.name)
            return self._by_name[n.arg.name]
        return None


@dataclasses.dataclass
class _Lowered:
    ast: UOp  # over stand-in params and the name ""
    params: list[Buffer]  # stand-ins: the output's first
    asked: list[str]  # placeholder names, in the order lowering asked for their buffers


def _buffer_shape(n: UOp, buffers: Buffers) -> tuple | None:
    """The shape of the buffer n is read from, or None when n is computed in the kernel. Creates nothing
    (a weight's buffer is made on the first `get`, which must come in lowering's order)."""
    if n.op in (Ops.INPUT, Ops.WEIGHT):
        return n.shape
    buf = buffers.realized.get(n)
    return None if buf is None else buf.shape


def _buffer_key(n: UOp, buffers: Buffers) -> object:
    """Equal keys: the same buffer (lowering makes one PARAM per buffer)."""
    if n.op is Ops.INPUT:
        return ("input", n.arg.name)
    if n.op is Ops.WEIGHT:
        return ("weight", n)
    return ("realized", buffers.realized[n].id)


def canonical(root: UOp, buffers: Buffers) -> tuple[UOp, dict[str, tuple[UOp, tuple]]]:
    """root's subgraph with every buffer read replaced by a placeholder, and each placeholder's name -> (the
    first real node of its buffer met, the buffer's shape). The root itself is computed (as lowering treats
    it) unless it is an input or weight."""
    out: dict[UOp, UOp] = {}
    index: dict[object, int] = {}
    reads: dict[str, tuple[UOp, tuple]] = {}
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        n, built = stack.pop()
        if n in out:
            continue
        shape = _buffer_shape(n, buffers) if n is not root or n.op in (Ops.INPUT, Ops.WEIGHT) else None
        if shape is not None:
            j = index.setdefault(_buffer_key(n, buffers), len(index))
            name = f"{_PLACEHOLDER}{j}:{n.dtype.name}{list(shape)}"
            reads.setdefault(name, (n, shape))
            out[n] = UOp(Ops.INPUT, n.dtype, (), InputArg(name, n.shape))
        elif built:
            out[n] = n.replace(src=tuple(out[s] for s in n.src)) if n.src else n
        else:
            stack.append((n, True))
            stack.extend((s, False) for s in reversed(n.src) if s not in out)
    return out[root], reads


def _stand_in(j: int, name: str, dtype, shape: tuple) -> Buffer:
    return Buffer(-1 - j, BufferKind.SCRATCH, dtype, shape, name)


def _put_in(ast: UOp, params: dict[UOp, UOp], name: str) -> UOp:
    """ast with each stand-in PARAM replaced and its SINK named `name`."""
    done: dict[UOp, UOp] = dict(params)
    stack: list[tuple[UOp, bool]] = [(ast, False)]
    while stack:
        n, built = stack.pop()
        if n in done:
            continue
        if built:
            src = tuple(done[s] for s in n.src)
            done[n] = n if all(a is b for a, b in zip(src, n.src, strict=True)) else n.replace(src=src)
        else:
            stack.append((n, True))
            stack.extend((s, False) for s in n.src if s not in done)
    sink = done[ast]
    return sink.replace(arg=dataclasses.replace(sink.arg, name=name))


def _param(i: int, buf: Buffer) -> UOp:
    return UOp(Ops.PARAM, buf.dtype.ptr(), (), ParamArg(i, buf.name))  # as KernelLowerer.param makes it


class LoweringMemo:
    """Per program: canonical subgraph (and output buffer's dtype and shape) -> its lowering."""

    def __init__(self) -> None:
        self._done: dict[tuple, _Lowered] = {}
        self.hits = 0

    def lower(self, name: str, root: UOp, out: Buffer, buffers: Buffers, lower_fn) -> tuple[UOp, list[Buffer]]:
        """lower_fn(name, root, out, buffers) -> (ast, params): lower.lower_kernel with the other arguments
        bound (the same for every kernel of a program)."""
        croot, reads = canonical(root, buffers)
        key = (croot, out.dtype, out.shape)
        hit = self._done.get(key)
        if hit is None:
            fake = _StandIns({p: _stand_in(j + 1, p, node.dtype, shape)
                              for j, (p, (node, shape)) in enumerate(reads.items())})
            ast, params = lower_fn("", croot, _stand_in(0, _OUT, out.dtype, out.shape), fake)
            hit = self._done[key] = _Lowered(ast, params, list(dict.fromkeys(fake.asked)))
        else:
            self.hits += 1
        real = {_OUT: out}
        for p in hit.asked:  # the program's buffers are asked in lowering's order (weights: first-use order)
            real[p] = buffers.get(reads[p][0])
        params = [real[p.name] for p in hit.params]
        swap = {_param(i, s): _param(i, b) for i, (s, b) in enumerate(zip(hit.params, params, strict=True))}
        return _put_in(hit.ast, swap, name), params
