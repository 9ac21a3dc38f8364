"""UOp: the one immutable, hash-consed node type of every stage.

Invariants:
- Constructing a node equal to a live one returns that same object (a weak-value intern table), so
  `a is b` is structural equality and common subexpressions are shared for free. `==` is identity.
- A node never changes. Derived facts (shape, structural hash, bounds) are computed on first use and
  cached on the node.
- `structural_hash` is a Merkle hash over op, dtype, argument and the children's hashes: stable across
  processes, so orders derived from it (the symbolic simplifier sorts terms by it) do not depend on
  PYTHONHASHSEED or object addresses. It is computed iteratively (graphs can be deep).
- Provenance (which ONNX nodes a UOp came from) lives in a side table (`provenance.py`), never in the
  node, so it never blocks sharing.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable
from typing import Any

from svodc.ir.dtypes import DType, dtypes
from svodc.ir.ops import COMPARE, ConstData, Ops, arg_key

_INTERN: weakref.WeakValueDictionary[tuple, UOp] = weakref.WeakValueDictionary()


class UOp:
    __slots__ = ("__weakref__", "_bounds", "_hash", "_shape", "arg", "dtype", "op", "src")
    op: Ops
    dtype: DType
    src: tuple[UOp, ...]
    arg: Any

    def __new__(cls, op: Ops, dtype: DType = dtypes.void, src: tuple[UOp, ...] = (), arg: Any = None) -> UOp:
        key = (op, dtype, src, arg_key(arg))
        node = _INTERN.get(key)
        if node is not None:
            return node
        node = object.__new__(cls)
        object.__setattr__(node, "op", op)
        object.__setattr__(node, "dtype", dtype)
        object.__setattr__(node, "src", src)
        object.__setattr__(node, "arg", arg)
        object.__setattr__(node, "_shape", None)
        object.__setattr__(node, "_hash", None)
        object.__setattr__(node, "_bounds", None)
        _INTERN[key] = node
        return node

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("UOp is immutable")

    def __reduce__(self):  # pickling rebuilds through __new__, so interning holds in the receiver
        return (UOp, (self.op, self.dtype, self.src, self.arg))

    # identity semantics (hash-consing makes structure and identity the same thing)
    __hash__ = object.__hash__

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def __bool__(self) -> bool:
        raise TypeError("a UOp has no truth value; compare nodes with `is`")

    def replace(self, **kw: Any) -> UOp:
        return UOp(kw.pop("op", self.op), kw.pop("dtype", self.dtype), kw.pop("src", self.src),
                   kw.pop("arg", self.arg))

    # ------------------------------------------------------------------ traversal
    def toposort(self) -> list[UOp]:
        """All nodes reachable from self, children before parents. Iterative."""
        return toposort([self])

    def __repr__(self) -> str:
        return pretty(self, max_lines=40)

    # ------------------------------------------------------------------ derived facts
    @property
    def shape(self) -> tuple:
        if self._shape is None:
            from svodc.ir.shapes import infer_shape

            _fill(self, "_shape", infer_shape)
        return self._shape

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def structural_hash(self) -> bytes:
        if self._hash is None:
            _fill(self, "_hash", _merkle)
        return self._hash

    @property
    def vmin(self) -> int | float:
        return self.bounds[0]

    @property
    def vmax(self) -> int | float:
        return self.bounds[1]

    @property
    def bounds(self) -> tuple[int | float, int | float]:
        """Inclusive (min, max) of the values this node can take (integer and bool nodes; floats
        get the dtype's range). Computed children first, cached."""
        if self._bounds is None:
            from svodc.ir.symbolic import compute_bounds

            _fill(self, "_bounds", compute_bounds)
        return self._bounds

    # ------------------------------------------------------------------ builders
    @staticmethod
    def const(dtype: DType, value: Any) -> UOp:
        return UOp(Ops.CONST, dtype, (), _normalize_const(dtype, value))

    def const_like(self, value: Any) -> UOp:
        return UOp.const(self.dtype, value)

    def alu(self, op: Ops, *others: UOp | int | float | bool) -> UOp:
        srcs = (self,) + tuple(o if isinstance(o, UOp) else self.const_like(o) for o in others)
        if op in COMPARE:
            dt = dtypes.bool
        elif op is Ops.WHERE:
            dt = srcs[1].dtype
        else:
            dt = self.dtype
        return UOp(op, dt, srcs)

    def cast(self, dtype: DType) -> UOp:
        return self if dtype == self.dtype else UOp(Ops.CAST, dtype, (self,))

    # arithmetic sugar, used for index expressions (never `==`: that is identity)
    def __add__(self, o): return self.alu(Ops.ADD, o)
    def __radd__(self, o): return self.const_like(o).alu(Ops.ADD, self)
    def __sub__(self, o): return self.alu(Ops.SUB, o)
    def __rsub__(self, o): return self.const_like(o).alu(Ops.SUB, self)
    def __mul__(self, o): return self.alu(Ops.MUL, o)
    def __rmul__(self, o): return self.const_like(o).alu(Ops.MUL, self)
    def __truediv__(self, o): return self.alu(Ops.DIV, o)
    def __floordiv__(self, o): return self.alu(Ops.IDIV, o)
    def __mod__(self, o): return self.alu(Ops.MOD, o)
    def __neg__(self): return self.alu(Ops.NEG)
    def lt(self, o) -> UOp: return self.alu(Ops.CMPLT, o)
    def ge(self, o) -> UOp: return self.lt(o).alu(Ops.NOT)
    def eq(self, o) -> UOp: return self.alu(Ops.CMPEQ, o)
    def ne(self, o) -> UOp: return self.alu(Ops.CMPNE, o)
    def maximum(self, o) -> UOp: return self.alu(Ops.MAX, o)
    def minimum(self, o) -> UOp: return self.alu(Ops.MIN, o)
    def where(self, a: UOp, b: UOp | int | float | bool) -> UOp:
        return UOp(Ops.WHERE, a.dtype, (self, a, b if isinstance(b, UOp) else a.const_like(b)))
    def logical_and(self, o) -> UOp: return self.alu(Ops.AND, o)

    # ------------------------------------------------------------------ small queries


def _fill(root: UOp, slot: str, fn) -> None:
    """Compute a cached derived fact for root and every uncomputed node below it, children first,
    without recursion and without visiting subgraphs that are already computed."""
    stack: list[tuple[UOp, bool]] = [(root, False)]
    while stack:
        n, ready = stack.pop()
        if getattr(n, slot) is not None:
            continue
        if ready:
            object.__setattr__(n, slot, fn(n))
            continue
        stack.append((n, True))
        stack.extend((s, False) for s in n.src if getattr(s, slot) is None)


def _merkle(n: UOp) -> bytes:
    h = hashlib.sha256()
    h.update(f"{n.op.name}|{n.dtype.name}|".encode())
    h.update(_stable_arg_bytes(n.arg))
    for s in n.src:
        h.update(s._hash)
    return h.digest()


def _normalize_const(dtype: DType, value: Any) -> Any:
    if dtype.kind == "bool":
        return bool(value)
    if dtype.is_int:
        return int(value)
    return float(value)


def _stable_arg_bytes(arg: Any) -> bytes:
    """Bytes that identify an argument across processes (repr of nested frozen values; weights by
    their content digest; UOps inside arguments, e.g. symbolic dims, by their structural hash)."""
    if isinstance(arg, ConstData):
        return b"data:" + arg.digest
    if isinstance(arg, UOp):
        return b"uop:" + arg.structural_hash
    if isinstance(arg, float):
        return b"f:" + arg.hex().encode()
    if isinstance(arg, tuple):
        return b"(" + b",".join(_stable_arg_bytes(a) for a in arg) + b")"
    if hasattr(arg, "__dataclass_fields__"):
        fields = arg.__dataclass_fields__
        return (type(arg).__name__.encode() + b"{"
                + b",".join(_stable_arg_bytes(getattr(arg, f)) for f in fields) + b"}")
    return repr(arg).encode()


def output_ranges(stmt: UOp) -> list[UOp]:
    """The RANGEs a statement iterates over (not those a LOOP_REDUCE inside it binds), in id order:
    the loops around a STORE."""
    free: set[UOp] = set()
    bound: set[UOp] = set()
    for n in toposort([stmt]):
        if n.op is Ops.RANGE:
            free.add(n)
        elif n.op is Ops.LOOP_REDUCE:
            bound.update(n.src[1:])
    return sorted(free - bound, key=lambda r: r.arg.id)


def toposort(roots: list[UOp], children: Callable[[UOp], tuple[UOp, ...]] | None = None) -> list[UOp]:
    """Nodes reachable from roots, each once, children before parents (iterative DFS); children(n) (default
    n.src) says what is below n."""
    order: list[UOp] = []
    seen: set[int] = set()
    stack: list[tuple[UOp, bool]] = [(r, False) for r in reversed(roots)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            order.append(node)
            continue
        if id(node) in seen:
            continue
        seen.add(id(node))
        stack.append((node, True))
        for s in reversed(node.src if children is None else children(node)):
            if id(s) not in seen:
                stack.append((s, False))
    return order


def pretty(root: UOp, max_lines: int | None = None) -> str:
    """One line per node, children first, numbered; shared nodes printed once."""
    nodes = root.toposort()
    num = {id(n): i for i, n in enumerate(nodes)}
    lines = []
    for n in nodes:
        src = ",".join(f"%{num[id(s)]}" for s in n.src)
        arg = "" if n.arg is None else f" {n.arg!r}"
        lines.append(f"%{num[id(n)]} = {n.op.name}:{n.dtype.name}({src}){arg}")
    if max_lines is not None and len(lines) > max_lines:
        lines = [*lines[: max_lines // 2], f"... {len(lines) - max_lines} more ...", *lines[-max_lines // 2:]]
    return "\n".join(lines)
