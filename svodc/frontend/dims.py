"""Bounded symbolic input dims: which axes of which inputs take a size chosen at run time, by name.

A dim given to the compiler is fixed (an int) or bounded (`LO..HI`, a `(lo, hi)` pair with
1 <= lo <= hi; lo == hi is the fixed size hi). The bundle's inputs are INPUT nodes at the upper bound:
memory is planned there, and the kernels read the run-time value of each dim (passes/dynamic.py).
Dims of the same name are one dim: every input axis it sizes must agree at run time. An input axis
given a range by `--input-shape` takes the model's `dim_param` name when it has one, else
`INPUT:AXIS`, its own dim (so does a `?` dim_param: it names no dim).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import onnx

from svodc.errors import InputShapeError
from svodc.ir.uop import UOp

# The range a ready-to-paste suggestion proposes for a dim given no bound (the user edits the numbers).
SUGGESTED_HI = 64


@dataclass(frozen=True)
class DimSpec:
    name: str
    lo: int
    hi: int


def parse_size(value: object, where: str) -> int | tuple[int, int]:
    """A fixed size (int >= 0) or a bounded range (lo, hi) with 1 <= lo <= hi; lo == hi is fixed."""
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise InputShapeError(f"{where}: a range is a pair of integers (lo, hi), got {value!r}")
        lo, hi = value
        if not 1 <= lo <= hi:
            raise InputShapeError(f"{where}: the range {lo}..{hi} needs 1 <= lo <= hi")
        return hi if lo == hi else (lo, hi)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InputShapeError(f"{where}: a size is an integer >= 0 or a range (lo, hi), got {value!r}")
    return value


class DimTable:
    """The bounded dims met at the graph boundary, in the order met, and the input axes each sizes."""

    def __init__(self) -> None:
        self.dims: dict[str, DimSpec] = {}
        self.input_axes: dict[str, dict[int, str]] = {}  # input name -> {axis: dim name}

    def bind(self, inp: str, axis: int, name: str, lo: int, hi: int) -> int:
        """Record that axis `axis` of input `inp` is dim `name` in [lo, hi]; returns the upper bound."""
        known = self.dims.setdefault(name, DimSpec(name, lo, hi))
        if (known.lo, known.hi) != (lo, hi):
            raise InputShapeError(f"input {inp!r} dim {axis}: dim {name!r} is {lo}..{hi} here but {known.lo}.."
                                  f"{known.hi} on another input; a dim shared by inputs has one range")
        self.input_axes.setdefault(inp, {})[axis] = name
        return hi


def resolve_dim(inp: str, axis: int, d: onnx.TensorShapeProto.Dimension | None, given: object | None,
                table: DimTable) -> int:
    """The compile-time size of one input axis (the upper bound if bounded), recording bounded dims.
    `given` is the size from --input-shape or --dim (None: the model's own dim_value)."""
    named = d is not None and _named(d)
    size = parse_size(given, f"input {inp!r} dim {axis}") if given is not None else d.dim_value
    if isinstance(size, tuple):
        if d is not None and d.HasField("dim_value") and d.dim_value > 0:
            raise InputShapeError(f"input {inp!r} dim {axis}: the model fixes it to {d.dim_value}; a range needs a "
                                  "symbolic dim")
        return table.bind(inp, axis, d.dim_param if named else f"{inp}:{axis}", *size)
    return size


def check_bounded(inputs: Iterable[onnx.ValueInfoProto], dims: dict, shapes: dict, values: dict) -> None:
    """Every symbolic or unknown dim of a tensor input needs a size or a range: one error lists them
    all, each with a flag to paste (a named dim once, however many inputs it sizes)."""
    flags: list[str] = []
    where: list[str] = []
    for vi in inputs:
        tt = vi.type.tensor_type if vi.type.HasField("tensor_type") else None
        if tt is None or vi.name in shapes or vi.name in values or not tt.HasField("shape"):
            continue  # sequences, optionals and shapeless inputs are reported where they are built
        sizes = []
        unknown = False
        for i, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value >= 0:
                sizes.append(str(d.dim_value))
            elif _named(d) and d.dim_param in dims:
                sizes.append(_text(dims[d.dim_param]))
            elif _named(d):
                flag = f"--dim {d.dim_param}=1..{SUGGESTED_HI}"
                if flag not in flags:
                    flags.append(flag)
                where.append(f"{vi.name!r} dim {i} {d.dim_param!r}")
                sizes.append(f"1..{SUGGESTED_HI}")
            else:
                unknown = True
                where.append(f"{vi.name!r} dim {i} (unnamed)")
                sizes.append(f"1..{SUGGESTED_HI}")
        if unknown:
            flags.append(f"--input-shape {vi.name}={'x'.join(sizes)}")
    if flags:
        raise InputShapeError(f"symbolic input dims without a size or bound: {', '.join(where)}; give each a size "
                              f"or a range, e.g. {' '.join(flags)}")


def _named(d: onnx.TensorShapeProto.Dimension) -> bool:
    """A dim_param other than '?' names a dim shared by every axis of that name; '?' is anonymous."""
    return d.HasField("dim_param") and d.dim_param not in ("", "?")


def _text(size: object) -> str:
    return f"{size[0]}..{size[1]}" if isinstance(size, (tuple, list)) else str(size)


def bounded_axes(table: DimTable) -> Callable[[UOp], tuple[str | None, ...]]:
    """x -> per axis the input dim its size follows (None: a fixed size), for handlers whose graph depends
    on it (SAME padding, Slice: ops/). The graph so far is analysed as passes/dynamic.py will analyse it;
    where that analysis refuses a node it will refuse it again after import, so the answer does not
    matter: every axis, "?"."""
    from svodc.passes.dynamic import DynamicAxes, DynamicShapeError

    dyn = DynamicAxes(tuple(table.dims.values()), table.input_axes, None)

    def query(x: UOp) -> tuple[str | None, ...]:
        try:
            return tuple(None if a is None else dyn.root(a.dim) for a in dyn.axes(x))
        except DynamicShapeError:
            return ("?",) * x.ndim
    return query
