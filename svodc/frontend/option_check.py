"""CompileOptions checked against the model before anything is imported: every --dim names a symbolic
dim of some graph input, every --input-shape names an input and agrees with the dims the model fixes,
and every value is an integer or a bounded range (lo, hi) (frontend/dims.py). A misspelt name is an error
listing what the model has, never ignored."""

from __future__ import annotations

import onnx

from svodc.errors import InputShapeError
from svodc.frontend.dims import parse_size
from svodc.options import CompileOptions


def _declared(vi: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """A tensor input's declared shape (ints, dim names, None for unknown), or None if it has none."""
    t = vi.type
    if t.WhichOneof("value") != "tensor_type" or not t.tensor_type.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") and d.dim_value >= 0 else (d.dim_param or None)
            for d in t.tensor_type.shape.dim]


def describe_inputs(graph: onnx.GraphProto, skip: set[str]) -> str:
    parts = []
    for vi in graph.input:
        if vi.name not in skip:
            shape = _declared(vi)
            parts.append(f"{vi.name}{['?' if d is None else d for d in shape] if shape is not None else ''}")
    return ", ".join(parts) or "none"


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def is_value_dim_name(name: str) -> bool:
    """TENSOR:AXIS, the name of a size a run-time value decides (frontend/runtime_dims.py)."""
    tensor, sep, axis = name.rpartition(":")
    return bool(sep and tensor and axis.isdigit())


def check_value_dims_used(options: CompileOptions, sized: set[str], dim_names: set[str]) -> None:
    """A bound given for TENSOR:AXIS that no run-time size of the model has is a misspelling."""
    unused = sorted(n for n in options.dims if n not in dim_names and is_value_dim_name(n) and n not in sized)
    if unused:
        raise InputShapeError(f"--dim {unused[0]}: no size of that name is decided at run time in this model (those "
                              f"that are: {sorted(sized) or 'none'}; input dims: {sorted(dim_names) or 'none'})")


def check_options(graph: onnx.GraphProto, options: CompileOptions, initializers: set[str]) -> None:
    inputs = {vi.name: vi for vi in graph.input if vi.name not in initializers}
    listing = describe_inputs(graph, initializers)
    dim_names = sorted({d for vi in inputs.values() for d in (_declared(vi) or []) if isinstance(d, str)})
    for name, value in options.dims.items():
        if name not in dim_names and is_value_dim_name(name):  # a bound for a run-time size (runtime_dims.py)
            lo, hi = (0, value) if _is_int(value) else tuple(value) if isinstance(value, tuple | list) else (-1, -1)
            if not (_is_int(lo) and _is_int(hi) and 0 <= lo <= hi):
                raise InputShapeError(f"dims[{name!r}] = {value!r}: the bound of a run-time size is HI or (LO, HI) "
                                      f"with 0 <= LO <= HI, e.g. --dim {name}=0..64")
            continue
        if (not _is_int(value) and not isinstance(value, tuple | list)) or (_is_int(value) and value < 0):
            raise InputShapeError(f"dims[{name!r}] = {value!r} ({type(value).__name__}): a dim must be an int >= 0 "
                                  f"or a range (lo, hi), e.g. dims={{{name!r}: 1}} or dims={{{name!r}: (1, 64)}}")
        parse_size(value, f"dims[{name!r}]")
        if name not in dim_names:
            raise InputShapeError(f"--dim {name}: the model has no symbolic dim {name!r}; its dims are {dim_names} "
                                  f"(inputs: {listing})")
    for name, shape in options.input_shapes.items():
        if not isinstance(shape, tuple | list) or not all((_is_int(d) and d >= 0) or isinstance(d, tuple | list)
                                                          for d in shape):
            raise InputShapeError(f"input_shapes[{name!r}] = {shape!r}: a shape must be a tuple of ints >= 0 "
                                  "or ranges (lo, hi)")
        shape = tuple(parse_size(d, f"input_shapes[{name!r}] dim {i}") for i, d in enumerate(shape))
        base = name.split("[")[0] if name not in inputs else name
        if base not in inputs:
            raise InputShapeError(f"--input-shape {name}: the model has no input {name!r}; its inputs are {listing}")
        declared = _declared(inputs[name]) if name in inputs else None
        if declared is None or len(declared) != len(shape):
            continue  # rank mismatches and sequence elements are the importer's (frontend/boundary.py)
        for i, (want, got) in enumerate(zip(declared, shape, strict=True)):
            if _is_int(want) and want != got:
                given, shown = "x".join(map(str, shape)), ["?" if d is None else d for d in declared]
                raise InputShapeError(f"--input-shape {name}={given}: dim {i} is {got}, but the model fixes it to "
                                      f"{want} (the model declares {name}{shown})")
    if options.loop_bounds:
        _check_loop_bounds(graph, options.loop_bounds)


def _check_loop_bounds(graph: onnx.GraphProto, bounds: dict[str, int]) -> None:
    """Each --loop-bound names a Loop node (at any depth), by its name or, unnamed, its first output."""
    loops, stack = [], [graph]
    while stack:
        g = stack.pop()
        for node in g.node:
            if node.op_type == "Loop":
                loops.append(node.name or (node.output[0] if node.output else ""))
            stack.extend(a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH)
    for name, n in bounds.items():
        if not _is_int(n) or n < 0:
            raise InputShapeError(f"loop_bounds[{name!r}] = {n!r}: a loop bound must be an int >= 0")
        if name not in loops:
            raise InputShapeError(f"--loop-bound {name}: the model has no Loop node {name!r}; its Loop nodes are "
                                  f"{sorted(loops)}")


def fixes_unknown_dims(graph: onnx.GraphProto, options: CompileOptions) -> bool:
    """Whether the options decide a dim the model leaves open (a --dim, or an --input-shape over a symbolic
    or unknown dim): then a node whose shapes do not fit is more likely the options' fault than svodc's."""
    if options.dims:
        return True
    declared = {vi.name: _declared(vi) for vi in graph.input}
    return any(name not in declared or declared[name] is None or any(not _is_int(d) for d in declared[name])
               for name in options.input_shapes)
