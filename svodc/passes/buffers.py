"""The buffers a program's kernels read, while the program is built (passes/pipeline.py).

Lowering asks `buffers.get(node)` which buffer a node is read from: a graph input by name, a
WEIGHT (its buffer made on first use, so the weights section is laid out in first-use order, which
keeps bundles reproducible), or a tensor an earlier kernel realized; None means the node is
computed inside the kernel being lowered. GEMM lowering adds the packed weights it makes with
`weight`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from svodc.ir.ops import Ops
from svodc.ir.uop import UOp
from svodc.program import Buffer, BufferKind


class Buffers:
    def __init__(self, inputs: list[Buffer], ids: Iterator[int]):
        self._inputs = {b.name: b for b in inputs}
        self._ids = ids  # the program's buffer id counter (ids in graph order: reproducible bundles)
        self.weights: dict[UOp, Buffer] = {}  # WEIGHT node -> its buffer, in first-use order
        self.realized: dict[UOp, Buffer] = {}  # realized node -> the buffer consumers read it from

    def get(self, n: UOp) -> Buffer | None:
        if n.op is Ops.INPUT:
            return self._inputs[n.arg.name]
        if n.op is Ops.WEIGHT:
            return self.weight(n)
        return self.realized.get(n)

    def weight(self, n: UOp) -> Buffer:
        assert n.op is Ops.WEIGHT
        if n not in self.weights:
            self.weights[n] = Buffer(next(self._ids), BufferKind.WEIGHT, n.dtype, n.shape, f"w{len(self.weights)}",
                                     data=n.arg)
        return self.weights[n]


def computed_nodes(root: UOp, is_buffer: Callable[[UOp], bool]) -> Iterator[UOp]:
    """The nodes a kernel computes from `root` down (each once), not those it reads from a buffer
    (is_buffer(node); the root is its own output, so it is always computed)."""
    stack, seen = [root], set()
    while stack:
        n = stack.pop()
        if n in seen or (n is not root and is_buffer(n)):
            continue
        seen.add(n)
        yield n
        stack.extend(n.src)
